"""The Avro side of the ``debezium`` format: the Kafka Connect schemas of Debezium's envelope
and key (:mod:`cdcserver.messages.connect_schema`, the one place they are made) as Avro, the way
Confluent's ``AvroConverter`` (its ``AvroData``) writes them, which is what a Debezium connector
configured with that converter registers.

``AvroData``'s rules applied here: a struct is a record named by its Connect name (split at the
last dot into namespace and name), with ``connect.name``, ``connect.version``,
``connect.parameters`` and ``connect.doc`` properties; ``int8``/``int16`` are Avro ``int`` with
``connect.type``; an optional field is the union ``["null", T]`` with default null
(``[T, "null"]`` with the Connect default when it has one, also kept as ``connect.default``); a
record met again is referred to by its full name. Names Avro does not allow are adjusted as
Debezium's ``field.name.adjustment.mode=avro`` does: each character outside ``[A-Za-z0-9_]``
becomes ``_``, and a leading digit gets a ``_`` before it.

One difference from the Connect schema: every column but the primary key's is optional in the
``Value`` record, NOT NULL ones too (where Debezium makes them required), since a row logged
before an ``ADD COLUMN ... NOT NULL`` is read with the new column as null, which a required
Avro field cannot encode.
"""

from __future__ import annotations

import re
from typing import Any

from cdcserver.messages import connect_schema
from cdcserver.messages.events import TableShape

ConnectSchema = dict[str, Any]  # a Connect schema as Kafka Connect's JsonConverter writes it

_ILLEGAL = re.compile(r"[^A-Za-z0-9_]")


def avro_name(name: str) -> str:
    """``name`` as an Avro name (Debezium's ``avro`` adjustment)."""
    name = _ILLEGAL.sub("_", name) or "_"
    return "_" + name if name[0].isdigit() else name


def _full_name(name: str) -> str:
    return ".".join(avro_name(part) for part in name.split("."))


def envelope_schema(shape: TableShape, prefix: str, flavor: str) -> dict[str, Any]:
    """The Avro schema of the table's change events (``prefix``: Debezium's ``topic.prefix``,
    the events' ``source.name``; ``flavor``: ``mariadb`` or ``mysql``)."""
    envelope = connect_schema.envelope_schema(shape, prefix, flavor)
    key = {shape.fields[i].column for i in shape.primary_key}
    for side in envelope["fields"][:2]:  # before, after: the Value struct
        assert side["field"] in ("before", "after")
        side["fields"] = [f if f["field"] in key else {**f, "optional": True}
                          for f in side["fields"]]
    return to_avro(envelope)


def key_schema(shape: TableShape, prefix: str) -> dict[str, Any]:
    """The Avro schema of the table's keys (``<prefix>.<db>.<table>.Key``)."""
    return to_avro(connect_schema.key_schema(shape, prefix))


def key_names(shape: TableShape) -> tuple[str, ...]:
    """The Avro names of the key's fields."""
    return tuple(avro_name(shape.fields[i].column)
                 for i in shape.primary_key or range(len(shape.fields)))


_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
               "float": "float", "double": "double", "boolean": "boolean",
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
    if "doc" in schema:
        avro["connect.doc"] = schema["doc"]
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
