"""Avro values in Confluent's wire format: the debezium envelope's Avro schema (Connect's
schema as Confluent's AvroData writes it), the encoding, and the registry client against a
small stand-in for Confluent's REST API (the real registry: tests/integration/
test_kafka_registry.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from aiohttp import web

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.gtid import Gtid
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.messages.connect_avro import avro_name, envelope_schema, key_schema
from cdcserver.messages.events import RowEvent, TableShape
from cdcserver.messages.formats import Debezium
from cdcserver.sinks.kafka.registry import AvroEncoder, Registry, decode, record_name, subject
from cdcserver.store.schema import TableSchema

LAYOUT = TableLayout("shop", "items", (
    ColumnDef("id", T.LONG, nullable=False),
    ColumnDef("qty", T.TINY, nullable=False),
    ColumnDef("name", T.VARCHAR, meta=64, charset="utf-8"),
    ColumnDef("price", T.NEWDECIMAL, meta=(10 << 8) | 2),
    ColumnDef("day", T.DATE, nullable=False),
    ColumnDef("at", T.DATETIME2, meta=6),
    ColumnDef("ts", T.TIMESTAMP2, meta=3),
    ColumnDef("raw", T.BLOB, meta=2),
    ColumnDef("ratio", T.DOUBLE),
    ColumnDef("my col", T.LONGLONG)), primary_key=(0,))


def shape() -> TableShape:
    return TableShape(TableName("shop", "items"), TableSchema.from_layout(LAYOUT, 1, ""), LAYOUT)


def event(s: TableShape, before: tuple[Any, ...] | None,
          after: tuple[Any, ...] | None) -> RowEvent:
    return RowEvent(s, "update" if before and after else "insert" if after else "delete",
                    before, after, Gtid(0, 1, 7), 1, 1_700_000_000, "bin.000001", 400, 0,
                    gtid_text="0-1-7")


ROW = (1, 20, "pen", Decimal("1.50"), dt.date(2024, 5, 6),
       dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
       dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC), b"\x00\xff", 0.25, None)


def test_the_envelope_schema_is_what_avrodata_writes() -> None:
    schema = envelope_schema(shape(), "srv", "mariadb")
    fastavro.parse_schema(schema)
    assert (schema["name"], schema["namespace"]) == ("Envelope", "srv.shop.items")
    assert schema["connect.name"] == "srv.shop.items.Envelope"
    assert schema["connect.version"] == 2
    fields = {f["name"]: f for f in schema["fields"]}
    assert list(fields) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns",
                            "transaction"]
    value = fields["before"]["type"][1]
    assert fields["before"]["type"][0] == "null" and fields["before"]["default"] is None
    assert fields["after"]["type"] == ["null", "srv.shop.items.Value"]  # met again: by name
    columns = {f["name"]: f["type"] for f in value["fields"]}
    assert columns["id"] == "int"  # the primary key: no union
    # NOT NULL, yet optional: only the key's columns are required
    assert columns["qty"] == ["null", {"type": "int", "connect.type": "int16"}]  # TINYINT
    assert columns["name"] == ["null", "string"]
    assert columns["price"] == ["null", "string"]  # decimal.handling.mode=string
    assert columns["day"] == ["null", {"type": "int", "connect.version": 1,
                                       "connect.name": "io.debezium.time.Date"}]
    assert columns["at"][1]["connect.name"] == "io.debezium.time.MicroTimestamp"
    assert columns["ts"][1]["connect.name"] == "io.debezium.time.ZonedTimestamp"
    assert columns["my_col"] == ["null", "long"]  # Debezium's avro name adjustment
    assert columns["ratio"] == ["null", "double"]  # Connect's FLOAT64, "double" in its JSON
    snapshot = {f["name"]: f for f in fields["source"]["type"]["fields"]}["snapshot"]
    assert snapshot["default"] == "false" and snapshot["type"][1] == "null"
    assert snapshot["type"][0]["connect.name"] == "io.debezium.data.Enum"
    assert fields["source"]["type"]["connect.name"] == "io.debezium.connector.mariadb.Source"
    assert record_name(schema) == "srv.shop.items.Envelope"


def test_avro_names() -> None:
    assert avro_name("my col") == "my_col"
    assert avro_name("1st") == "_1st"
    assert avro_name("naïve") == "na_ve"


def test_a_change_event_encodes_in_the_wire_format_and_decodes() -> None:
    s = shape()
    fmt = Debezium(source_name="srv")
    schema = envelope_schema(s, "srv", "mariadb")
    encoder = AvroEncoder(258, schema)
    after = (*ROW[:2], "pencil", *ROW[3:])
    e = event(s, ROW, after)
    fmt.encode_value = lambda _, record: encoder.encode(record)
    value = fmt.row_value(e)
    assert value[:5] == b"\x00\x00\x00\x01\x02"
    schema_id, record = decode(value, {258: fastavro.parse_schema(schema)})
    assert schema_id == 258
    assert record["op"] == "u"
    assert record["before"]["name"] == "pen" and record["after"]["name"] == "pencil"
    assert record["after"]["raw"] == b"\x00\xff"  # bytes as they are, not base64
    assert record["after"]["price"] == "1.50"
    assert record["after"]["day"] == (dt.date(2024, 5, 6) - dt.date(1970, 1, 1)).days
    assert record["after"]["ts"] == "2024-05-06T07:08:09.123Z"
    assert record["after"]["my_col"] is None
    assert record["source"]["gtid"] == "0-1-7" and record["source"]["snapshot"] == "false"
    # the JSON form is unchanged: names as the columns, bytes in base64
    fmt.encode_value = None
    assert json.loads(fmt.row_value(e))["after"]["my col"] is None
    assert json.loads(fmt.row_value(e))["after"]["raw"] == "AP8="


def test_avro_keys() -> None:
    s = shape()
    schema = key_schema(s, "srv")
    assert schema["connect.name"] == "srv.shop.items.Key"
    assert schema["fields"] == [{"name": "id", "type": "int"}]
    fmt = Debezium(source_name="srv")
    encoder = AvroEncoder(9, schema)
    fmt.encode_key = lambda _, image: encoder.encode({"id": image["id"]})
    key = fmt.row_key(event(s, None, ROW))
    assert decode(key, {9: fastavro.parse_schema(schema)}) == (9, {"id": 1})


def test_the_client_reads_avro_values() -> None:
    from mariadb_cdc_client import kafka as client

    for name in ("my col", "1st", "naïve", "ok_9"):
        assert client._avro_name(name) == avro_name(name)
    s = shape()
    schema = envelope_schema(s, "srv", "mariadb")
    e = event(s, None, ROW)
    fmt = Debezium(source_name="srv")
    fmt.encode_value = lambda _, record: AvroEncoder(3, schema).encode(record)
    value = fmt.row_value(e)
    decoder = client.KafkaDecoder("debezium")
    with pytest.raises(LookupError, match="schema 3"):
        decoder.decode(value, {})
    decoder.add_avro_schema(3, json.dumps(schema))
    change = decoder.decode(value, {"gtid": b"0-1-7"})
    assert change is not None and change.action == "insert" and change.before is None
    assert change.after is not None and change.after["name"] == "pen"
    assert change.after["raw"] == "AP8="  # untyped without the table's fields, as from JSON


def test_subjects() -> None:
    assert subject("topic", "srv.shop.items", "srv.shop.items.Envelope") == \
        "srv.shop.items-value"
    assert subject("topic", "t", "r", key=True) == "t-key"
    assert subject("record", "t", "a.B") == "a.B"
    assert subject("topic-record", "t", "a.B") == "t-a.B"


class FakeRegistry:
    """Confluent's REST API as far as the client uses it: ids per schema text, a 409 for
    the schemas listed in ``reject``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.ids: dict[str, int] = {}
        self.reject: set[str] = set()
        self.unknown_subjects_have_no_config = False  # Apicurio 3.0 with long names
        self.registered: set[str] = set()
        self.app = web.Application()
        self.app.router.add_route("PUT", "/config/{subject}", self.config)
        self.app.router.add_route("POST", "/subjects/{subject}/versions", self.register)

    async def config(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("PUT", request.match_info["subject"], body))
        if self.unknown_subjects_have_no_config and \
                request.match_info["subject"] not in self.registered:
            return web.json_response({"error_code": 40401, "message": "No artifact"},
                                     status=404)
        return web.json_response({"compatibility": body["compatibility"]})

    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("POST", request.match_info["subject"], body))
        assert request.headers["Content-Type"] == "application/vnd.schemaregistry.v1+json"
        if body["schema"] in self.reject:
            return web.json_response({"error_code": 409, "message": "Incompatible: b at "
                                      "/fields/1"}, status=409)
        self.registered.add(request.match_info["subject"])
        schema_id = self.ids.setdefault(body["schema"], len(self.ids) + 1)
        return web.json_response({"id": schema_id})


async def _serve(fake: FakeRegistry) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_registration_sets_the_compatibility_once_and_keeps_the_ids() -> None:
    fake = FakeRegistry()
    runner, url = await _serve(fake)
    registry = Registry(KafkaConfig(schema_registry_url=url + "/", value_format="avro",
                                    format="debezium", schema_compatibility="NONE"))
    try:
        a = {"type": "record", "name": "A", "fields": []}
        b = {"type": "record", "name": "B", "fields": []}
        assert await registry.id("t-value", a, "db.t") == 1
        assert await registry.id("t-value", a, "db.t") == 1  # kept: no request
        assert await registry.id("t-value", b, "db.t") == 2
        assert [(m, s) for m, s, _ in fake.requests] == [
            ("PUT", "t-value"), ("POST", "t-value"), ("POST", "t-value")]
        assert fake.requests[0][2] == {"compatibility": "NONE"}
    finally:
        await registry.close()
        await runner.cleanup()


async def test_a_subject_without_config_gets_it_after_its_first_schema() -> None:
    fake = FakeRegistry()
    fake.unknown_subjects_have_no_config = True
    runner, url = await _serve(fake)
    registry = Registry(KafkaConfig(schema_registry_url=url, value_format="avro",
                                    format="debezium"))
    try:
        assert await registry.id("t-value", {"type": "record", "name": "A", "fields": []},
                                 "db.t") == 1
        assert [(m, s) for m, s, _ in fake.requests] == [
            ("PUT", "t-value"), ("POST", "t-value"), ("PUT", "t-value")]
        assert registry.waiting == ""
    finally:
        await registry.close()
        await runner.cleanup()


async def test_a_rejected_schema_waits_saying_why_until_it_is_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdcserver.sinks.kafka.registry.Backoff",
                        lambda **_: _Quick())
    fake = FakeRegistry()
    runner, url = await _serve(fake)
    registry = Registry(KafkaConfig(schema_registry_url=url, value_format="avro",
                                    format="debezium"))
    schema = {"type": "record", "name": "A", "fields": []}
    fake.reject.add(json.dumps(schema, separators=(",", ":")))
    try:
        task = asyncio.create_task(registry.id("t-value", schema, "db.t"))
        for _ in range(200):
            if registry.waiting:
                break
            await asyncio.sleep(0.01)
        assert "rejects the new schema of db.t under subject 't-value'" in registry.waiting
        assert "compatibility BACKWARD" in registry.waiting
        assert "b at /fields/1" in registry.waiting
        assert not task.done()
        fake.reject.clear()  # the operator lets it in
        assert await asyncio.wait_for(task, 10) == 1
        assert registry.waiting == ""
    finally:
        await registry.close()
        await runner.cleanup()


async def test_a_registry_down_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdcserver.sinks.kafka.registry.Backoff", lambda **_: _Quick())
    fake = FakeRegistry()
    runner, url = await _serve(fake)
    port = int(url.rsplit(":", 1)[1])
    await runner.cleanup()  # down
    registry = Registry(KafkaConfig(schema_registry_url=url, value_format="avro",
                                    format="debezium"))
    try:
        task = asyncio.create_task(registry.id("t-value", {"type": "record", "name": "A",
                                                           "fields": []}, "db.t"))
        for _ in range(500):
            if registry.waiting:
                break
            await asyncio.sleep(0.01)
        assert registry.waiting.startswith(f"waiting for the schema registry at {url}")
        runner = web.AppRunner(fake.app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()  # back
        assert await asyncio.wait_for(task, 10) == 1
        assert registry.waiting == ""
    finally:
        await registry.close()
        await runner.cleanup()


@dataclasses.dataclass
class _Quick:
    maximum: float = 0.05

    def failed(self) -> float:
        return 0.02
