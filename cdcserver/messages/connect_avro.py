"""The Avro side of the ``debezium`` format: the Kafka Connect schema of Debezium's envelope
for a table, and that schema as Avro the way Confluent's ``AvroConverter`` (its ``AvroData``)
writes it, which is what a Debezium connector configured with that converter registers.

The Connect schema follows Debezium's MySQL connector with ``decimal.handling.mode=string``
(as the JSON values do): the envelope ``<prefix>.<db>.<table>.Envelope`` (version 1) with
optional ``before``/``after`` of ``<prefix>.<db>.<table>.Value``, the
``io.debezium.connector.mysql.Source`` block, the optional ``event.block`` transaction, ``op``
and ``ts_ms``. The column types (:func:`connect_type`) are also those of the JSON keys'
schemas (``key_schema``); a geometry is Debezium's ``io.debezium.data.geometry.Geometry``
struct. Every column but the primary key's is optional, NOT NULL ones too
(where Debezium makes them required): a zero date is written as null, and a row logged
before an ADD COLUMN may be read with the new column as null.

``AvroData``'s rules applied here: a struct is a record named by its Connect name (split at the
last dot into namespace and name), with ``connect.name``, ``connect.version`` and
``connect.parameters`` properties; ``int8``/``int16`` are Avro ``int`` with ``connect.type``;
an optional field is the union ``["null", T]`` with default null (``[T, "null"]`` with the
Connect default when it has one, also kept as ``connect.default``); a record met again is
referred to by its full name. Names Avro does not allow are adjusted as Debezium's
``field.name.adjustment.mode=avro`` does: each character outside ``[A-Za-z0-9_]`` becomes
``_``, and a leading digit gets a ``_`` before it.
"""

from __future__ import annotations

import re
from typing import Any

from cdcserver.messages.events import TableShape
from mariadb_cdc_client.format.schema import Field, Kind

ConnectSchema = dict[str, Any]  # a Connect schema as Kafka Connect's JsonConverter writes it

_ILLEGAL = re.compile(r"[^A-Za-z0-9_]")


def avro_name(name: str) -> str:
    """``name`` as an Avro name (Debezium's ``avro`` adjustment)."""
    name = _ILLEGAL.sub("_", name) or "_"
    return "_" + name if name[0].isdigit() else name


def _full_name(name: str) -> str:
    return ".".join(avro_name(part) for part in name.split("."))


# The Connect types of Debezium's MySQL connector's default modes, with
# decimal.handling.mode=string (as the JSON values are).
_CONNECT_INTS = {"tinyint": "int16", "smallint": "int16", "mediumint": "int32",
                 "int": "int32", "year": "int32", "bigint": "int64", "bit": "int64"}
_CONNECT_NAMES = {Kind.DATE: ("int32", "io.debezium.time.Date"),
                  Kind.TIME: ("int64", "io.debezium.time.MicroTime"),
                  Kind.TIMESTAMP: ("string", "io.debezium.time.ZonedTimestamp")}


def connect_type(f: Field, unsigned: bool) -> dict[str, Any]:
    kind = f.kind
    if kind in (Kind.INT, Kind.LONG):
        t = _CONNECT_INTS.get(f.real_type, "int64")
        if unsigned and t != "int64":  # an unsigned column takes the next wider type
            t = {"int16": "int32", "int32": "int64"}[t]
        return {"type": t}
    if kind == Kind.DECIMAL:
        return {"type": "int64"} if f.real_type in ("bigint", "bit") else {"type": "string"}
    if kind == Kind.DATETIME:
        return {"type": "int64", "name": "io.debezium.time.Timestamp" if f.fsp <= 3
                else "io.debezium.time.MicroTimestamp"}
    if kind in _CONNECT_NAMES:
        t, name = _CONNECT_NAMES[kind]
        return {"type": t, "name": name}
    simple = {Kind.BOOLEAN: "boolean", Kind.FLOAT: "float32", Kind.DOUBLE: "float64",
              Kind.BYTES: "bytes"}
    return {"type": simple.get(kind, "string")}


def connect_key_schema(shape: TableShape, name: str) -> dict[str, Any]:
    columns = shape.primary_key or tuple(range(len(shape.fields)))
    fields = [{**connect_type(shape.fields[i], shape.layout.columns[i].unsigned),
               "optional": not shape.primary_key, "field": shape.fields[i].column}
              for i in columns]
    return {"type": "struct", "fields": fields, "optional": False, "name": name}



_SOURCE_FIELDS: list[ConnectSchema] = [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
     "parameters": {"allowed": "true,last,false,incremental"}, "default": "false",
     "field": "snapshot"},
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "string", "optional": True, "field": "table"},
    {"type": "int64", "optional": False, "field": "server_id"},
    {"type": "string", "optional": True, "field": "gtid"},
    {"type": "string", "optional": False, "field": "file"},
    {"type": "int64", "optional": False, "field": "pos"},
    {"type": "int32", "optional": False, "field": "row"},
    {"type": "int64", "optional": True, "field": "thread"},
    {"type": "string", "optional": True, "field": "query"},
]
SOURCE: ConnectSchema = {"type": "struct", "fields": _SOURCE_FIELDS, "optional": False,
                         "name": "io.debezium.connector.mysql.Source"}
TRANSACTION: ConnectSchema = {"type": "struct", "optional": True, "name": "event.block",
                              "version": 1, "fields": [
                                  {"type": "string", "optional": False, "field": "id"},
                                  {"type": "int64", "optional": False, "field": "total_order"},
                                  {"type": "int64", "optional": False,
                                   "field": "data_collection_order"}]}
GEOMETRY_FIELDS: list[ConnectSchema] = [
    {"type": "bytes", "optional": False, "field": "wkb"},
    {"type": "int32", "optional": True, "field": "srid"}]


def column_schemas(shape: TableShape) -> list[ConnectSchema]:
    """The Connect schema of each column's value, as the ``Value`` struct's fields."""
    fields = []
    key = set(shape.primary_key)
    for i, f in enumerate(shape.fields):
        optional = i not in key
        if f.real_type == "geometry":
            schema: ConnectSchema = {"type": "struct", "fields": GEOMETRY_FIELDS,
                                     "name": "io.debezium.data.geometry.Geometry",
                                     "version": 1}
        else:
            schema = connect_type(f, shape.layout.columns[i].unsigned)
            if "name" in schema:
                schema = {**schema, "version": 1}
        fields.append({**schema, "optional": optional, "field": f.column})
    return fields


def envelope_schema(shape: TableShape, prefix: str) -> ConnectSchema:
    """The Connect schema of the table's Debezium change events (``prefix``: the topic prefix,
    Debezium's ``topic.prefix``, the ``source.name`` of the events)."""
    name = f"{prefix}.{shape.table.database}.{shape.table.table}"
    value = {"type": "struct", "fields": column_schemas(shape), "optional": True,
             "name": f"{name}.Value"}
    return {"type": "struct", "optional": False, "name": f"{name}.Envelope", "version": 1,
            "fields": [{**value, "field": "before"}, {**value, "field": "after"},
                       {**SOURCE, "field": "source"},
                       {**TRANSACTION, "field": "transaction"},
                       {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"}]}


def key_schema(shape: TableShape, prefix: str) -> ConnectSchema:
    """The Connect schema of the table's keys (``<prefix>.<db>.<table>.Key``: the primary
    key's columns, or every column, optional, for a table without one)."""
    return connect_key_schema(shape, f"{prefix}.{shape.table.database}.{shape.table.table}"
                                      ".Key")


def key_names(shape: TableShape) -> tuple[str, ...]:
    """The Avro names of the key's fields."""
    return tuple(avro_name(shape.fields[i].column)
                 for i in shape.primary_key or range(len(shape.fields)))


_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
               "float32": "float", "float64": "double", "boolean": "boolean",
               "string": "string", "bytes": "bytes"}
_CONNECT_ONLY = ("int8", "int16")  # Connect types Avro has no own type for
_FIELD_KEYS = ("field", "optional", "default")


def to_avro(schema: ConnectSchema) -> dict[str, Any]:
    """``schema`` (a struct) as Avro, as Confluent's ``AvroData.fromConnectSchema`` makes it
    with its defaults (``connect.meta.data`` on, no enhanced Avro schema support)."""
    avro = _avro(schema, set())
    assert isinstance(avro, dict)
    return avro


def _avro(schema: ConnectSchema, named: set[str]) -> Any:
    t = schema["type"]
    if t == "struct":
        full = _full_name(schema["name"])
        if full in named:
            return full
        named.add(full)
        namespace, _, name = full.rpartition(".")
        avro: dict[str, Any] = {"type": "record", "name": name}
        if namespace:
            avro["namespace"] = namespace
        avro["fields"] = [_field(f, named) for f in schema["fields"]]
    elif t in _PRIMITIVES:
        avro = {"type": _PRIMITIVES[t]}
        if t in _CONNECT_ONLY:
            avro["connect.type"] = t
    else:
        raise ValueError(f"no Avro type for the Connect type {t!r}")
    if "version" in schema:
        avro["connect.version"] = schema["version"]
    if "parameters" in schema:
        avro["connect.parameters"] = schema["parameters"]
    if "default" in schema:
        avro["connect.default"] = schema["default"]
    if "name" in schema:
        avro["connect.name"] = schema["name"]
    if t != "struct" and len(avro) == 1:
        return avro["type"]  # a bare primitive: its name alone, as AvroData writes it
    return avro


def _field(schema: ConnectSchema, named: set[str]) -> dict[str, Any]:
    avro = _avro({k: v for k, v in schema.items() if k not in _FIELD_KEYS} |
                 ({"default": schema["default"]} if "default" in schema else {}), named)
    field: dict[str, Any] = {"name": avro_name(schema["field"])}
    if not schema.get("optional"):
        field["type"] = avro
        if "default" in schema:
            field["default"] = schema["default"]
    elif schema.get("default") is not None:
        field["type"] = [avro, "null"]
        field["default"] = schema["default"]
    else:
        field["type"] = ["null", avro]
        field["default"] = None
    return field
