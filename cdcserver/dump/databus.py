"""A dump in mysql-databus's layout (seed 001): every line a ``RowsEvent``.

The seed's dump is "JSON row operations", each line one ``RowsEvent`` a Go consumer decodes
with the same structs as the Kafka messages: ``{"Table": schema.Table, "Action": "insert",
"Rows": [[base64 values]]}``. A ``cdc-dump/1`` file already holds one operation per line with
base64 values, so the databus layout is made from it when a client asks for it
(``REQUEST-DUMP ... DATABUS``): its header line goes (the position is in ``LIST-DUMPS``), each
operation gets the table as the databus Kafka format describes it, and values take that
format's text too (ENUM as its index, SET as its bitmask), so that a dump and the Kafka
messages after it say the same thing the same way.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import orjson

from cdcserver.core.names import TableName
from cdcserver.messages.databus import Databus
from cdcserver.messages.events import TableShape
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.layouts import layout_of
from cdcserver.store.schema import TableSchema


class NoDefinition(ValueError):
    """The dump was taken before dumps recorded their table's definition."""


def databus_lines(f: BinaryIO, labels: bool = False) -> Iterator[bytes]:
    """The lines of the dump open in ``f`` (at its start), in the databus layout; ENUM and
    SET values as their labels with ``labels`` (the Kafka sink's ``databus_labels``)."""
    header = orjson.loads(f.readline())
    if "definition" not in header:
        raise NoDefinition("this dump was taken by an older version and does not record its "
                           "table's definition; take a new dump for the databus layout")
    table = TableName(header["database"], header["table"])
    layout = layout_of(table, TableDefinition.from_json(header["definition"]))
    shape = TableShape(table, TableSchema.from_layout(layout, 1, ""), layout)
    databus = Databus(labels=labels)
    prefix = b'{"Table":' + databus.table_json(shape) + b',"Action":"'
    recoders = _recoders(shape, databus)
    for line in f:
        if not line.strip():
            continue
        operation = orjson.loads(line)
        rows = operation["rows"]
        if recoders:
            rows = [_recoded(row, recoders) for row in rows]
        yield (prefix + operation["action"].encode() + b'","Rows":' + orjson.dumps(rows) +
               b"}\n")


def write_databus(f: BinaryIO, out: BinaryIO, labels: bool = False) -> int:
    """Write the databus layout of the dump in ``f`` to ``out``; the number of bytes."""
    size = 0
    for line in databus_lines(f, labels):
        out.write(line)
        size += len(line)
    out.flush()
    return size


Recoder = Callable[[str], str]


def _recoders(shape: TableShape, databus: Databus) -> dict[int, Recoder]:
    """For each column whose databus text differs from the dump's (ENUM, SET): a function
    from the dump's base64 value to the databus one."""
    encoders = databus.value_encoders(shape)
    return {i: _recoder(encoders[i]) for i, f in enumerate(shape.fields)
            if f.real_type in ("enum", "set")}


def _recoder(encode: Callable[[Any], bytes]) -> Recoder:
    def recode(value: str) -> str:
        text = binascii.a2b_base64(value).decode("utf-8")
        return binascii.b2a_base64(encode(text), newline=False).decode("ascii")
    return recode


def _recoded(row: list[str | None], recoders: dict[int, Recoder]) -> list[str | None]:
    return [recoders[i](v) if v is not None and i in recoders else v
            for i, v in enumerate(row)]
