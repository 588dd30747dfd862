"""The Kafka sink against Apache Kafka (tests/apache_kafka.py) and a real MariaDB, with the
producer as the service runs it by default (idempotent, acks=all).

Golden messages per format (``tests/golden/kafka_<format>.jsonl``; regenerate with
``UPDATE_GOLDEN=1`` and review the diff), keys, ordering per row, every type decoded back by
the client library, the position read back from Kafka.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from mariadb_cdc_client.kafka import KafkaChange, KafkaChangeReader, _partitions
from tests.apache_kafka import ApacheKafka
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import pace, write_secret

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]

GOLDEN = Path(__file__).parent.parent / "golden"
FORMATS = ["databus", "dip", "debezium", "maxscale"]


def kafka_section(broker: ApacheKafka, source: Source, **extra: Any) -> dict[str, Any]:
    db = source.database
    # A topic per table and three partitions unless a test says otherwise (the databus
    # format's own default, one topic for everything, is tested on its own).
    section = {"bootstrap": broker.bootstrap, "schema_topic": f"{db}.schemas",
               "state_topic": f"{db}.state", "topic": "{db}.{table}", "partitions": 3}
    section.update(extra)
    return section


async def kafka_caught_up(running: RunningService, source: Source,
                          timeout: float = 60.0) -> None:
    """Until the sink's checkpoint covers everything the source has logged."""
    await running.caught_up(source, timeout)
    target = source.gtid_state()
    sink = running.service.replication.sink("kafka")
    assert sink is not None
    deadline = asyncio.get_running_loop().time() + timeout
    while sink.durable is None or not all(sink.durable.gtid_state.covers(g) for g in target):
        if running.task.done():
            running.task.result()
        assert asyncio.get_running_loop().time() < deadline, "the Kafka sink did not catch up"
        await pace(0.05)


async def raw_messages(broker: ApacheKafka, topic: str) -> list[Any]:
    """Every message of a topic, partition by partition, in offset order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = (await _partitions(consumer)).get(topic, set())
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found = []
        while True:
            batch = await consumer.getmany(*tps, timeout_ms=700)
            if not any(batch.values()):
                return sorted(found, key=lambda m: (m.partition, m.offset))
            for messages in batch.values():
                found += messages
    finally:
        await consumer.stop()


_VOLATILE = re.compile(r'"(ts|es|ts_ms|TIME|timestamp|Pos|BINLOG_POS|pos)":\s*"?[0-9]+"?')
_SEQUENCE = re.compile(r'"sequence": (\d+)')
_BINLOG = re.compile(r"mysql-bin\.\d{6}")


def normalize(lines: list[str], gtids: list[str]) -> list[str]:
    """Mask what depends on what ran before in the shared server: times, binlog files and
    offsets (test_positions_grow checks those), and GTID sequence numbers, which become
    1, 2, … in order of first appearance. The rest is deterministic."""
    order: dict[str, int] = {}
    for gtid in gtids:
        order.setdefault(gtid.rsplit("-", 1)[1], len(order) + 1)

    def sequence(n: str) -> str:
        return str(order.get(n, f"?{n}"))

    known = re.compile("|".join(rf"(?<![\w-]){re.escape(g)}(?![\w-])" for g in set(gtids)))
    out = []
    for text in lines:
        text = _VOLATILE.sub(lambda m: f'"{m[1]}":"<{m[1]}>"', text)
        text = _BINLOG.sub("<binlog>", text)
        text = known.sub(lambda m: m[0].rsplit("-", 1)[0] + "-" + sequence(
            m[0].rsplit("-", 1)[1]), text)
        out.append(_SEQUENCE.sub(lambda m: f'"sequence": {sequence(m[1])}', text))
    return out


SCENARIO = [
    "CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(8,2), "
    "at DATETIME(3), raw VARBINARY(4), day DATE)",
    "INSERT INTO {t} VALUES (1, 'ada', 10.50, '2024-01-02 03:04:05.678', x'00ff', "
    "'2024-02-29'), (2, 'bob', NULL, NULL, NULL, NULL)",
    "UPDATE {t} SET amount = 99.99, name = 'ada l.' WHERE id = 1",
    "DELETE FROM {t} WHERE id = 2",
    "ALTER TABLE {t} ADD COLUMN note TEXT",
    "INSERT INTO {t} (id, name, note) VALUES (3, 'cy', 'après')",
    "TRUNCATE TABLE {t}",
]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_golden_messages(tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
                               fmt: str):
    # client_id names the source in Debezium's messages, and its schema change topic.
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format=fmt, partitions=1,
                                             client_id=source.database))
    running = await start_service(config)
    try:
        table = f"`{source.database}`.t"
        source.execute(*(s.format(t=table) for s in SCENARIO))
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    messages = await raw_messages(kafka_broker, f"{source.database}.t")
    if fmt == "debezium":  # its statements are on the schema change topic, after the rows
        messages += await raw_messages(kafka_broker, source.database)
    lines, gtids = [], []
    for m in messages:
        headers = {k: v.decode() for k, v in m.headers}
        gtids.append(headers["gtid"])
        key = m.key.decode() if m.key is not None else None
        lines.append(json.dumps({
            "key": json.loads(key) if key and key.startswith("{") else key,
            "value": json.loads(m.value) if m.value is not None else None,  # a tombstone
            "headers": {k: headers[k] for k in ("gtid", "event")}},
            ensure_ascii=False, sort_keys=False).replace(source.database, "<db>"))
    lines = normalize(lines, gtids)
    path = GOLDEN / f"kafka_{fmt}.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert lines == path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("fmt", FORMATS)
async def test_every_type_decodes_back_to_the_stream_values(tmp_path, source: Source,
                                                            users_file: str,
                                                            kafka_broker: ApacheKafka, fmt: str):
    """The client library turns each format's messages back into the values the change
    stream gives for the same rows (golden type table: every type at its edges)."""
    from mariadb_cdc_client import ChangeRecord, SyncCdcClient
    from tests.helpers import PASSWORD, USER
    from tests.server.test_types import _fill

    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format=fmt))
    running = await start_service(config)
    try:
        _fill(source)
        await kafka_caught_up(running, source)
        client = SyncCdcClient(running.host, running.port, USER, PASSWORD)
        stream = [e for e in await asyncio.to_thread(
            lambda: list(client.stream(f"{source.database}.types", idle_timeout=1)))
            if isinstance(e, ChangeRecord)]
    finally:
        await running.stop()
    reader = KafkaChangeReader(kafka_broker.bootstrap, [f"{source.database}.types"],
                               format=fmt, schema_topic=f"{source.database}.schemas")
    changes = [c async for c in reader.changes(to_end=True) if not c.is_statement]
    images = _images(changes)
    expected = {(r.gtid, r.event_number): r.values for r in stream}
    assert images.keys() == expected.keys()
    for position, values in expected.items():
        got = images[position]
        for column, value in values.items():
            if fmt == "debezium" and isinstance(value, str) and column in _TEMPORAL:
                value = None  # Debezium's rule: a zero or invalid date is null
            assert got[column] == value, (fmt, position, column, got[column], value)
            assert type(got[column]) is type(value), (fmt, position, column)


_TEMPORAL = {"dt", "dtm", "dtm3", "dtm6", "ts", "ts6"}


def _images(changes: list[KafkaChange]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each record's values by (gtid, event_number), as the stream numbers them."""
    images: dict[tuple[str, int], dict[str, Any]] = {}
    for c in changes:
        if c.action in ("update_before", "update_after"):  # maxscale: one record each
            values = c.before if c.before is not None else c.after
            assert values is not None
            images[(c.gtid, c.event_number)] = values
        elif c.action == "update":
            assert c.before is not None and c.after is not None
            images[(c.gtid, c.event_number)] = c.before
            images[(c.gtid, c.event_number + 1)] = c.after
        else:
            values = c.after if c.after is not None else c.before
            assert values is not None
            images[(c.gtid, c.event_number)] = values
    return images


async def test_cdc_kafka_prints_decoded_changes(tmp_path, source: Source, users_file: str,
                                                kafka_broker: ApacheKafka):
    """``cdc kafka`` reads a table's topic back as JSON lines, from the beginning or after a
    GTID state; an unknown topic is a clear error."""
    import subprocess
    import sys

    db = f"`{source.database}`"
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="dip"))
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, price DECIMAL(10,2), "
                       "raw VARBINARY(4))",
                       f"INSERT INTO {db}.t VALUES (1, 12.30, x'0001')")
        after_first = str(source.gtid_state())
        source.execute(f"UPDATE {db}.t SET price = 4.56 WHERE id = 1")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    cdc = os.path.join(os.path.dirname(sys.executable), "cdc")

    def cdc_kafka(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cdc, "kafka", "-b", kafka_broker.bootstrap, "--kafka-format",
                               "dip", "--schema-topic", f"{source.database}.schemas", "-t",
                               "1.5", *args], capture_output=True, text=True, timeout=60)

    done = await asyncio.to_thread(cdc_kafka, f"{source.database}.t")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    # The statement is on every partition, in order with each one's rows; the reader
    # reports it once.
    raw = await raw_messages(kafka_broker, f"{source.database}.t")
    statements = [m for m in raw if b'"CREATE"' in m.value]
    assert sorted(m.partition for m in statements) == [0, 1, 2]
    assert len({m.key for m in statements}) == 1
    creates = [d for d in lines if d["action"] == "create"]
    assert len(creates) == 1 and creates[0]["sql"].startswith("CREATE TABLE")
    rows = [d for d in lines if "sql" not in d]
    assert [(d["action"], d["after"]) for d in rows] == [
        ("insert", {"id": 1, "price": "12.30", "raw": "0001"}),
        ("update", {"id": 1, "price": "4.56", "raw": "0001"})]
    assert rows[1]["before"] == {"id": 1, "price": "12.30", "raw": "0001"}
    later = await asyncio.to_thread(cdc_kafka, "--from", after_first, f"{source.database}.t")
    assert [json.loads(line)["action"] for line in later.stdout.splitlines()] == ["update"]
    missing = await asyncio.to_thread(cdc_kafka, f"{source.database}.nothing")
    assert missing.returncode == 1 and "no topic" in missing.stderr


async def test_debezium_keys_and_schema_changes_as_debezium_documents_them(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka):
    """Debezium's MySQL connector documentation: a change event's key is the row's primary
    key, with JsonConverter's schemas.enable a {"schema", "payload"} pair whose schema is a
    struct named <topic.prefix>.<db>.<table>.Key; schema changes go to the topic named
    <topic.prefix>, keyed {"databaseName": db} (io.debezium.connector.mysql.SchemaChangeKey),
    not to the tables' topics."""
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="debezium",
                                             partitions=1, client_id=f"{db}-server",
                                             key_schema=True))
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE `{db}`.customers (id INT PRIMARY KEY, "
                       "email VARCHAR(255) NOT NULL)",
                       f"INSERT INTO `{db}`.customers VALUES (1001, 'sally@example.com')",
                       *[f"ALTER TABLE `{db}`.customers COMMENT 'again'"] * 2)
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    # The same statement twice, under the same key ({"databaseName"}): the reader reports
    # both (it folds only the copies of one statement written to several partitions).
    reader = KafkaChangeReader(kafka_broker.bootstrap, [f"{db}-server"], format="debezium",
                               schema_topic="")
    read = [c async for c in reader.changes(to_end=True)]
    assert [c.sql for c in read if c.sql and "COMMENT" in c.sql] == [
        f"ALTER TABLE `{db}`.customers COMMENT 'again'"] * 2
    rows = await raw_messages(kafka_broker, f"{db}.customers")
    assert [json.loads(m.key) for m in rows] == [{
        "schema": {"type": "struct", "fields": [
            {"type": "int32", "optional": False, "field": "id"}],
            "optional": False, "name": f"{db}-server.{db}.customers.Key"},
        "payload": {"id": 1001}}]
    assert json.loads(rows[0].value)["op"] == "c"
    changes = await raw_messages(kafka_broker, f"{db}-server")
    create = [m for m in changes if b"CREATE TABLE" in m.value]
    assert len(create) == 1 and json.loads(create[0].key) == {
        "schema": {"type": "struct", "fields": [
            {"type": "string", "optional": False, "field": "databaseName"}],
            "optional": False, "name": "io.debezium.connector.mysql.SchemaChangeKey"},
        "payload": {"databaseName": db}}
    value = json.loads(create[0].value)
    assert {"source", "ts_ms", "databaseName", "schemaName", "ddl", "tableChanges"} <= set(value)
    table = value["tableChanges"][0]
    assert table["type"] == "CREATE" and table["id"] == f'"{db}"."customers"'
    assert table["table"]["primaryKeyColumnNames"] == ["id"]
    assert [(c["name"], c["jdbcType"], c["position"], c["optional"])
            for c in table["table"]["columns"]] == [("id", 4, 1, False), ("email", 12, 2, False)]


def test_topic_names_kafka_refuses_are_made_legal_and_stay_apart():
    from cdcserver.sinks.kafka.routing import legal_topic

    assert legal_topic("shop.orders") == "shop.orders"  # what was legal keeps its topic
    names = ["t.sp ace", "t.sp_ace", "t.ж" * 30, "t." + "ж" * 64, "t." + "ж" * 63 + "з", ".."]
    topics = [legal_topic(n) for n in names]
    assert len(set(topics)) == len(names)
    for topic in topics:
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic), topic


async def test_tables_named_in_any_script_are_published(tmp_path, source: Source,
                                                        users_file: str, kafka_broker: ApacheKafka):
    """A table whose name Kafka would refuse as a topic (a space, 64 Cyrillic letters) is
    published on a legal topic, beside an ordinary one: no table stops the others."""
    from cdcserver.sinks.kafka.routing import legal_topic

    db = source.database
    names = ["sp ace", "ж" * 64, "plain"]
    running = await start_service(make_config(
        str(tmp_path / "data"), source.url, users_file,
        kafka=kafka_section(kafka_broker, source, partitions=1)))
    try:
        for name in names:
            source.execute(f"CREATE TABLE `{db}`.`{name}` (id INT PRIMARY KEY)",
                           f"INSERT INTO `{db}`.`{name}` VALUES (1), (2)")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    for name in names:
        messages = await raw_messages(kafka_broker, legal_topic(f"{db}.{name}"))
        assert len(messages) == 2, name  # the CREATE, and the row event of its two rows


async def test_kafka_publishes_only_the_tables_its_include_and_exclude_select(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka):
    """``[kafka] include``/``exclude`` narrow what is published: the store keeps every table
    captured (the widest set), Kafka only those selected; the others' topics get nothing."""
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="maxscale",
                                             exclude=f"`{db}`.private"))
    source.execute(f"CREATE TABLE `{db}`.public (id INT PRIMARY KEY, v VARCHAR(20))",
                   f"CREATE TABLE `{db}`.private (id INT PRIMARY KEY, v VARCHAR(20))")
    running = await start_service(config)
    try:
        source.execute(f"INSERT INTO `{db}`.public VALUES (1, 'open'), (2, 'open')",
                       f"INSERT INTO `{db}`.private VALUES (1, 'hidden-4471')",
                       f"UPDATE `{db}`.public SET v = 'shut' WHERE id = 2")
        await kafka_caught_up(running, source)
        stored = {t.table for t in running.service.data.catalog.tables if t.database == db}
        assert stored == {"public", "private"}
    finally:
        await running.stop()
    published = await raw_messages(kafka_broker, f"{db}.public")
    records = [json.loads(m.value) for m in published]
    assert sorted((r["id"], r["event_type"]) for r in records if "id" in r) == [
        (1, "insert"), (2, "insert"), (2, "update_after"), (2, "update_before")]
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap)
    await consumer.start()
    try:
        topics = await consumer.topics()
    finally:
        await consumer.stop()
    assert f"{db}.private" not in topics and f"{db}.public" in topics
    for topic in sorted(t for t in topics if t.startswith(db)):
        assert not any(b"hidden-4471" in (m.value or b"") for m in
                       await raw_messages(kafka_broker, topic)), topic


@pytest.mark.parametrize("fmt", FORMATS)
async def test_kafka_gets_excluded_hashed_and_masked_columns_as_the_store_does(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka, fmt: str):
    """[capture] column rules apply before Kafka too: no topic (record, key, schema or
    state) holds a clear value, in any format; the hash is the salted SHA-256 of the value."""
    db = source.database
    salt = tmp_path / "salt"
    write_secret(salt, "kafka-salt")
    clear = ["mail-7731@example.com", "hash-of-a-password-7731", "4111222233334444"]
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format=fmt),
                         capture={"columns_exclude": f"`{db}`.users.password_hash",
                                  "columns_hash": f"`{db}`.users.email",
                                  "columns_mask": f"`{db}`.users.card:4",
                                  "hash_salt_file": str(salt)})
    source.execute(f"CREATE TABLE `{db}`.users (id INT PRIMARY KEY, email VARCHAR(60), "
                   "password_hash VARCHAR(60), card VARCHAR(20))")
    earlier = await _topics(kafka_broker)  # the broker is shared: other tests' topics
    running = await start_service(config)
    try:
        source.execute(f"INSERT INTO `{db}`.users VALUES (1, '{clear[0]}', '{clear[1]}', "
                       f"'{clear[2]}')",
                       f"UPDATE `{db}`.users SET card = '{clear[2]}9' WHERE id = 1")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    topics = sorted(t for t in await _topics(kafka_broker) if t not in earlier or db in t)
    parts = []
    for topic in topics:
        for m in await raw_messages(kafka_broker, topic):
            parts += [m.key or b"", m.value or b""]
    raw = b"\n".join(parts)
    for token in re.findall(rb'"([A-Za-z0-9+/]{4,}={0,2})"', raw):  # databus: base64
        with contextlib.suppress(binascii.Error, ValueError):
            parts.append(base64.b64decode(token, validate=True))
    everything = b"\n".join(parts)
    hashed = hashlib.sha256(b"kafka-salt" + clear[0].encode()).hexdigest().encode()
    assert hashed in everything and b"4111***" in everything
    for value in [*clear, "password_hash"]:
        assert value.encode() not in everything, (fmt, value)


async def _topics(broker: ApacheKafka) -> set[str]:
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        return {t for t in await consumer.topics() if not t.startswith("__")}
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
async def test_compressed_batches_are_taken_by_the_broker_and_read_back(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka, codec: str):
    """Each codec's batches (lz4 and gzip at the Java client's levels, see
    cdcserver/sinks/kafka/compression.py) are decompressed and validated by Apache Kafka's
    broker, which refuses a batch it cannot read, and read back equal to SELECT."""
    db = f"`{source.database}`"
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="debezium",
                                             compression=codec))
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {db}.c (id INT PRIMARY KEY, note TEXT)",
                       f"INSERT INTO {db}.c SELECT seq, REPEAT(CONCAT('row ', seq), seq % 40)"
                       f" FROM {db}.seq_1_to_3000",
                       f"UPDATE {db}.c SET note = 'changed' WHERE id % 7 = 0",
                       f"DELETE FROM {db}.c WHERE id % 11 = 0")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    reader = KafkaChangeReader(kafka_broker.bootstrap, [f"{source.database}.c"],
                               format="debezium", schema_topic=f"{source.database}.schemas")
    rows: dict[int, str] = {}
    for c in sorted([c async for c in reader.changes(to_end=True) if not c.is_statement],
                    key=lambda c: (c.partition, c.offset)):
        if c.after is None:
            assert c.before is not None
            rows.pop(c.before["id"])
        else:
            rows[c.after["id"]] = c.after["note"]
    assert rows == dict(source.query(f"SELECT id, note FROM {db}.c"))
