"""How a column's type maps to Avro: the type table in protocol.md, in one place (the names
and Avro types come from :mod:`mariadb_cdc_client.format.coltypes`).

The store writes each table version's schema with it (:mod:`cdcserver.store.schema`), and the
schema history compares the binlog's columns with its own by it (what must agree is what the
mapping makes of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T
from mariadb_cdc_client.format.coltypes import BY_CODE, KINDS
from mariadb_cdc_client.format.schema import Kind

# The real_type of each type logged as one SQL type (the type table's first).
_NAMES = {T(t.code): t.sql[0].real_type for t in BY_CODE.values() if t.sql}
# A BLOB's metadata (the bytes of its length) says which of the four it is.
_BLOB_NAMES = {size: (BY_CODE[t].sql[0].real_type, BY_CODE[t].sql[1].real_type)
               for size, t in enumerate((T.TINY_BLOB, T.BLOB, T.MEDIUM_BLOB, T.LONG_BLOB), 1)}
_INTS = frozenset({T.TINY, T.SHORT, T.INT24, T.LONG, T.LONGLONG})
_TEMPORAL = frozenset({T.DATE, T.TIME, T.TIME2, T.DATETIME, T.DATETIME2, T.TIMESTAMP,
                       T.TIMESTAMP2})
_TEMPORAL_KINDS = {"date": Kind.DATE, "time": Kind.TIME, "datetime": Kind.DATETIME,
                   "timestamp": Kind.TIMESTAMP}
_U64 = (20, 0)  # BIGINT UNSIGNED and BIT(64): a DECIMAL(20, 0)


@dataclass(frozen=True)
class ColumnMapping:
    kind: Kind
    branches: list[Any]  # the non-null union branches
    real_type: str
    fsp: int = 0


def _mapping(kind: Kind, real_type: str, fsp: int = 0, digits: tuple[int, int] = _U64
             ) -> ColumnMapping:
    """The kind's Avro branches from the type table (a DECIMAL's with its ``digits``:
    precision and scale)."""
    branches = [dict(b) if isinstance(b, dict) else b for b in KINDS[kind].avro]
    if kind == Kind.DECIMAL:
        branches[0].update(precision=digits[0], scale=digits[1])
    return ColumnMapping(kind, branches, real_type, fsp)


def map_column(col: ColumnDef) -> ColumnMapping:
    """The Avro type of one column (the type table in protocol.md)."""
    t, meta = T(col.binlog_type), col.meta
    if col.extended in ("inet4", "inet6"):
        return _mapping(Kind.STRING, col.extended)
    if col.extended == "uuid":
        return _mapping(Kind.UUID, "uuid")
    if col.extended == "json" or t == T.JSON:
        return _mapping(Kind.STRING, "json")
    if t in _INTS:
        if t == T.LONGLONG and col.unsigned:
            return _mapping(Kind.DECIMAL, _NAMES[t])
        wide = t == T.LONGLONG or (t == T.LONG and col.unsigned)
        return _mapping(Kind.LONG if wide else Kind.INT, _NAMES[t])
    if t == T.FLOAT:
        return _mapping(Kind.FLOAT, "float")
    if t == T.DOUBLE:
        return _mapping(Kind.DOUBLE, "double")
    if t == T.NEWDECIMAL:
        return _mapping(Kind.DECIMAL, "decimal", digits=(meta >> 8, meta & 0xFF))
    if t == T.YEAR:
        return _mapping(Kind.INT, "year")
    if t == T.BIT:
        bits = (meta >> 8) * 8 + (meta & 0xFF)
        if bits == 1:
            return _mapping(Kind.BOOLEAN, "bit")
        return _mapping(Kind.LONG if bits < 64 else Kind.DECIMAL, "bit")
    if t in _TEMPORAL:
        # TIME2/DATETIME2/TIMESTAMP2 carry their precision; the old types get it from the
        # schema history (0 until then).
        return _mapping(_TEMPORAL_KINDS[_NAMES[t]], _NAMES[t], meta if t != T.DATE else 0)
    if t in (T.ENUM, T.SET):
        return _mapping(Kind.STRING, _NAMES[t])
    if t == T.GEOMETRY:
        return _mapping(Kind.BYTES, "geometry")
    if t in (T.VARCHAR, T.VAR_STRING, T.STRING):
        binary = col.charset is None
        name = ("binary" if binary else "char") if t == T.STRING else (
            "varbinary" if binary else "varchar")
        return _mapping(Kind.BYTES if binary else Kind.STRING, name)
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB):
        binary = col.charset is None
        name = _BLOB_NAMES.get(meta, ("blob", "text"))[0 if binary else 1]
        return _mapping(Kind.BYTES if binary else Kind.STRING, name)
    if t == T.NULL:
        return _mapping(Kind.NULL, "null")
    raise ValueError(f"column {col.name!r}: no Avro mapping for binlog type {t.name}")
