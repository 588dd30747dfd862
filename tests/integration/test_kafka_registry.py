"""Avro values in Confluent's wire format with a real schema registry (Apicurio Registry 3,
tests/apicurio.py, through its Confluent-compatible API), decoded by a consumer no one here
wrote: confluent-kafka's ``AvroDeserializer`` with its ``SchemaRegistryClient``.

The decoded change events rebuild the source table; an ALTER TABLE registers a new schema
version under the topic's subject, and later messages carry its id; the subject's
compatibility is the configured one; a schema the registry rejects (409), and a registry that
is not there, make replication wait, saying why, and everything is published once the
registry takes the schema.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import urllib.request
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from mariadb_cdc_client.kafka import KafkaChangeReader
from tests.apache_kafka import ApacheKafka, free_port
from tests.apicurio import Apicurio
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import pace
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


def registry_get(registry: Apicurio, path: str) -> Any:
    with urllib.request.urlopen(registry.url + path, timeout=10) as response:
        return json.loads(response.read())


def registry_put(registry: Apicurio, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        registry.url + path, data=json.dumps(body).encode(), method="PUT",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def avro_section(broker: ApacheKafka, registry_url: str, source: Source,
                 **extra: Any) -> dict[str, Any]:
    return kafka_section(broker, source, **({
        "format": "debezium", "value_format": "avro", "schema_registry_url": registry_url,
        "partitions": 1, "client_id": source.database} | extra))


def decoded(registry_url: str, topic: str, messages: list[Any]) -> list[tuple[int, Any]]:
    """Each message's schema id and record, as confluent-kafka's deserializer reads them
    (it fetches the schemas by id from the registry itself); tombstones (a delete's, no
    value) left out."""
    with SchemaRegistryClient({"url": registry_url}) as client:
        deserializer = AvroDeserializer(client)
        context = SerializationContext(topic, MessageField.VALUE)
        out = []
        for m in messages:
            if m.value is None:
                continue
            assert m.value[:1] == b"\x00", "not Confluent's wire format"
            out.append((int.from_bytes(m.value[1:5], "big"), deserializer(m.value, context)))
    return out


_EPOCH = dt.datetime(1970, 1, 1)


def rebuilt(records: list[Any]) -> dict[int, tuple[Any, ...]]:
    """The table the change events describe, its values as the source's client reads
    them."""
    table: dict[int, tuple[Any, ...]] = {}
    for r in records:
        if r["op"] == "d":
            del table[r["before"]["id"]]
            continue
        a = r["after"]
        table[a["id"]] = (
            a["id"], a["name"], None if a["amount"] is None else Decimal(a["amount"]),
            None if a["at"] is None else _EPOCH + dt.timedelta(milliseconds=a["at"]),
            a["raw"], None if a["day"] is None else _EPOCH.date() + dt.timedelta(a["day"]),
            a.get("note"))
    return table


async def test_avro_values_decoded_with_the_registry_rebuild_the_table(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
        schema_registry: Apicurio):
    db = source.database
    topic, subject = f"{db}.t", f"{db}.t-value"
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=avro_section(kafka_broker, schema_registry.url, source))
    running = await start_service(config)
    try:
        t = f"`{db}`.t"
        source.execute(
            f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(8,2), "
            "at DATETIME(3), raw VARBINARY(4), day DATE)",
            f"INSERT INTO {t} VALUES (1, 'ada', 10.50, '2024-01-02 03:04:05.678', x'00ff', "
            "'2024-02-29'), (2, 'bob', NULL, NULL, NULL, NULL), (3, 'cy', 1, NULL, x'', "
            "'1969-12-31')",
            f"UPDATE {t} SET amount = 99.99, name = 'ada l.' WHERE id = 1",
            f"DELETE FROM {t} WHERE id = 2")
        await kafka_caught_up(running, source)
        first = len([m for m in await raw_messages(kafka_broker, topic)
                     if m.value is not None])  # (a delete's tombstone has none)
        source.execute(
            f"ALTER TABLE {t} ADD COLUMN note TEXT",
            f"INSERT INTO {t} (id, name, note) VALUES (4, 'dee', 'après')",
            f"UPDATE {t} SET note = 'n', raw = x'01' WHERE id = 3")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    messages = await raw_messages(kafka_broker, topic)
    events = decoded(schema_registry.url, topic, messages)
    assert [r["op"] for _, r in events] == ["c", "c", "c", "u", "d", "c", "u"]
    ids = [i for i, _ in events]
    assert len(set(ids[:first])) == 1 and len(set(ids[first:])) == 1 and ids[0] != ids[-1]
    assert "note" not in events[0][1]["after"] and events[-1][1]["after"]["note"] == "n"
    rows = source.query(f"SELECT id, name, amount, at, raw, day, note FROM `{db}`.t")
    assert rebuilt([r for _, r in events]) == {row[0]: tuple(row) for row in rows}
    # the project's own reader, with the registry, gives the source's values and types
    reader = KafkaChangeReader(kafka_broker.bootstrap, [topic], format="debezium",
                               schema_topic=f"{db}.schemas",
                               schema_registry_url=schema_registry.url)
    table: dict[Any, tuple[Any, ...]] = {}
    columns = ("id", "name", "amount", "at", "raw", "day", "note")
    async for change in reader.changes(to_end=True):
        if change.action == "delete":
            del table[change.before["id"]]  # type: ignore[index]
        elif change.after is not None:
            table[change.after["id"]] = tuple(change.after.get(c) for c in columns)
    assert table == {row[0]: tuple(row) for row in rows}
    # a version per table version, under the topic's subject, with the configured rule
    assert registry_get(schema_registry, f"/subjects/{subject}/versions") == [1, 2]
    assert [registry_get(schema_registry, f"/subjects/{subject}/versions/{v}")["id"]
            for v in (1, 2)] == [ids[0], ids[-1]]
    assert registry_get(schema_registry, f"/config/{subject}") == {
        "compatibilityLevel": "BACKWARD"}
    # the schema is Debezium's envelope as Kafka Connect's AvroConverter registers it
    schema = json.loads(registry_get(schema_registry, f"/schemas/ids/{ids[0]}")["schema"])
    assert schema["connect.name"] == f"{db}.{db}.t.Envelope"


async def wait_for_waiting(running: RunningService, text: str, timeout: float = 60) -> str:
    sink = running.service.replication.sink("kafka")
    assert sink is not None
    deadline = asyncio.get_running_loop().time() + timeout
    while text not in sink.waiting:
        if running.task.done():
            running.task.result()
        assert asyncio.get_running_loop().time() < deadline, \
            f"the sink did not wait for {text!r} (waiting: {sink.waiting!r})"
        await pace(0.05)
    stats = running.service.stats()  # what /health shows
    assert any(text in s.waiting for s in stats.sinks), stats.sinks
    return sink.waiting


async def test_an_incompatible_schema_stops_replication_saying_why_until_let_in(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
        schema_registry: Apicurio):
    db = source.database
    topic, subject = f"{db}.t", f"{db}.t-value"
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=avro_section(kafka_broker, schema_registry.url, source))
    running = await start_service(config)
    try:
        t = f"`{db}`.t"
        source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, n INT)",
                       f"INSERT INTO {t} VALUES (1, 4)")
        await kafka_caught_up(running, source)
        # BACKWARD: a string cannot read the ints of the records before
        source.execute(f"ALTER TABLE {t} MODIFY n VARCHAR(10)",
                       f"INSERT INTO {t} VALUES (2, 'five')")
        why = await wait_for_waiting(running, "rejects the new schema")
        assert subject in why and "BACKWARD" in why
        # what came before is sent: the row, and (the service rereads a table whose values
        # an ALTER converted) its delete under the old schema
        before = decoded(schema_registry.url, topic, await raw_messages(kafka_broker, topic))
        assert [(r["op"], r["after"] or r["before"]) for _, r in before] == [
            ("c", {"id": 1, "n": 4}), ("d", {"id": 1, "n": 4})]
        registry_put(schema_registry, f"/config/{subject}", {"compatibility": "NONE"})
        await kafka_caught_up(running, source, timeout=120)
        assert running.service.replication.sink("kafka").waiting == ""  # type: ignore[union-attr]
    finally:
        await running.stop()
    events = decoded(schema_registry.url, topic, await raw_messages(kafka_broker, topic))
    assert sorted((r["after"] for _, r in events[2:]), key=lambda a: a["id"]) == [
        {"id": 1, "n": "4"}, {"id": 2, "n": "five"}]
    assert len({i for i, _ in events[:2]} | {i for i, _ in events[2:]}) == 2


async def test_a_registry_not_there_is_waited_for(tmp_path, source: Source, users_file: str,
                                                  kafka_broker: ApacheKafka):
    db = source.database
    topic = f"{db}.t"
    later = Apicurio(str(tmp_path), port=free_port())
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=avro_section(kafka_broker, later.url, source))
    running = await start_service(config)
    try:
        t = f"`{db}`.t"
        source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v TEXT)",
                       f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
        why = await wait_for_waiting(running, "waiting for the schema registry")
        assert later.url in why
        later.launch()  # from this thread: the JVM dies with the thread that starts it
        await asyncio.to_thread(later.wait_ready)
        try:
            source.execute(f"INSERT INTO {t} VALUES (3, 'c')")
            await kafka_caught_up(running, source, timeout=120)
            events = decoded(later.url, topic, await raw_messages(kafka_broker, topic))
        finally:
            later.stop()
    finally:
        await running.stop()
    assert [r["after"] for _, r in events] == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"},
                                               {"id": 3, "v": "c"}]


async def test_avro_keys_partitioned_as_kafka_partitions_them(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka,
        schema_registry: Apicurio):
    from aiokafka.partitioner import murmur2

    db = source.database
    topic = f"{db}.t"
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka=avro_section(kafka_broker, schema_registry.url, source,
                                            key_format="avro", partitions=3,
                                            subject_name_strategy="topic-record",
                                            schema_compatibility="NONE"))
    running = await start_service(config)
    try:
        t = f"`{db}`.t"
        source.execute(f"CREATE TABLE {t} (a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b))",
                       f"INSERT INTO {t} VALUES " + ", ".join(
                           f"({i}, 'k{i}', {i})" for i in range(12)),
                       f"UPDATE {t} SET a = 100 WHERE a = 1")  # the key changes
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    messages = await raw_messages(kafka_broker, topic)
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        keys = AvroDeserializer(client)
        context = SerializationContext(topic, MessageField.KEY)
        decoded_keys = [keys(m.key, context) for m in messages]
    assert {(k["a"], k["b"]) for k in decoded_keys} == \
        {(i, f"k{i}") for i in range(12)} | {(100, "k1")}
    assert len({m.partition for m in messages}) > 1  # spread over the partitions
    # every message, tombstones too, where Kafka's default partitioner puts its key
    assert all(m.partition == (murmur2(m.key) & 0x7FFFFFFF) % 3 for m in messages)
    # the update that changed the key, as Debezium sends it: a delete of the old key, its
    # tombstone, a create of the new one
    by_key = [(k["a"], m.value is None) for m, k in zip(messages, decoded_keys, strict=True)
              if k["a"] in (1, 100)]
    assert sorted(by_key) == [(1, False), (1, False), (1, True), (100, False)]
    events = decoded(schema_registry.url, topic, messages)
    assert sorted((r["op"], (r["after"] or r["before"])["a"]) for _, r in events
                  if (r["after"] or r["before"])["a"] in (1, 100)) == [
        ("c", 1), ("c", 100), ("d", 1)]
    subjects = registry_get(schema_registry, "/subjects")
    assert f"{topic}-{db}.{db}.t.Envelope" in subjects and f"{topic}-{db}.{db}.t.Key" in subjects
    assert registry_get(schema_registry, f"/config/{topic}-{db}.{db}.t.Key") == {
        "compatibilityLevel": "NONE"}
