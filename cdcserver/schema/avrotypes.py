"""How a column's type maps to Avro: the type table in protocol.md, in one place.

The store writes each table version's schema with it (:mod:`cdcserver.store.schema`), and the
schema history compares the binlog's columns with its own by it (what must agree is what the
mapping makes of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T
from mariadb_cdc_client.format.schema import Kind

_INT_NAMES = {T.TINY: "tinyint", T.SHORT: "smallint", T.INT24: "mediumint", T.LONG: "int",
              T.LONGLONG: "bigint"}
_BLOB_NAMES = {1: ("tinyblob", "tinytext"), 2: ("blob", "text"), 3: ("mediumblob", "mediumtext"),
               4: ("longblob", "longtext")}
_TEMPORAL = {T.DATE: "date", T.TIME: "time", T.TIME2: "time", T.DATETIME: "datetime",
             T.DATETIME2: "datetime", T.TIMESTAMP: "timestamp", T.TIMESTAMP2: "timestamp"}


def _decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


_U64 = _decimal(20, 0)


@dataclass(frozen=True)
class ColumnMapping:
    kind: Kind
    branches: list[Any]  # the non-null union branches
    real_type: str
    fsp: int = 0


def map_column(col: ColumnDef) -> ColumnMapping:
    """The Avro type of one column (the type table in protocol.md)."""
    t, meta = T(col.binlog_type), col.meta
    if col.extended in ("inet4", "inet6"):
        return ColumnMapping(Kind.STRING, ["string"], col.extended)
    if col.extended == "uuid":
        return ColumnMapping(Kind.UUID, [{"type": "string", "logicalType": "uuid"}], "uuid")
    if col.extended == "json" or t == T.JSON:
        return ColumnMapping(Kind.STRING, ["string"], "json")
    if t in _INT_NAMES:
        name = _INT_NAMES[t]
        if t == T.LONGLONG and col.unsigned:
            return ColumnMapping(Kind.DECIMAL, [_U64], name)
        wide = t == T.LONGLONG or (t == T.LONG and col.unsigned)
        return ColumnMapping(Kind.LONG if wide else Kind.INT, ["long" if wide else "int"], name)
    if t == T.FLOAT:
        return ColumnMapping(Kind.FLOAT, ["float"], "float")
    if t == T.DOUBLE:
        return ColumnMapping(Kind.DOUBLE, ["double"], "double")
    if t == T.NEWDECIMAL:
        return ColumnMapping(Kind.DECIMAL, [_decimal(meta >> 8, meta & 0xFF)], "decimal")
    if t == T.YEAR:
        return ColumnMapping(Kind.INT, ["int"], "year")
    if t == T.BIT:
        bits = (meta >> 8) * 8 + (meta & 0xFF)
        if bits == 1:
            return ColumnMapping(Kind.BOOLEAN, ["boolean"], "bit")
        if bits < 64:
            return ColumnMapping(Kind.LONG, ["long"], "bit")
        return ColumnMapping(Kind.DECIMAL, [_U64], "bit")
    if t in _TEMPORAL:
        return _temporal(t, meta)
    if t in (T.ENUM, T.SET):
        return ColumnMapping(Kind.STRING, ["string"], "enum" if t == T.ENUM else "set")
    if t == T.GEOMETRY:
        return ColumnMapping(Kind.BYTES, ["bytes"], "geometry")
    if t in (T.VARCHAR, T.VAR_STRING, T.STRING):
        binary = col.charset is None
        name = ("binary" if binary else "char") if t == T.STRING else (
            "varbinary" if binary else "varchar")
        return ColumnMapping(Kind.BYTES if binary else Kind.STRING,
                             ["bytes" if binary else "string"], name)
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB):
        binary = col.charset is None
        name = _BLOB_NAMES.get(meta, ("blob", "text"))[0 if binary else 1]
        return ColumnMapping(Kind.BYTES if binary else Kind.STRING,
                             ["bytes" if binary else "string"], name)
    if t == T.NULL:
        return ColumnMapping(Kind.NULL, [], "null")
    raise ValueError(f"column {col.name!r}: no Avro mapping for binlog type {t.name}")


def _temporal(t: T, meta: int) -> ColumnMapping:
    # TIME2/DATETIME2/TIMESTAMP2 carry their precision; the old types get it from the
    # schema history (0 until then).
    fsp = meta if t != T.DATE else 0
    name = _TEMPORAL[t]
    if name == "date":
        return ColumnMapping(Kind.DATE, [{"type": "int", "logicalType": "date"}, "string"], name)
    logical = {"time": "time-micros", "datetime": "local-timestamp-micros",
               "timestamp": "timestamp-micros"}[name]
    kind = {"time": Kind.TIME, "datetime": Kind.DATETIME, "timestamp": Kind.TIMESTAMP}[name]
    return ColumnMapping(kind, [{"type": "long", "logicalType": logical}, "string"], name, fsp)
