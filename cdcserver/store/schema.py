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

from cdcserver.core.capture import HASH, salt_id
from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.names import TableName
from cdcserver.schema.avrotypes import map_column
from mariadb_cdc_client.format.schema import (
    EVENT_TYPES,
    METADATA_FIELDS,
    Field,
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
            if col.rule:  # protocol.md, "Masked columns"
                spec["masked"] = col.rule
                if col.rule == HASH and layout.salt:  # another salt: another version
                    spec["salt"] = salt_id(layout.salt)
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
