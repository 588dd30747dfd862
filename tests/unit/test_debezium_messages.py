"""The debezium format's messages where Debezium's own code decides their number and shape
(3.6: RelationalChangeRecordEmitter, EventDispatcher, BinlogStreamingChangeEventSource): a key
change, tombstones, TRUNCATE, and values with their Connect schema."""

from __future__ import annotations

import base64
import json
from typing import Any

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.gtid import Gtid
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.messages import connect_schema
from cdcserver.messages.events import RowEvent, StatementEvent, TableShape
from cdcserver.messages.formats import Debezium
from cdcserver.store.schema import TableSchema

_LAYOUT = TableLayout("shop", "t", (ColumnDef("id", T.LONG, nullable=False),
                                    ColumnDef("name", T.VARCHAR, 80, charset="utf8mb4")), (0,))
SHAPE = TableShape(TableName("shop", "t"), TableSchema.from_layout(_LAYOUT, 1, ""), _LAYOUT)
GTID = Gtid(0, 1, 7)


def _event(action: str, before: tuple[Any, ...] | None, after: tuple[Any, ...] | None
           ) -> RowEvent:
    return RowEvent(SHAPE, action, before, after, GTID, 4, 1700000000, "mysql-bin.000001",
                    900, 0, str(GTID))


def _messages(fmt: Debezium, e: RowEvent) -> list[tuple[Any, Any, int, Any, dict[str, Any]]]:
    return [(json.loads(r.key), r.value and json.loads(r.value)["op"], r.event, r.row,
             {k: json.loads(v) for k, v in r.headers}) for r in fmt.routed_rows(e)]


def test_an_update_of_the_key_is_a_delete_a_tombstone_and_a_create() -> None:
    """emitUpdateAsPrimaryKeyChangeRecord: the delete keyed by the old key with the header
    __debezium.newkey, its tombstone, the create keyed by the new key with __debezium.oldkey;
    each on its own key's partition (the row it is keyed by)."""
    before, after = (1, "ada"), (2, "ada")
    assert _messages(Debezium(), _event("update", before, after)) == [
        ({"id": 1}, "d", 4, before, {"__debezium.newkey": {"id": 2}}),
        ({"id": 1}, None, 4, before, {"__debezium.newkey": {"id": 2}}),
        ({"id": 2}, "c", 5, after, {"__debezium.oldkey": {"id": 1}})]
    assert [m[1] for m in _messages(Debezium(tombstones=False),
                                    _event("update", before, after))] == ["d", "c"]
    # the key unchanged: one update
    assert _messages(Debezium(), _event("update", before, (1, "bob"))) == [
        ({"id": 1}, "u", 4, None, {})]


def test_a_delete_is_followed_by_its_tombstone_unless_turned_off() -> None:
    """EventDispatcher: with tombstones.on.delete (Debezium's default) the delete's key with
    no value follows it."""
    delete = _event("delete", (1, "ada"), None)
    assert _messages(Debezium(), delete) == [({"id": 1}, "d", 4, None, {}),
                                             ({"id": 1}, None, 4, None, {})]
    assert _messages(Debezium(tombstones=False), delete) == [({"id": 1}, "d", 4, None, {})]


def test_values_carry_the_envelopes_connect_schema_with_value_schema() -> None:
    fmt = Debezium(source_name="srv", value_schema=True, key_schema=True)
    routed = fmt.routed_rows(_event("insert", None, (1, "ada")))
    assert len(routed) == 1
    value = json.loads(routed[0].value or b"")
    assert value["schema"] == connect_schema.envelope_schema(SHAPE, "srv", "mariadb")
    assert value["payload"]["after"] == {"id": 1, "name": "ada"}
    assert value["payload"]["op"] == "c"
    assert json.loads(routed[0].key)["schema"]["name"] == "srv.shop.t.Key"
    plain = Debezium(source_name="srv").routed_rows(_event("insert", None, (1, "ada")))
    assert "schema" not in json.loads(plain[0].value or b"")  # the default is unchanged


def _truncate(shape: TableShape | None = SHAPE) -> StatementEvent:
    return StatementEvent("shop", "t", "truncate", "TRUNCATE TABLE t", GTID, 1700000000,
                          "mysql-bin.000001", 1200, shape)


def test_truncate_is_a_change_event_only_when_asked() -> None:
    """Debezium's skipped.operations defaults to "t": no TRUNCATE event unless asked; asked,
    one op "t" event with no key, before and after null (its JDBC sink's truncate.enabled)."""
    assert Debezium().statement_rows(_truncate()) == []
    [(key, value)] = Debezium(truncate_events=True, value_schema=True).statement_rows(
        _truncate())
    assert key is None
    doc = json.loads(value)
    assert doc["schema"]["name"] == "cdcserver.shop.t.Envelope"
    payload = doc["payload"]
    assert (payload["op"], payload["before"], payload["after"]) == ("t", None, None)
    assert (payload["source"]["db"], payload["source"]["table"]) == ("shop", "t")
    alter = StatementEvent("shop", "t", "alter", "ALTER TABLE t ADD c INT", GTID, 1, "f", 1,
                           SHAPE)
    assert Debezium(truncate_events=True).statement_rows(alter) == []


def test_bigint_unsigned_is_debeziums_int64() -> None:
    """bigint.unsigned.handling.mode=long: the INT64 of the same bits, which JsonConverter
    reads (a number above 2^63-1 it refuses); the client reads it back unsigned."""
    from decimal import Decimal

    from cdcserver.messages.formats import _debezium_converter
    from mariadb_cdc_client.kafka_values import from_debezium

    layout = TableLayout("shop", "u", (ColumnDef("n", T.LONGLONG, unsigned=True),), ())
    [field] = TableSchema.from_layout(layout, 1, "").columns
    convert = _debezium_converter(field)
    assert [convert(Decimal(v)) for v in (0, 2**63 - 1, 2**63, 2**64 - 1)] == [
        0, 2**63 - 1, -(2**63), -1]
    assert from_debezium(field, -1) == Decimal(2**64 - 1)


def test_a_zero_date_in_a_not_null_column_is_the_epoch_as_in_debezium() -> None:
    """JdbcValueConverters.convertValue: no value for a required column gives its fallback,
    the epoch (a null would break the value's schema); a nullable column's is null."""
    columns = (ColumnDef("id", T.LONG, nullable=False), ColumnDef("d", T.DATE, nullable=False),
               ColumnDef("t", T.DATETIME2, 3, nullable=False),
               ColumnDef("z", T.TIMESTAMP2, 0, nullable=False), ColumnDef("n", T.DATE))
    layout = TableLayout("shop", "z", columns, (0,))
    shape = TableShape(TableName("shop", "z"), TableSchema.from_layout(layout, 1, ""), layout)
    zero = "0000-00-00"  # how the row holds a zero date
    e = RowEvent(shape, "insert", None, (1, zero, zero + " 00:00:00", zero + " 00:00:00", zero),
                 GTID, 1, 1700000000, "f", 4, 0, str(GTID))
    after = json.loads(Debezium().row_value(e))["after"]
    assert after == {"id": 1, "d": 0, "t": 0, "z": "1970-01-01T00:00:00Z", "n": None}


def test_a_json_value_is_its_records_json_byte_for_byte(monkeypatch) -> None:
    """The JSON value is written from parts made once per table (formats.Debezium.
    _json_value); it is the same bytes as the change event's record written whole, for any
    names (quotes, backslashes, characters beyond the BMP) and either flavor."""
    import orjson

    from cdcserver.messages import formats

    monkeypatch.setattr(formats.time, "time", lambda: 1700000123.4567)
    layout = TableLayout('sh"op\\', "t\U0001f600", (
        ColumnDef("id", T.LONG, nullable=False), ColumnDef('n"ame', T.VARCHAR, 80,
                                                          charset="utf8mb4")), (0,))
    shape = TableShape(TableName(layout.database, layout.table),
                       TableSchema.from_layout(layout, 1, ""), layout)
    gtid = Gtid(3, 4294967295, 12)
    for flavor, value_schema in (("mariadb", False), ("mysql", False), ("mariadb", True)):
        fmt = Debezium(source_name='s"rv', value_schema=value_schema)
        fmt.flavor = flavor
        for action, before, after, snapshot in (("insert", None, (1, "ä\U0001f600\""), ""),
                                                ("update", (1, "a"), (1, None), ""),
                                                ("delete", (1, "a"), None, ""),
                                                ("insert", None, (2, "b"), "last")):
            e = RowEvent(shape, action, before, after, gtid, 4, 1700000000,
                         'mysql-bin."000001', 900, 3, str(gtid), snapshot=snapshot)
            record = {
                "before": None if before is None else {"id": before[0], 'n"ame': before[1]},
                "after": None if after is None else {"id": after[0], 'n"ame': after[1]},
                "source": {"version": "mariadb-cdc", "connector": flavor, "name": 's"rv',
                           "ts_ms": 1700000000000, "snapshot": snapshot or "false",
                           "db": 'sh"op\\', "sequence": None, "table": "t\U0001f600",
                           "server_id": 4294967295, "gtid": "3-4294967295-12",
                           "file": 'mysql-bin."000001', "pos": 900, "row": 3,
                           "thread": None, "query": None},
                "op": "r" if snapshot else {"insert": "c", "update": "u", "delete": "d"}[action],
                "ts_ms": 1700000123456, "transaction": None}
            expected = orjson.dumps(record)
            if value_schema:  # as JsonConverter writes it with schemas.enable=true
                expected = orjson.dumps({"schema": connect_schema.envelope_schema(
                    shape, 's"rv', flavor), "payload": record})
            assert fmt.row_value(e) == expected


def test_a_geometry_without_srid_has_a_null_srid_as_in_debezium() -> None:
    """Debezium 3.6's MySQL connector sends SRID 0 as null (bench_peers --fidelity saw it);
    another SRID as it is. The client reads both back to MariaDB's value."""
    from mariadb_cdc_client.kafka_values import from_debezium

    layout = TableLayout("shop", "g", (ColumnDef("id", T.LONG, nullable=False),
                                       ColumnDef("g", T.GEOMETRY)), (0,))
    shape = TableShape(TableName("shop", "g"), TableSchema.from_layout(layout, 1, ""), layout)
    point = bytes.fromhex("0101000000000000000000f83f00000000000002c0")  # POINT(1.5 -2.25)
    for srid, expected in ((0, None), (4326, 4326)):
        value = srid.to_bytes(4, "little") + point
        e = RowEvent(shape, "insert", None, (1, value), GTID, 1, 1700000000, "f", 4, 0,
                     str(GTID))
        g = json.loads(Debezium().row_value(e))["after"]["g"]
        assert g == {"wkb": base64.b64encode(point).decode(), "srid": expected}
        assert from_debezium(shape.fields[1], g) == value


def test_a_timestamp_is_debeziums_zoned_timestamp_text_at_every_precision() -> None:
    """io.debezium.time.ZonedTimestamp: UTC, ISO 8601, as many fraction digits as the
    column has (the same text as strftime's, which the converter used before)."""
    import datetime as dt
    import random

    from cdcserver.messages.formats import _zoned_timestamp

    rng = random.Random(53)
    zones = [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)),
             dt.timezone(dt.timedelta(hours=-8))]
    for _ in range(2000):
        moment = dt.datetime.fromtimestamp(rng.randrange(0, 2**31), dt.UTC).replace(
            microsecond=rng.choice([0, 1, 999999, rng.randrange(10**6)]))
        value = moment.astimezone(rng.choice(zones))
        for fsp in range(7):
            expected = moment.strftime("%Y-%m-%dT%H:%M:%S") + (
                f".{moment.microsecond:06d}"[: fsp + 1] if fsp else "") + "Z"
            assert _zoned_timestamp(fsp)(value) == expected
    assert _zoned_timestamp(3)("0000-00-00 00:00:00") is None
