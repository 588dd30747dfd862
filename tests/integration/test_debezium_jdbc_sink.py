"""Debezium's own code reads this service's ``debezium`` format (issue 52).

The service publishes a table's changes to Apache Kafka in the ``debezium`` format, keys and
values with their Kafka Connect schemas (``key_schema``, ``value_schema``), TRUNCATE as
Debezium's ``op: "t"`` event (``truncate_events``). Kafka Connect runs two of Debezium's JDBC
sink connectors on that topic into a second database on the same MariaDB (which the service
does not capture):

- ``envelope``: the sink reading Debezium's change events as they are (``insert.mode=upsert``,
  ``primary.key.mode=record_key``, ``delete.enabled``, ``truncate.enabled``,
  ``schema.evolution=basic``), into table ``items``;
- ``flat``: the same after Debezium's ``ExtractNewRecordState`` transform, which turns each
  change event into the row it leaves (a delete into the tombstone the format sends after it),
  into table ``items_flat``. The transform drops TRUNCATE events, by design, so that table
  keeps the rows the truncate removed.

After inserts, updates, a delete, a primary-key change, an ``ADD COLUMN``, then a
``TRUNCATE`` and inserts after it, both tables equal the source table, column for column and
value by value, read with ``SELECT`` (no code of the service's in the oracle). TIME values
are within a day: the sink writes a MicroTime as a java.time.LocalTime, which holds no other
(Debezium's MySQL connector sends '-838:59:59' as this service does, and its sink fails on
it). The topic has
one partition: Debezium's TRUNCATE event is one message without a key, in order with a
table's rows only when they share a partition.

Twice: with JSON values (``value_schema``, Kafka's ``JsonConverter``), and with Avro values
(``value_format = "avro"``: Confluent's wire format, the schemas registered through the
Confluent-compatible API of Apicurio Registry 3, tests/apicurio.py), which the sinks read with
Apicurio Registry 2.6's ``AvroConverter`` fetching the schemas by their content ids from the
same registry's v2 API (``AVRO_CONVERTER``); the keys are JSON with their schema both times.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from decimal import Decimal
from typing import Any

import pymysql
import pytest

from tests.apache_kafka import ApacheKafka
from tests.apicurio import Apicurio
from tests.conftest import Source, make_config, start_service
from tests.helpers import pace
from tests.integration.test_kafka import kafka_caught_up
from tests.kafka_connect import KafkaConnect

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]

SINK_USER, SINK_PASSWORD = "jdbcsink", "jdbc-sink-pw"

COLUMNS = ("id INT PRIMARY KEY, big BIGINT UNSIGNED, price DECIMAL(12,3), "
           "name VARCHAR(40) NOT NULL, day DATE, ms DATETIME(3), us DATETIME(6), "
           "at TIMESTAMP NULL DEFAULT NULL, span TIME, raw BLOB, note VARCHAR(20), "
           "ratio FLOAT, score DOUBLE")  # (FLOAT/DOUBLE: JsonConverter's "float"/"double")
ROWS = [
    "(1, 9223372036854775807, 12345.678, 'ada', '2024-02-29', '2024-01-02 03:04:05.678', "
    "'1999-12-31 23:59:59.999999', '2024-06-01 12:00:00', '23:59:59', x'00ff10', 'n1', 1.5, 1e300)",
    "(2, 0, -0.001, 'Grüße, ж, 漢字 😀', '1970-01-01', '1970-01-01 00:00:00.000', "
    "'2038-01-19 03:14:08.000001', '1970-01-02 00:00:00', '00:00:00.5', '', NULL, -0.25, -2.5)",
    "(3, NULL, NULL, 'nulls', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(4, 42, 0.000, 'four', '0001-01-01', '9999-12-31 23:59:59.999', "
    "'1000-01-01 00:00:00.000000', '2037-12-31 23:59:59', '12:34:56', x'ff', 'n4', 0, 0.1)",
]



def avro_converter(registry: Apicurio, side: str = "value") -> dict[str, object]:
    """A connector's settings reading the Avro values (``side="key"``: keys) with Apicurio
    Registry 2.6's converter: Confluent's framing (byte 0, a 4-byte id:
    Legacy4ByteIdHandler), the id a content id (what Apicurio 3's ccompat API hands out),
    looked up through the v2 API Apicurio 3 still serves; no Apicurio headers on the
    messages."""
    prefix = f"{side}.converter.apicurio.registry."
    return {f"{side}.converter": "io.apicurio.registry.utils.converter.AvroConverter",
            prefix + "url": f"http://127.0.0.1:{registry.port}/apis/registry/v2",
            prefix + "id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler",
            prefix + "use-id": "contentId",
            prefix + "headers.enabled": "false"}


def _canonical(value: Any) -> Any:
    """A value as both databases can hold it: DECIMAL travels as a string (the format's
    decimal.handling.mode=string), so the target's column is text."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _table(source: Source, database: str, table: str) -> tuple[list[str], dict[Any, dict]]:
    """The table's columns and its rows by id, read in UTC (TIMESTAMP values)."""
    conn = source.server.connect(database)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")
            cursor.execute(f"SELECT * FROM `{table}` ORDER BY id")
            names = [d[0] for d in cursor.description]
            rows = {row[0]: dict(zip(names, map(_canonical, row), strict=True))
                    for row in cursor.fetchall()}
    finally:
        conn.close()
    return names, rows


def _differences(source: Source, target_db: str, target: str,
                 kept: dict[Any, dict[str, Any]]) -> str:
    """What tells the target table from the source's, plus the rows ``kept`` (those the
    target keeps by design); '' when they are equal."""
    columns, rows = _table(source, source.database, "items")
    rows = {**kept, **rows}
    try:
        target_columns, target_rows = _table(source, target_db, target)
    except pymysql.err.ProgrammingError as e:  # not created yet
        return f"{target}: {e}"
    if sorted(target_columns) != sorted(columns):
        return f"{target} columns {target_columns} != {columns}"
    out = []
    for key in sorted(rows.keys() | target_rows.keys()):
        mine, theirs = rows.get(key), target_rows.get(key)
        if mine != theirs:
            out.append(f"id {key}: source {mine} != {target} {theirs}")
    return "\n".join(out)


async def _until_equal(source: Source, target_db: str, connect: KafkaConnect,
                       kept_flat: dict[Any, dict[str, Any]] | None = None,
                       timeout: float = 120.0) -> None:
    """Until both targets equal the source (``items_flat`` with ``kept_flat`` too)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        differences = [await asyncio.to_thread(_differences, source, target_db, table, kept)
                       for table, kept in (("items", {}), ("items_flat", kept_flat or {}))]
        for name in ("envelope", "flat"):
            await asyncio.to_thread(connect.check_running, name)  # fails on a failed task
        if not any(differences):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                "the JDBC sink's tables differ from the source (Connect's log: "
                f"{connect.log_path}):\n" + "\n".join(d for d in differences if d))
        await pace(0.3)


def _sink(source: Source, target_db: str, topic: str, table: str) -> dict[str, object]:
    port = source.server.port
    return {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": 1, "topics": topic,
        "connection.url": f"jdbc:mariadb://127.0.0.1:{port}/{target_db}",
        "connection.username": SINK_USER, "connection.password": SINK_PASSWORD,
        "connection.pool.min_size": 1, "connection.pool.max_size": 2,
        "insert.mode": "upsert", "primary.key.mode": "record_key",
        "delete.enabled": "true", "truncate.enabled": "true", "schema.evolution": "basic",
        "collection.name.format": table, "use.time.zone": "UTC",
        "batch.size": 500,
    }


@pytest.mark.parametrize("values", ["json", "avro", "avro-keys"])
async def test_debeziums_jdbc_sink_makes_a_copy_equal_to_the_source(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka, values: str,
        request: pytest.FixtureRequest) -> None:
    value_options: dict[str, object] = {"value_schema": True, "key_schema": True}
    converter: dict[str, object] = {}
    if values.startswith("avro"):
        registry: Apicurio = request.getfixturevalue("schema_registry")
        value_options = {"value_format": "avro", "schema_registry_url": registry.url,
                         "key_schema": True}
        converter = avro_converter(registry)
    if values == "avro-keys":  # the keys Avro too, their schemas in the registry
        value_options |= {"key_format": "avro", "key_schema": False}
        converter |= avro_converter(registry, "key")
    db = source.database
    target_db = f"{db}_sink"  # t_...: the source fixture drops it with the test's database
    source.execute(f"CREATE DATABASE `{target_db}` CHARACTER SET utf8mb4",
                   f"CREATE USER IF NOT EXISTS '{SINK_USER}'@'%' IDENTIFIED BY "
                   f"'{SINK_PASSWORD}'",
                   f"GRANT ALL ON `{target_db}`.* TO '{SINK_USER}'@'%'")
    t = f"`{db}`.items"
    run = uuid.uuid4().hex[:8]  # topics of this run's own on a broker that outlives it
    topic = f"{run}.{db}.items"
    config = make_config(
        os.path.join(tmp_path, "data"), source.url, users_file,
        capture={"include": f"{db}.*"},
        kafka={"bootstrap": kafka_broker.bootstrap, "format": "debezium",
               "topic": run + ".{db}.{table}", "partitions": 1, "client_id": "cdc",
               "schema_topic": "", "state_topic": f"{run}.{db}.state",
               "truncate_events": True, **value_options})
    running = await start_service(config)
    connect = KafkaConnect(tmp_path / "connect", kafka_broker.bootstrap)
    try:
        source.execute(f"CREATE TABLE {t} ({COLUMNS}) DEFAULT CHARSET utf8mb4",
                       f"INSERT INTO {t} VALUES {', '.join(ROWS)}")
        await kafka_caught_up(running, source)  # the topic exists before the sinks start
        flat = {**_sink(source, target_db, topic, "items_flat"), **converter,
                "transforms": "unwrap",
                "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}
        connect.start({"envelope": {**_sink(source, target_db, topic, "items"), **converter},
                       "flat": flat})
        await asyncio.to_thread(connect.wait_running, ["envelope", "flat"])
        source.execute(
            f"UPDATE {t} SET price = price * 2, name = CONCAT(name, ' ü'), "
            "us = '2001-02-03 04:05:06.070809' WHERE id IN (1, 4)",
            f"UPDATE {t} SET big = 7, day = '2000-01-01', raw = x'0102' WHERE id = 3",
            f"DELETE FROM {t} WHERE id = 4",
            f"UPDATE {t} SET id = 200 WHERE id = 2",  # a primary-key change
            f"ALTER TABLE {t} ADD COLUMN extra INT",
            f"INSERT INTO {t} (id, name, extra) VALUES (5, 'after alter', 55)",
            f"UPDATE {t} SET extra = 11 WHERE id = 1")
        await kafka_caught_up(running, source)
        await _until_equal(source, target_db, connect)
        # ExtractNewRecordState drops TRUNCATE events (AbstractExtractRecordStrategy
        # .handleTruncateRecord): the flattened copy keeps the rows the truncate removed.
        _, before_truncate = await asyncio.to_thread(_table, source, db, "items")
        source.execute(f"TRUNCATE TABLE {t}",
                       f"INSERT INTO {t} (id, name, day, extra) VALUES "
                       "(6, 'after truncate', '2025-05-05', 6), (7, 'seven', NULL, NULL)")
        await kafka_caught_up(running, source)
        await _until_equal(source, target_db, connect, kept_flat=before_truncate)
        _, final = await asyncio.to_thread(_table, source, target_db, "items")
        assert sorted(final) == [6, 7]  # the truncate emptied it, the later rows are there
    finally:
        await asyncio.to_thread(connect.stop)
        await running.stop()



async def test_debeziums_jdbc_sink_copies_the_initial_snapshot_then_the_changes(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka) -> None:
    """``snapshot = "initial"``: the rows there before the service started reach Kafka as
    Debezium's read events (``op`` "r"), which the JDBC sink takes as inserts (upserts); the
    changes after them follow. Both copies equal the source."""
    from tests.integration.test_kafka_snapshot import snapshot_joined

    db = source.database
    target_db = f"{db}_sink"
    source.execute(f"CREATE DATABASE `{target_db}` CHARACTER SET utf8mb4",
                   f"CREATE USER IF NOT EXISTS '{SINK_USER}'@'%' IDENTIFIED BY "
                   f"'{SINK_PASSWORD}'",
                   f"GRANT ALL ON `{target_db}`.* TO '{SINK_USER}'@'%'")
    t = f"`{db}`.items"
    source.execute(f"CREATE TABLE {t} ({COLUMNS}) DEFAULT CHARSET utf8mb4",
                   f"INSERT INTO {t} VALUES {', '.join(ROWS)}")
    run = uuid.uuid4().hex[:8]
    topic = f"{run}.{db}.items"
    config = make_config(
        os.path.join(tmp_path, "data"), source.url, users_file,
        capture={"include": f"{db}.*"},
        kafka={"bootstrap": kafka_broker.bootstrap, "format": "debezium",
               "topic": run + ".{db}.{table}", "partitions": 1, "client_id": "cdc",
               "schema_topic": "", "state_topic": f"{run}.{db}.state",
               "value_schema": True, "key_schema": True, "snapshot": "initial"})
    running = await start_service(config)
    connect = KafkaConnect(tmp_path / "connect", kafka_broker.bootstrap)
    try:
        await snapshot_joined(running)
        await kafka_caught_up(running, source)
        flat = {**_sink(source, target_db, topic, "items_flat"), "transforms": "unwrap",
                "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}
        connect.start({"envelope": _sink(source, target_db, topic, "items"), "flat": flat})
        await asyncio.to_thread(connect.wait_running, ["envelope", "flat"])
        await _until_equal(source, target_db, connect)  # the snapshot's rows
        source.execute(f"UPDATE {t} SET name = 'changed', price = 1.5 WHERE id = 1",
                       f"DELETE FROM {t} WHERE id = 4",
                       f"INSERT INTO {t} (id, name) VALUES (9, 'after the snapshot')")
        await kafka_caught_up(running, source)
        await _until_equal(source, target_db, connect)
    finally:
        await asyncio.to_thread(connect.stop)
        await running.stop()
