"""``[kafka] snapshot = "initial"``: a table's rows before its changes, against Apache Kafka and
a real MariaDB.

The oracle is a consumer written here from Debezium's documented envelope, not the project's
reader: every message of the table's topic in partition and offset order, a read (``r``),
create or update puts ``after`` under its key, a delete or a tombstone removes the key; the
rows it ends with must equal ``SELECT``'s, value by value. The table has rows before the
service starts, and a writer inserts, updates and deletes rows all through the snapshot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from cdcserver.sinks.kafka.sink import KafkaSink
from tests.apache_kafka import ApacheKafka
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import pace
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages
from tests.integration.test_kafka_delivery import kafka_file_covers, read_changes, replay
from tests.server.test_crash import ServiceProcess, _service_args

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]

COLUMNS = "id INT PRIMARY KEY, n INT NOT NULL, name VARCHAR(40), amount DECIMAL(12,2), note TEXT"


def create_items(source: Source, rows: int) -> None:
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.items ({COLUMNS})",
                   f"INSERT INTO {db}.items SELECT seq, seq % 97, CONCAT('item ', seq), "
                   f"seq / 100, IF(seq % 5 = 0, NULL, REPEAT('x', seq % 13)) "
                   f"FROM {db}.seq_1_to_{rows}")


class Writer:
    """An application committing single-row inserts, updates and deletes until stopped."""

    def __init__(self, source: Source, rows: int, seed: int = 53) -> None:
        self.source, self.rows = source, rows
        self.chance = random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.thread = threading.Thread(target=self._run, name="writer")
        self.failure: pymysql.MySQLError | None = None

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        conn = self.source.server.connect(self.source.database)
        try:
            with conn.cursor() as cursor:
                while not self.stop.is_set():
                    self._one(cursor)
                    conn.commit()
                    self.commits += 1
                    self.stop.wait(0.002)
        except pymysql.MySQLError as exc:  # raised again by finish()
            self.failure = exc
        finally:
            conn.close()

    def _one(self, cursor: Any) -> None:
        roll, key = self.chance.random(), self.chance.randint(1, self.rows * 2)
        if roll < 0.4:
            cursor.execute("INSERT INTO items (id, n, name, amount) VALUES (%s, %s, %s, %s) "
                           "ON DUPLICATE KEY UPDATE n = n + 1", (key, key % 7, f"new {key}",
                                                               Decimal(key) / 3))
        elif roll < 0.8:
            cursor.execute("UPDATE items SET n = n + 1, note = %s WHERE id = %s",
                           (f"updated {self.commits}", key))
        else:
            cursor.execute("DELETE FROM items WHERE id = %s", (key,))


# -- the consumer written here ---------------------------------------------------------------

def rebuild(messages: list[Any]) -> dict[int, dict[str, Any]]:
    """The table the topic's Debezium change events leave (a row's events are in one
    partition, in offset order)."""
    rows: dict[int, dict[str, Any]] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        key = json.loads(m.key)["id"]
        if m.value is None:  # a tombstone
            rows.pop(key, None)
            continue
        event = json.loads(m.value)
        if event["op"] == "d":
            rows.pop(key, None)
        else:
            assert event["op"] in ("r", "c", "u"), event
            rows[key] = event["after"]
    return rows


def selected(source: Source) -> dict[int, dict[str, Any]]:
    """The table by SELECT, values as Debezium's JSON has them (DECIMAL as a string)."""
    conn = source.server.connect(source.database)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT * FROM items")
            names = [d[0] for d in cursor.description]
            return {row[0]: {n: format(v, "f") if isinstance(v, Decimal) else v
                             for n, v in zip(names, row, strict=True)}
                    for row in cursor.fetchall()}
    finally:
        conn.close()


def differences(rebuilt: dict[int, dict[str, Any]], table: dict[int, dict[str, Any]]) -> list[str]:
    """Rows that differ; a column a row's last event did not carry (added since, NULL by
    default) counts as null."""
    out = []
    for key in sorted(rebuilt.keys() | table.keys()):
        mine, theirs = rebuilt.get(key), table.get(key)
        if mine is not None and theirs is not None:
            mine = {n: mine.get(n) for n in theirs}
        if mine != theirs:
            out.append(f"id {key}: topic {mine} != table {theirs}")
    return out[:20]


def assert_snapshot_before_changes(messages: list[Any], rows: int | None = None) -> None:
    """Read events: before null, the snapshot markers Debezium sets, and in every partition
    before any change of the table; ``rows`` of them (no restart in between)."""
    reads, markers = 0, []
    for partition in {m.partition for m in messages}:
        changed = False
        for m in sorted((m for m in messages if m.partition == partition),
                        key=lambda m: m.offset):
            event = json.loads(m.value) if m.value is not None else None
            if event is not None and event["op"] == "r":
                assert not changed, "a read event after a change in the same partition"
                assert event["before"] is None and event["source"]["snapshot"] != "false"
                reads += 1
                markers.append(event["source"]["snapshot"])
            else:
                changed = True
                assert event is None or event["source"]["snapshot"] == "false"
    if rows is not None:
        assert reads == rows
        assert markers.count("last") == 1 and markers.count("first") == 1
        assert set(markers) <= {"first", "true", "last"}


def _health(running: RunningService) -> dict[str, Any]:
    host, port = running.service.monitoring.address  # type: ignore[misc]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as e:  # 503 while degraded: the same document
        return dict(json.loads(e.read()))


def kafka_sink(running: RunningService) -> KafkaSink:
    sink = next(s for s in running.service.replication.sinks if s.name == "kafka")
    assert isinstance(sink, KafkaSink)
    return sink


async def snapshot_joined(running: RunningService, timeout: float = 180.0) -> None:
    """Until the Kafka sink has published its snapshot and takes part in replication."""
    sink = kafka_sink(running)
    deadline = time.monotonic() + timeout
    while not (sink.active and sink.durable is not None):  # (active before it opens, too)
        if running.task.done():
            running.task.result()
        assert time.monotonic() < deadline, "the snapshot did not end"
        await pace(0.05)


# -- tests -----------------------------------------------------------------------------------

async def test_snapshot_then_changes_rebuild_the_table_and_an_alter_is_not_blocked(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
        caplog: pytest.LogCaptureFixture):
    """100,000 rows before the start, a writer all through the snapshot, an ``ADD COLUMN``
    while the table is being dumped: the ALTER is not held, every read event precedes the
    changes of its partition, and the topic rebuilds the table as SELECT reads it."""
    caplog.set_level(logging.INFO)
    rows = 100_000
    create_items(source, rows)
    db = source.database
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         dump={"chunk_rows": 2000},
                         kafka=kafka_section(kafka_broker, source, format="debezium",
                                             snapshot="initial", include=f"{db}.*"))
    altered = 0.0
    with Writer(source, rows) as writer:
        running = await start_service(config)
        try:
            sink = kafka_sink(running)
            deadline = time.monotonic() + 60
            while not any(p["state"] == "dumping" and p["rows"] for p in
                          sink.status().snapshot):  # (the dump has begun reading)
                assert time.monotonic() < deadline, "no dump seen"
                await pace(0.01)
            started = time.monotonic()
            await asyncio.to_thread(source.execute,
                                    f"ALTER TABLE `{db}`.items ADD COLUMN extra INT NULL")
            altered = time.monotonic() - started
            health = await asyncio.to_thread(_health, running)
            assert [t["table"] for t in health["kafka_snapshot"]] == [f"{db}.items"]
            await snapshot_joined(running)
            whole = time.monotonic() - started  # the snapshot, from the ALTER to its join
            await pace(1.0)  # changes after the join too
            writer.finish()
            await kafka_caught_up(running, source)
            assert not sink.status().snapshot  # listed only while it is taken
            assert sink.snapshot_sources is not None
            progress = [p.summary() for p in sink.snapshot_sources.progress.values()]
        finally:
            await running.stop()
    messages = await raw_messages(kafka_broker, f"{db}.items")
    assert_snapshot_before_changes(messages, progress[0]["total"])
    assert progress[0]["state"] == "done" and progress[0]["rows"] == progress[0]["total"]
    rebuilt, table = rebuild(messages), selected(source)
    assert "extra" in next(iter(table.values()))
    assert not differences(rebuilt, table), "\n".join(differences(rebuilt, table))
    print(f"\nsnapshot: {progress[0]['total']} rows, {writer.commits} commits meanwhile, "
          f"ALTER took {altered:.2f}s of the snapshot's {whole:.2f}s after it")
    # An ALTER that waited for the snapshot would end as it joins; one that waits for a
    # chunk at most ends well before (the snapshot then starts over in the new definition).
    # Relative: a loaded machine slows both (an absolute bound only measures the machine).
    assert altered < whole / 2, f"the ALTER waited {altered:.1f}s of {whole:.1f}s"
    assert "starting it over in the new definition" in caplog.text  # (the ALTER hit the dump)
    assert "read in one snapshot" not in caplog.text  # chunked: no lock held across chunks
    assert "formatted by a process of its own" in caplog.text  # (WORKER_ROWS: 50,000)


async def test_kill_9_during_the_snapshot_publish_then_the_topic_still_equals_select(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka):
    """The service killed while it publishes the snapshot's rows, a writer going on: the
    restarted service publishes the same dump again (its rows twice: at least once) and the
    changes after it, and the topic rebuilds the table as SELECT reads it."""
    rows = 60_000
    create_items(source, rows)
    db = source.database
    data_dir = str(tmp_path / "data")
    config = tmp_path / "kafka.toml"
    config.write_text(f'[kafka]\nbootstrap = "{kafka_broker.bootstrap}"\nformat = "debezium"\n'
                      f'schema_topic = "{db}.schemas"\nstate_topic = "{db}.state"\n'
                      f'topic = "{{db}}.{{table}}"\npartitions = 3\nsnapshot = "initial"\n'
                      f'include = "{db}.*"\n[dump]\nchunk_rows = 2000\n')
    args = [*_service_args(data_dir, source, users_file), "--config", str(config)]
    args[args.index("warning")] = "info"  # the snapshot's lines
    service = ServiceProcess(args, str(tmp_path / "service.log"))
    topic = f"{db}.items"
    with Writer(source, rows) as writer:
        service.start()
        try:
            published = await published_at_least(kafka_broker, topic, 5000, timeout=120)
        finally:
            service.kill()
        assert published < rows, "the snapshot was over before the kill"
        service.start()
        await pace(1.0)
        writer.finish()
    target = source.gtid_state()
    try:
        deadline = time.monotonic() + 180
        while not await asyncio.to_thread(kafka_file_covers, data_dir, target):
            assert time.monotonic() < deadline, "the Kafka checkpoint did not catch up"
            assert service.process is not None and service.process.poll() is None
            await pace(0.1)
    finally:
        assert service.terminate() == 0
    messages = await raw_messages(kafka_broker, topic)
    rebuilt, table = rebuild(messages), selected(source)
    assert not differences(rebuilt, table), "\n".join(differences(rebuilt, table))
    reads = sum(1 for m in messages if m.value is not None and b'"op":"r"' in m.value)
    print(f"\nkill -9 at {published} of {rows} snapshot rows: {reads} read events in all, "
          f"{writer.commits} commits meanwhile")


async def test_the_formatting_process_killed_the_dump_is_published_again_whole(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
        caplog: pytest.LogCaptureFixture):
    """A big table's rows are made into messages by a process of their own
    (``cdcserver.sinks.kafka.snapshotworker``). Killed with -9 half way, the attempt fails
    with one line, and the sink publishes the same dump again: the topic rebuilds the
    table, changes after the snapshot included."""
    caplog.set_level(logging.INFO)
    rows = 150_000
    create_items(source, rows)
    db = source.database
    topic = f"{db}.items"
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="debezium",
                                             snapshot="initial", include=f"{db}.*"))
    running = await start_service(config)
    try:
        worker = await _formatting_process(timeout=120)
        await published_at_least(kafka_broker, topic, 5000, timeout=120)
        os.kill(worker, signal.SIGKILL)
        await snapshot_joined(running)
        source.execute(f"UPDATE `{db}`.items SET n = -1 WHERE id <= 10",
                       f"DELETE FROM `{db}`.items WHERE id BETWEEN 11 AND 20")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    assert "ended before its last rows (exit code -9)" in caplog.text  # killed, not done
    assert caplog.text.count("formatted by a process of its own") == 2  # and again
    messages = await raw_messages(kafka_broker, topic)
    rebuilt, table = rebuild(messages), selected(source)
    assert not differences(rebuilt, table), "\n".join(differences(rebuilt, table))


async def _formatting_process(timeout: float) -> int:
    """The pid of this process's snapshot formatting child, once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # (gone meanwhile)
            if parent == os.getpid() and b"cdcserver.sinks.kafka.snapshotworker" in command:
                return int(entry)
        await pace(0.02)
    raise AssertionError(f"no snapshot formatting process within {timeout:.0f} s")


async def published_at_least(broker: ApacheKafka, topic: str, count: int,
                             timeout: float, partitions: int = 3) -> int:
    """Until ``topic`` holds ``count`` messages; how many it held then."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            if topic in await consumer.topics():
                tps = [TopicPartition(topic, p) for p in range(partitions)]
                total = sum((await consumer.end_offsets(tps)).values())
                if total >= count:
                    return total
            assert time.monotonic() < deadline, f"{topic} did not get {count} messages"
            await pace(0.02)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("fmt", ["databus", "dip", "maxscale"])
async def test_the_other_formats_send_the_snapshot_as_inserts(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka, fmt: str):
    """Their initial rows are inserts (databus: RowsEvents, as its dump layout), keyed and
    partitioned as the table's changes: the project's reader replays rows then changes into
    the table."""
    create_items(source, 3000)
    db = source.database
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format=fmt,
                                             snapshot="initial", include=f"{db}.*"))
    running = await start_service(config)
    try:
        await snapshot_joined(running)
        source.execute(f"UPDATE `{db}`.items SET n = -1 WHERE id <= 10",
                       f"DELETE FROM `{db}`.items WHERE id BETWEEN 11 AND 20",
                       f"INSERT INTO `{db}`.items (id, n) VALUES (9001, 1)")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    changes = await read_changes(kafka_broker, source, ("items",), fmt)
    state = replay(changes)["items"]
    table = {r[0]: r[1] for r in source.query(f"SELECT id, n FROM `{db}`.items")}
    assert {k: r["n"] for k, r in state.items()} == table

