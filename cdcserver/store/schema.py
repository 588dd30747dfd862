"""Avro schemas for table versions, in MaxScale's ``.avsc`` layout.

Top-level keys in MaxScale's order (``namespace, type, name, table, database, version, gtid,
fields``; gomaxscale matches on the prefix ``{"namespace":``), the six metadata fields, then one
``["null", T]`` union per column with MaxScale's ``real_type``/``length``/``unsigned``
attributes. Where MaxScale was lossy the types are exact (``protocol.md``, "Type mapping"):
``sequence`` and ``timestamp`` are ``long``, DECIMAL and BIGINT UNSIGNED are Avro decimals,
temporal columns use Avro's logical types with a ``string`` branch for the values those cannot
hold (zero dates, TIME outside 0..24h), BIT and ENUM/SET are supported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.store.naming import TableName
from mariadb_cdc_client.format.schema import (
    EVENT_TYPES,
    METADATA_FIELDS,
    Field,
    Kind,
    fields_from_schema,
)

NAMESPACE = "MaxScaleChangeDataSchema.avro"
_RESERVED = {name.lower() for name in METADATA_FIELDS}
_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_]")

METADATA_AVRO: list[dict[str, Any]] = [
    {"name": "domain", "type": "int"},
    {"name": "server_id", "type": "int"},
    {"name": "sequence", "type": "long"},
    {"name": "event_number", "type": "int"},
    {"name": "timestamp", "type": "long"},
    {"name": "event_type",
     "type": {"type": "enum", "name": "EVENT_TYPES", "symbols": list(EVENT_TYPES)}},
]

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


def field_names(columns: tuple[ColumnDef, ...]) -> list[str]:
    """Avro field names: invalid characters become ``_`` and a name clashing with a metadata
    field gets ``_`` appended (MaxScale's avro_sanitizer / fix_reserved_word); any remaining
    duplicate gets a numeric suffix."""
    taken = set(_RESERVED)
    names = []
    for col in columns:
        name = _INVALID_NAME_CHARS.sub("_", col.name) or "_"
        if name[0].isdigit():
            name = "_" + name
        if name.lower() in _RESERVED:
            name += "_"
        base, n = name, 1
        while name.lower() in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name.lower())
        names.append(name)
    return names


@dataclass(frozen=True)
class TableSchema:
    """One table version's schema: the ``.avsc`` document and its fields."""

    table: TableName
    version: int
    avsc: dict[str, Any]
    fields: tuple[Field, ...]

    @classmethod
    def from_layout(cls, layout: TableLayout, version: int, gtid: str,
                    ddl: dict[str, Any] | None = None) -> TableSchema:
        columns = []
        for col, name in zip(layout.columns, field_names(layout.columns), strict=True):
            mapping = map_column(col)
            spec: dict[str, Any] = {"name": name, "type": ["null", *mapping.branches],
                                    "real_type": mapping.real_type, "length": -1,
                                    "unsigned": col.unsigned}
            if mapping.fsp:
                spec["fsp"] = mapping.fsp
            if name != col.name:
                spec["column"] = col.name
            columns.append(spec)
        avsc = {"namespace": NAMESPACE, "type": "record", "name": "ChangeRecord",
                "table": layout.table, "database": layout.database, "version": version,
                "gtid": gtid, "fields": METADATA_AVRO + columns}
        if layout.primary_key:
            avsc["primary_key"] = [layout.columns[i].name for i in layout.primary_key]
        if ddl:
            avsc["ddl"] = ddl
        return cls.from_avsc(avsc)

    def successor(self, version: int, gtid: str, ddl: dict[str, Any] | None) -> TableSchema:
        """The same columns as a new version (after TRUNCATE, DROP, a rename...)."""
        avsc = {k: v for k, v in self.avsc.items() if k != "ddl"}
        avsc.update(version=version, gtid=gtid)
        if ddl:
            avsc["ddl"] = ddl
        return TableSchema.from_avsc(avsc)

    @classmethod
    def from_avsc(cls, avsc: dict[str, Any]) -> TableSchema:
        return cls(TableName(avsc["database"], avsc["table"]), int(avsc["version"]), avsc,
                   fields_from_schema(avsc))

    @property
    def columns(self) -> tuple[Field, ...]:
        return self.fields[len(METADATA_FIELDS):]

    @property
    def gtid(self) -> str:
        return str(self.avsc.get("gtid", ""))

    def text(self) -> str:
        """The compact JSON MaxScale 2.5+ writes to the ``.avsc`` file and sends as the
        schema line in JSON mode."""
        return json.dumps(self.avsc, separators=(",", ":"), ensure_ascii=False)
