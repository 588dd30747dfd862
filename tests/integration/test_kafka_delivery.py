"""Kafka delivery under stress, against Apache Kafka and a real MariaDB: order per row across
partitions, ``kill -9`` of the service under load, a broker outage, the position read back
from the state topic.

Duplicates are allowed (at least once) and must be identifiable: a resent message has the
same key (binlog position, action, GTID, event number) and the same value as the first copy.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import random
import threading
import urllib.request
from collections import defaultdict
from typing import Any

import fastavro
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcserver.core.gtid import GtidState
from cdcserver.sinks.kafka.checkpoint import _load_state
from mariadb_cdc_client.kafka import KafkaChange, KafkaChangeReader, KafkaDecoder
from tests.apache_kafka import ApacheKafka
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import TcpProxy, pace
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages
from tests.server.test_crash import TABLES, Load, ServiceProcess, _service_args

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


async def read_changes(broker: ApacheKafka, source: Source, tables: tuple[str, ...],
                       fmt: str = "databus") -> list[KafkaChange]:
    reader = KafkaChangeReader(broker.bootstrap, [f"{source.database}.{t}" for t in tables],
                               format=fmt, schema_topic=f"{source.database}.schemas")
    return [c async for c in reader.changes(to_end=True)]


def replay(changes: list[KafkaChange], key: str = "id") -> dict[str, dict[Any, dict[str, Any]]]:
    """Each table's rows after applying its messages partition by partition, in offset order
    (a row's changes all live in one partition, so this is each row's own order)."""
    tables: dict[str, dict[Any, dict[str, Any]]] = defaultdict(dict)
    for c in sorted(changes, key=lambda c: (c.topic, c.partition, c.offset)):
        if c.is_statement:
            continue
        rows = tables[c.table]
        if c.before is not None:
            rows.pop(c.before[key], None)
        if c.after is not None:
            rows[c.after[key]] = c.after
    return tables


def stored_positions(data_dir: str, table: str) -> set[tuple[str, int]]:
    """(gtid, event_number) of every record in the Avro store's files of a table."""
    found = set()
    for path in glob.glob(os.path.join(data_dir, "avro", f"*.{table}.*.avro")):
        with open(path, "rb") as f:
            for r in fastavro.reader(f):
                found.add((f"{r['domain']}-{r['server_id']}-{r['sequence']}",
                           r["event_number"]))
    return found


def message_positions(changes: list[KafkaChange], table: str) -> set[tuple[str, int]]:
    found = set()
    for c in changes:
        if c.table != table or c.is_statement:
            continue
        found.add((c.gtid, c.event_number))
        if c.action == "update":
            found.add((c.gtid, c.event_number + 1))
    return found


def assert_duplicates_identical(changes: list[KafkaChange]) -> int:
    """Messages with the same key (and partition) carry the same changes; returns how many
    duplicates there were (a databus message holds a row event: its changes are told apart
    by their event numbers)."""
    first: dict[tuple[str, int, bytes, int], KafkaChange] = {}
    duplicates = 0
    for c in changes:
        seen = first.setdefault((c.topic, c.partition, c.key, c.event_number), c)
        if seen is not c:
            duplicates += 1
            assert (seen.action, seen.before, seen.after) == (c.action, c.before, c.after)
    return duplicates


def kafka_file_covers(data_dir: str, target: GtidState) -> bool:
    """The Kafka sink's ``state/kafka.json`` (read as the sink reads it) covers ``target``."""
    durable = _load_state(os.path.join(data_dir, "state", "kafka.json"))
    return durable is not None and all(durable.gtid_state.covers(g) for g in target)


def source_rows(source: Source, table: str, columns: str) -> dict[Any, tuple[Any, ...]]:
    return {row[0]: row for row in source.query(
        f"SELECT id, {columns} FROM `{source.database}`.{table}")}


async def _metrics(running: RunningService) -> dict[str, float]:
    """The service's unlabelled series, from its /metrics."""
    host, port = running.service.monitoring.address  # type: ignore[misc]

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())

    text = await asyncio.to_thread(scrape)
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels}


async def test_each_rows_changes_stay_in_order_in_one_partition(tmp_path, source: Source,
                                                                users_file: str,
                                                                kafka_broker: ApacheKafka):
    """40 rows updated 30 times each, in transactions that touch many rows: every row's
    messages are in one partition, in commit order; binlog positions only grow there; a
    key-changing update reaches both keys' partitions; the rows land in all 3 partitions.
    (A format with a message per row: dip. databus sends a message per row event, and a
    table's row events to one partition; test_kafka_databus.py.)"""
    db = f"`{source.database}`"
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, partitions=3,
                                             format="dip"))
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {db}.counters (id INT PRIMARY KEY, n INT)",
                       f"INSERT INTO {db}.counters SELECT seq, 0 FROM {db}.seq_1_to_40")
        for step in range(1, 31):
            source.execute(f"UPDATE {db}.counters SET n = {step} WHERE id % {1 + step % 3} = 0")
        source.execute(f"UPDATE {db}.counters SET id = 1000 WHERE id = 7",
                       f"UPDATE {db}.counters SET n = 99 WHERE id = 1000")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    changes = await read_changes(kafka_broker, source, ("counters",), "dip")
    partitions_of: dict[int, set[int]] = defaultdict(set)
    last_n: dict[tuple[int, int], int] = {}
    last_pos: dict[int, tuple[str, int]] = {}
    for c in sorted(changes, key=lambda c: (c.partition, c.offset)):
        if c.is_statement:
            continue
        key = json.loads(c.key)
        position = (key["Pos"]["Name"], key["Pos"]["Pos"])
        assert position >= last_pos.get(c.partition, ("", 0)), [
            (x.offset, json.loads(x.key)["Pos"]["Pos"], x.gtid) for x in changes
            if x.partition == c.partition]
        last_pos[c.partition] = position
        row = c.after or c.before
        assert row is not None
        if c.action == "update" and c.before and c.after and c.before["id"] != c.after["id"]:
            continue  # the key change, checked below
        partitions_of[row["id"]].add(c.partition)
        if c.action == "update":
            n = row["n"]
            assert n > last_n.get((c.partition, row["id"]), 0), f"row {row['id']} reordered"
            last_n[(c.partition, row["id"])] = n
    assert all(len(p) == 1 for p in partitions_of.values()), partitions_of
    assert {p for ps in partitions_of.values() for p in ps} == {0, 1, 2}
    moved = {c.partition for c in changes
             if c.action == "update" and c.after and c.after["id"] == 1000 and c.after["n"] < 99}
    assert partitions_of[7] <= moved and partitions_of[1000] <= moved and len(moved) <= 2
    assert replay(changes)["counters"].keys() == set(range(1, 41)) - {7} | {1000}


async def test_kill_9_under_load_loses_nothing(tmp_path, source: Source, users_file: str,
                                               kafka_broker: ApacheKafka):
    """10 ``kill -9`` at random instants while the source is written: afterwards Kafka holds
    every record the store holds (matched by GTID and event number), duplicates carry
    identical changes, and replaying the topics gives the tables' contents."""
    data_dir = str(tmp_path / "data")
    config = tmp_path / "kafka.toml"
    db = source.database
    config.write_text(f'[kafka]\nbootstrap = "{kafka_broker.bootstrap}"\n'
                      f'schema_topic = "{db}.schemas"\nstate_topic = "{db}.state"\n'
                      f'linger_ms = 20\ntopic = "{{db}}.{{table}}"\npartitions = 3\n')
    load = Load(source, seed=5, big=500, pause=0.002)
    load.create()
    load.start()
    args = [*_service_args(data_dir, source, users_file), "--config", str(config)]
    service = ServiceProcess(args, str(tmp_path / "service.log"))
    chance = random.Random(11)
    pause = threading.Event()  # never set: a timer for the random kill instants
    try:
        for kill in range(10):
            service.start()
            await asyncio.to_thread(pause.wait, chance.uniform(0.3, 1.5))
            service.kill()
            if kill == 5:
                load.alter()
    finally:
        load.finish()
    target = source.gtid_state()
    service.start()
    try:
        def covered() -> bool:
            return kafka_file_covers(data_dir, target)

        for _ in range(1200):
            if await asyncio.to_thread(covered):
                break
            await pace(0.1)
        assert await asyncio.to_thread(covered), "the Kafka checkpoint did not catch up"
    finally:
        assert service.terminate() == 0
    changes = await read_changes(kafka_broker, source, TABLES)
    duplicates = assert_duplicates_identical(changes)
    for table in TABLES:
        stored = stored_positions(data_dir, table)
        assert stored and message_positions(changes, table) == stored, table
    state = replay(changes)
    assert {k: (r["amount"], r["note"]) for k, r in state["orders"].items()} == {
        k: (amount, note) for k, amount, note in
        source_rows(source, "orders", "amount, note").values()}
    assert state["line_items"].keys() == source_rows(source, "line_items", "qty").keys()
    assert {k: r["qty"] for k, r in state["line_items"].items()} == {
        k: qty for k, qty in source_rows(source, "line_items", "qty").values()}
    assert state["audit"].keys() == source_rows(source, "audit", "what").keys()
    print(f"\nkafka kill -9: 10 kills during {load.transactions} transactions, "
          f"{len(changes)} messages, {duplicates} duplicates, lost 0")


async def test_broker_outage_stalls_with_bounded_memory_and_loses_nothing(
        tmp_path, source: Source, users_file: str):
    """The broker (behind a proxy it advertises) cannot be reached for 6 seconds while rows
    are written (every connection cut, new ones refused): sends time out (after 2 s here),
    the sink holds at most max_buffer_bytes and reconnects until the broker is back, the CDC
    listener keeps serving meanwhile, and then every row reaches Kafka, the unacknowledged
    ones sent again. /metrics shows it: the oldest unacknowledged message ages with the
    outage, then the failures are counted and nothing is held. (The sink hands aiokafka a
    partition's next batch only once the one before is acknowledged, from a task of its own:
    aiokafka's send_batch would otherwise hold the pipeline for request_timeout per batch
    while the broker is away, and the buffer never filled. A killed broker is
    tests/integration/test_kafka_exactly_once.py's.)"""
    from mariadb_cdc_client import ChangeRecord, SyncCdcClient
    from tests.helpers import PASSWORD, USER

    proxy = TcpProxy("127.0.0.1", 0)
    await proxy.start()
    broker = ApacheKafka(tmp_path / "kafka", advertised_port=proxy.port)  # its own
    proxy.target = ("127.0.0.1", broker.port)
    await asyncio.to_thread(broker.start)
    limit = 256 * 1024
    db = f"`{source.database}`"
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=kafka_section(broker, source, max_buffer_bytes=limit,
                                             request_timeout=2.0))
    running = await start_service(config)
    writes = threading.Event()
    written = 0

    def write() -> None:  # about 5,000 rows/s
        nonlocal written
        conn = source.server.connect(source.database)
        with conn.cursor() as cur:
            while not writes.wait(0.01):
                cur.executemany("INSERT INTO items (id, body) VALUES (%s, %s)",
                                [(written + i, "x" * 200) for i in range(1, 51)])
                conn.commit()
                written += 50
        conn.close()

    try:
        source.execute(f"CREATE TABLE {db}.items (id INT PRIMARY KEY, body TEXT)")
        await kafka_caught_up(running, source)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        await pace(1.0)
        sink = running.service.replication.sink("kafka")
        assert sink is not None
        proxy.refuse = True
        proxy.cut()
        peak = 0
        for _ in range(60):  # 6 seconds away
            peak = max(peak, sink.buffered_bytes)
            await pace(0.1)
        during = await _metrics(running)
        stalled_at = sink.durable
        # The listener serves what is stored meanwhile.
        client = SyncCdcClient(running.host, running.port, USER, PASSWORD)
        served = [e for e in await asyncio.to_thread(
            lambda: list(client.stream(f"{source.database}.items", idle_timeout=0.5)))
            if isinstance(e, ChangeRecord)]
        assert served
        assert sink.durable == stalled_at  # nothing acknowledged while away
        proxy.refuse = False
        await pace(1.0)
        writes.set()
        await asyncio.to_thread(writer.join, 30)
        await kafka_caught_up(running, source, timeout=120)
        stats = sink.stats
        after = await _metrics(running)
    finally:
        writes.set()
        await running.stop()
    try:
        ids = [c.after["id"] for c in await read_changes(broker, source, ("items",))
               if c.after is not None]
    finally:
        await proxy.stop()
        await asyncio.to_thread(broker.close)
    assert limit // 2 < peak <= limit  # it filled up, then replication waited
    assert stats.reconnects >= 1 and stats.resent >= 1
    assert 4.0 < during["cdc_kafka_oldest_unacknowledged_seconds"] < 60
    assert limit // 2 < during["cdc_kafka_buffered_bytes"] <= limit
    assert during["cdc_kafka_buffer_capacity_bytes"] == limit
    assert during["cdc_kafka_unacknowledged_messages"] > 0
    assert after["cdc_kafka_delivery_failures_total"] == stats.reconnects
    assert after["cdc_kafka_messages_resent_total"] == stats.resent
    assert after["cdc_kafka_messages_acknowledged_total"] == \
        after["cdc_kafka_messages_total"] == stats.messages
    assert after["cdc_kafka_oldest_unacknowledged_seconds"] == 0
    assert after["cdc_kafka_buffered_bytes"] == after["cdc_kafka_unacknowledged_messages"] == 0
    assert written > 0 and set(ids) == set(range(1, written + 1))
    print(f"\nkafka outage: {written} rows, peak {peak} bytes held (limit {limit}), "
          f"{stats.reconnects} reconnects, {stats.resent} resent")


async def test_position_is_read_back_from_the_state_topic(tmp_path, source: Source,
                                                          users_file: str,
                                                          kafka_broker: ApacheKafka):
    """Without state/kafka.json the sink resumes from the state topic, not from the
    configured start (which here is the oldest binlog: everything would be sent again)."""
    db = f"`{source.database}`"
    data_dir = str(tmp_path / "data")
    config = make_config(data_dir, source.url, users_file,
                         kafka=kafka_section(kafka_broker, source))
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)",
                       f"INSERT INTO {db}.t SELECT seq FROM {db}.seq_1_to_100")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    os.unlink(os.path.join(data_dir, "state", "kafka.json"))
    running = await start_service(config)
    try:
        await running.replicating()
        assert running.service.replication.sink("kafka") is not None
        durable = running.service.replication.sink("kafka").durable
        assert durable is not None and durable.gtid_state == source.gtid_state()
        source.execute(f"INSERT INTO {db}.t VALUES (101)")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    messages = await raw_messages(kafka_broker, f"{source.database}.t")
    decoder = KafkaDecoder("databus")
    keys = [(c.gtid, c.event_number) for m in messages
            for c in decoder.decode_all(m.value, dict(m.headers)) if c.action == "insert"]
    assert len(keys) == len(set(keys)) == 101  # nothing sent twice
