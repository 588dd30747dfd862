"""Kafka Connect schemas of the ``debezium`` format's messages, as Debezium's MySQL and MariaDB
connectors (3.6) define them, in the JSON form Kafka Connect's ``JsonConverter`` writes with
``schemas.enable=true`` (``{"type": "struct", "fields": [...], "optional": ..., "name": ...}``).

The one place these schemas are made: the ``debezium`` format's JSON messages carry them
(``[kafka] key_schema`` and ``value_schema``), and an Avro value is derived from them as
Debezium's AvroConverter derives it from the Connect schema.

API (each returns a fresh dict, JSON-ready):

- :func:`column_schema` ``(field, column)``: one column's Connect schema (no ``field`` or
  ``optional``), Debezium's type and semantic name (``io.debezium.time.Date``...).
- :func:`value_schema` ``(shape, source_name)``: the row struct ``<source>.<db>.<table>.Value``
  (optional), of ``before`` and ``after``.
- :func:`key_schema` ``(shape, source_name)``: the key struct ``<source>.<db>.<table>.Key``,
  of the primary key's columns (every column, optional, for a table without one).
- :func:`source_schema` ``(flavor)``: ``io.debezium.connector.<flavor>.Source``.
- :func:`envelope_schema` ``(shape, source_name, flavor)``: the whole value,
  ``<source>.<db>.<table>.Envelope`` version 2: ``before``, ``after``, ``source``, ``op``,
  ``ts_ms``, ``ts_us``, ``ts_ns``, ``transaction``.
- :data:`SCHEMA_CHANGE_KEY`: the key of a schema change event.

``flavor`` is ``mariadb`` or ``mysql`` (Debezium's connector name). The mapping is Debezium's
with its connectors' default modes (``time.precision.mode=adaptive_time_microseconds``,
``bigint.unsigned.handling.mode=long``, ``binary.handling.mode=bytes``) but
``decimal.handling.mode=string``, as the format's values are: DECIMAL is a plain string.
"""

from __future__ import annotations

from typing import Any

from cdcserver.core.changes import ColumnDef
from cdcserver.messages.events import TableShape
from mariadb_cdc_client.format.schema import Field, Kind

# Debezium's TINYINT is INT16 signed or not (the JDBC type's); SMALLINT UNSIGNED and INT
# UNSIGNED take the next wider type (BinlogValueConverters.schemaBuilder).
_INTS = {"tinyint": "int16", "smallint": "int16", "mediumint": "int32", "int": "int32",
         "bigint": "int64"}
_WIDER_UNSIGNED = {"smallint": "int32", "int": "int64"}
_SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false," \
                   "incremental"
SCHEMA_CHANGE_KEY: dict[str, Any] = {
    "type": "struct", "fields": [{"type": "string", "optional": False, "field": "databaseName"}],
    "optional": False, "name": "io.debezium.connector.mysql.SchemaChangeKey"}


def _names(values: tuple[str, ...]) -> str:
    return ",".join(values)


def column_schema(f: Field, column: ColumnDef) -> dict[str, Any]:
    """One column's Connect schema, as Debezium's binlog connectors type it."""
    kind, real = f.kind, f.real_type
    if real == "year":
        return {"type": "int32", "name": "io.debezium.time.Year", "version": 1}
    if real == "json":
        return {"type": "string", "name": "io.debezium.data.Json", "version": 1}
    if real == "enum":
        return {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": _names(column.enum_values)}}
    if real == "set":
        return {"type": "string", "name": "io.debezium.data.EnumSet", "version": 1,
                "parameters": {"allowed": _names(column.set_values)}}
    if real == "geometry":
        return {"type": "struct", "fields": [
            {"type": "bytes", "optional": False, "field": "wkb"},
            {"type": "int32", "optional": True, "field": "srid"}],
            "name": "io.debezium.data.geometry.Geometry", "version": 1,
            "doc": "Geometry"}
    if kind in (Kind.INT, Kind.LONG) and real in _INTS:
        if column.unsigned and real in _WIDER_UNSIGNED:
            return {"type": _WIDER_UNSIGNED[real]}
        return {"type": _INTS[real]}
    if kind == Kind.DECIMAL:  # BIGINT UNSIGNED and BIT(64) as long; DECIMAL as a string
        return {"type": "int64"} if real in ("bigint", "bit") else {"type": "string"}
    if kind == Kind.DATE:
        return {"type": "int32", "name": "io.debezium.time.Date", "version": 1}
    if kind == Kind.TIME:
        return {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1}
    if kind == Kind.DATETIME:
        if f.fsp <= 3:
            return {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1}
        return {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}
    if kind == Kind.TIMESTAMP:
        return {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}
    # JsonConverter's names of FLOAT32 and FLOAT64 (JsonSchema.FLOAT_TYPE_NAME and
    # DOUBLE_TYPE_NAME): it refuses a schema saying "float32" ("Unknown schema type")
    simple = {Kind.BOOLEAN: "boolean", Kind.FLOAT: "float", Kind.DOUBLE: "double",
              Kind.BYTES: "bytes", Kind.INT: "int32", Kind.LONG: "int64"}
    return {"type": simple.get(kind, "string")}


def _field(shape: TableShape, i: int, optional: bool) -> dict[str, Any]:
    f = shape.fields[i]
    return {**column_schema(f, shape.layout.columns[i]), "optional": optional,
            "field": f.column}


def _prefix(shape: TableShape, source_name: str) -> str:
    return f"{source_name}.{shape.table.database}.{shape.table.table}"


def value_schema(shape: TableShape, source_name: str) -> dict[str, Any]:
    """The row struct of ``before`` and ``after``: each column optional when nullable."""
    fields = [_field(shape, i, shape.layout.columns[i].nullable)
              for i in range(len(shape.fields))]
    return {"type": "struct", "fields": fields, "optional": True,
            "name": _prefix(shape, source_name) + ".Value"}


def key_schema(shape: TableShape, source_name: str) -> dict[str, Any]:
    """The key struct: the primary key's columns (a table without one: every column, as the
    format keys it, optional)."""
    pk = shape.primary_key
    columns = pk or tuple(range(len(shape.fields)))
    return {"type": "struct", "fields": [_field(shape, i, not pk) for i in columns],
            "optional": False, "name": _prefix(shape, source_name) + ".Key"}


def source_schema(flavor: str) -> dict[str, Any]:
    """``source``: AbstractSourceInfo's common fields, then BinlogSourceInfoStructMaker's."""
    def f(name: str, type_: str, optional: bool = False) -> dict[str, Any]:
        return {"type": type_, "optional": optional, "field": name}

    return {"type": "struct", "fields": [
        f("version", "string"), f("connector", "string"), f("name", "string"),
        f("ts_ms", "int64"),
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
         "parameters": {"allowed": _SNAPSHOT_VALUES}, "default": "false", "field": "snapshot"},
        f("db", "string"), f("sequence", "string", True), f("ts_us", "int64", True),
        f("ts_ns", "int64", True), f("table", "string", True), f("server_id", "int64"),
        f("gtid", "string", True), f("file", "string"), f("pos", "int64"), f("row", "int32"),
        f("thread", "int64", True), f("query", "string", True)],
        "optional": False, "name": f"io.debezium.connector.{flavor}.Source", "version": 1}


_TRANSACTION = {"type": "struct", "fields": [
    {"type": "string", "optional": False, "field": "id"},
    {"type": "int64", "optional": False, "field": "total_order"},
    {"type": "int64", "optional": False, "field": "data_collection_order"}],
    "optional": True, "name": "event.block", "version": 1}


def envelope_schema(shape: TableShape, source_name: str, flavor: str) -> dict[str, Any]:
    """The change event's value: Envelope's fields in the order Debezium builds them."""
    row = value_schema(shape, source_name)
    return {"type": "struct", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {**source_schema(flavor), "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
        {**_TRANSACTION, "field": "transaction"}],
        "optional": False, "name": _prefix(shape, source_name) + ".Envelope", "version": 2}
