"""The Kafka Connect schemas of the debezium format (cdcserver/messages/connect_schema.py),
checked against what Debezium 3.6's binlog connectors build (BinlogValueConverters,
SchemaFactory, BinlogSourceInfoStructMaker, Envelope)."""

from __future__ import annotations

from typing import Any

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.messages import connect_schema
from cdcserver.messages.events import TableShape
from cdcserver.store.schema import TableSchema


def _shape(*columns: ColumnDef, pk: tuple[int, ...] = (0,)) -> TableShape:
    layout = TableLayout("shop", "t", columns, pk)
    return TableShape(TableName("shop", "t"), TableSchema.from_layout(layout, 1, ""), layout)


def _types(schema: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {f["field"]: (f["type"], f.get("name"), f["optional"], f.get("parameters"))
            for f in schema["fields"]}


def test_columns_take_debeziums_types_and_semantic_names() -> None:
    shape = _shape(
        ColumnDef("id", T.LONG, nullable=False), ColumnDef("u64", T.LONGLONG, unsigned=True),
        ColumnDef("price", T.NEWDECIMAL, (10 << 8) | 2),
        ColumnDef("name", T.VARCHAR, 400, charset="utf8mb4"), ColumnDef("day", T.DATE),
        ColumnDef("ms", T.DATETIME2, 3), ColumnDef("us", T.DATETIME2, 6),
        ColumnDef("at", T.TIMESTAMP2, 0), ColumnDef("span", T.TIME2, 0),
        ColumnDef("raw", T.BLOB, 2), ColumnDef("e", T.ENUM, enum_values=("a", "b")),
        ColumnDef("y", T.YEAR), ColumnDef("u8", T.TINY, unsigned=True),
        ColumnDef("u16", T.SHORT, unsigned=True), ColumnDef("u24", T.INT24, unsigned=True),
        ColumnDef("u32", T.LONG, unsigned=True), ColumnDef("f", T.FLOAT),
        ColumnDef("d", T.DOUBLE), ColumnDef("flag", T.BIT, 1))
    assert _types(connect_schema.value_schema(shape, "srv")) == {
        "id": ("int32", None, False, None),
        "u64": ("int64", None, True, None),  # bigint.unsigned.handling.mode=long
        "price": ("string", None, True, None),  # decimal.handling.mode=string
        "name": ("string", None, True, None),
        "day": ("int32", "io.debezium.time.Date", True, None),
        "ms": ("int64", "io.debezium.time.Timestamp", True, None),
        "us": ("int64", "io.debezium.time.MicroTimestamp", True, None),
        "at": ("string", "io.debezium.time.ZonedTimestamp", True, None),
        "span": ("int64", "io.debezium.time.MicroTime", True, None),
        "raw": ("bytes", None, True, None),
        "e": ("string", "io.debezium.data.Enum", True, {"allowed": "a,b"}),
        "y": ("int32", "io.debezium.time.Year", True, None),
        # TINYINT is INT16 signed or not, MEDIUMINT INT32; SMALLINT and INT UNSIGNED wider
        "u8": ("int16", None, True, None), "u16": ("int32", None, True, None),
        "u24": ("int32", None, True, None), "u32": ("int64", None, True, None),
        # FLOAT32 and FLOAT64 by the names JsonConverter writes and reads (Debezium's
        # messages say so; "float32" is refused: "Unknown schema type")
        "f": ("float", None, True, None), "d": ("double", None, True, None),
        "flag": ("boolean", None, True, None)}


def test_the_envelope_is_debeziums() -> None:
    shape = _shape(ColumnDef("id", T.LONG, nullable=False),
                   ColumnDef("name", T.VARCHAR, 40, charset="utf8mb4"))
    envelope = connect_schema.envelope_schema(shape, "srv", "mariadb")
    assert (envelope["name"], envelope["version"], envelope["optional"]) == (
        "srv.shop.t.Envelope", 2, False)
    fields = {f["field"]: f for f in envelope["fields"]}
    assert list(fields) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns",
                            "transaction"]
    assert fields["before"] == {**connect_schema.value_schema(shape, "srv"), "field": "before"}
    assert fields["after"]["name"] == "srv.shop.t.Value" and fields["after"]["optional"]
    assert (fields["op"]["type"], fields["op"]["optional"]) == ("string", False)
    source = fields["source"]
    assert source["name"] == "io.debezium.connector.mariadb.Source" and not source["optional"]
    assert [(f["field"], f["type"], f["optional"]) for f in source["fields"]] == [
        ("version", "string", False), ("connector", "string", False), ("name", "string", False),
        ("ts_ms", "int64", False), ("snapshot", "string", True), ("db", "string", False),
        ("sequence", "string", True), ("ts_us", "int64", True), ("ts_ns", "int64", True),
        ("table", "string", True), ("server_id", "int64", False), ("gtid", "string", True),
        ("file", "string", False), ("pos", "int64", False), ("row", "int32", False),
        ("thread", "int64", True), ("query", "string", True)]
    assert connect_schema.source_schema("mysql")["name"] == "io.debezium.connector.mysql.Source"
    assert fields["transaction"]["name"] == "event.block" and fields["transaction"]["optional"]


def test_the_key_is_the_primary_key_or_every_column() -> None:
    columns = (ColumnDef("a", T.LONG, nullable=False), ColumnDef("b", T.DATE, nullable=False))
    assert connect_schema.key_schema(_shape(*columns, pk=(1,)), "srv") == {
        "type": "struct", "fields": [{"type": "int32", "name": "io.debezium.time.Date",
                                      "version": 1, "optional": False, "field": "b"}],
        "optional": False, "name": "srv.shop.t.Key"}
    whole = connect_schema.key_schema(_shape(*columns, pk=()), "srv")
    assert [(f["field"], f["optional"]) for f in whole["fields"]] == [("a", True), ("b", True)]
