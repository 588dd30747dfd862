"""One Kafka publisher among several service instances (``[kafka] publisher_lock``): two
instances replicate the same source into their own data directories; the one holding the
named lock on the source publishes, the other stands by (no Kafka sink, /health says so).
When the publisher stops, its lock is freed with its connection and the standby takes over
from the position recorded in the state topic: every change reaches Kafka, a duplicate is
only ever an identical copy (at least once), and the messages rebuild the table.

Not shown here: fencing of a publisher that keeps running but lost its lock connection (a
network partition from the source) while its in-flight batches still reach the broker (the
service does not fence through Kafka transactions); the lease is polled every second, so such
a publisher stops within it.
"""

from __future__ import annotations

import os
import threading

import pytest

from cdcserver.ops.metrics import health
from tests.apache_kafka import ApacheKafka
from tests.conftest import Source, make_config, start_service
from tests.helpers import until
from tests.integration.test_kafka import kafka_caught_up, kafka_section
from tests.integration.test_kafka_delivery import (
    assert_duplicates_identical,
    message_positions,
    read_changes,
    replay,
    source_rows,
    stored_positions,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


def _writer(source: Source, stop: threading.Event, counter: list[int]) -> None:
    conn = source.server.connect(source.database)
    try:
        with conn.cursor() as cur:
            n = 0
            while not stop.is_set():
                n += 1
                cur.execute("INSERT INTO t VALUES (%s, %s)", (n, n))
                if n % 3 == 0:
                    cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (n - 1,))
                if n % 7 == 0:
                    cur.execute("DELETE FROM t WHERE id = %s", (n - 5,))
                counter[0] = n
                stop.wait(0.003)
    finally:
        conn.close()


async def test_one_instance_publishes_and_the_standby_takes_over(
        tmp_path: os.PathLike[str], source: Source, users_file: str,
        kafka_broker: ApacheKafka) -> None:
    kafka = kafka_section(kafka_broker, source, publisher_lock=f"cdc-{source.database}")
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY, v INT)")
    first = await start_service(make_config(os.path.join(tmp_path, "a"), source.url,
                                            users_file, kafka=kafka))
    await until(lambda: first.service.replication.sink("kafka") is not None, timeout=30)
    second = await start_service(make_config(os.path.join(tmp_path, "b"), source.url,
                                             users_file, kafka=kafka))
    stop, counter = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(source, stop, counter), daemon=True)
    writer.start()
    try:
        await until(lambda: counter[0] >= 300)
        assert second.service.replication.sink("kafka") is None  # it stands by
        document = health(second.service.stats(), 60)[1]
        assert document["kafka"] == {"role": "standby"}
        assert health(first.service.stats(), 60)[1]["kafka"] == {"role": "publisher"}
        await first.stop()  # its lock goes with its connection
        await until(lambda: second.service.replication.sink("kafka") is not None, timeout=30)
        mark = counter[0]
        await until(lambda: counter[0] >= mark + 300)
    finally:
        stop.set()
        writer.join(30)
    try:
        await kafka_caught_up(second, source)
    finally:
        await second.stop()
    changes = await read_changes(kafka_broker, source, ("t",))
    duplicates = assert_duplicates_identical(changes)
    stored = stored_positions(os.path.join(tmp_path, "b"), "t")
    assert len(stored) > 600 and stored <= message_positions(changes, "t")  # nothing lost
    rows = {key: (key, row["v"]) for key, row in replay(changes)["t"].items()}
    assert rows == source_rows(source, "t", "v")
    assert duplicates < len(changes) // 2, duplicates  # a tail, not everything again
