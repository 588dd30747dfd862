"""A column as DDL states it, and the binlog column type it maps to.

A :class:`ColumnSpec` is one column of a :class:`~cdcserver.schema.definition.TableDefinition`:
its name, SQL type (aliases resolved by :func:`canonical_type`), arguments, unsignedness,
binary or character data and NULL-ability. :meth:`ColumnSpec.column_def` gives the
:class:`ColumnDef` a FULL-metadata table map gives for the same column, and
:meth:`ColumnSpec.column_type` the type as ``SHOW COLUMNS`` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T

# SQL type name (lowercase, aliases resolved) -> binlog type
_INTEGERS = {"tinyint": T.TINY, "smallint": T.SHORT, "mediumint": T.INT24, "int": T.LONG,
             "bigint": T.LONGLONG}
_ALIASES = {
    "integer": "int", "int1": "tinyint", "int2": "smallint", "int3": "mediumint",
    "middleint": "mediumint", "int4": "int", "int8": "bigint", "bool": "tinyint",
    "boolean": "tinyint", "dec": "decimal", "numeric": "decimal", "fixed": "decimal",
    "real": "double", "float8": "double", "float4": "float", "double precision": "double",
    "nchar": "char", "nvarchar": "varchar", "character": "char", "national char": "char",
    "national varchar": "varchar", "character varying": "varchar", "char varying": "varchar",
    "long varchar": "mediumtext", "long": "mediumtext", "long varbinary": "mediumblob",
    "long binary": "mediumblob",
}
_BLOBS = {"tinyblob": 1, "blob": 2, "mediumblob": 3, "longblob": 4,
          "tinytext": 1, "text": 2, "mediumtext": 3, "longtext": 4}
_GEOMETRIES = frozenset({"geometry", "point", "linestring", "polygon", "multipoint",
                         "multilinestring", "multipolygon", "geometrycollection"})
_EXTENDED_SIZES = {"inet4": 4, "inet6": 16, "uuid": 16}
# an integer's display width when the DDL gives none (one less when unsigned, but BIGINT's)
_DISPLAY_WIDTHS = {"tinyint": 4, "smallint": 6, "mediumint": 9, "int": 11, "bigint": 20}
_NUMBERS = frozenset({*_INTEGERS, "decimal", "float", "double"})
# The most bytes a character takes, for TEXT(n)'s size (a character set not listed: 4, as
# utf8mb4, the default character set where the statement names none)
_MAX_CHARACTER_BYTES = {"latin1": 1, "ascii": 1, "binary": 1, "latin2": 1, "cp1250": 1,
                        "cp1251": 1, "cp1256": 1, "cp1257": 1, "greek": 1, "hebrew": 1,
                        "koi8r": 1, "koi8u": 1, "swe7": 1, "dec8": 1, "cp850": 1, "hp8": 1,
                        "ucs2": 2, "big5": 2, "gbk": 2, "sjis": 2, "cp932": 2, "euckr": 2,
                        "gb2312": 2, "ujis": 3, "eucjpms": 3, "utf8": 3, "utf8mb3": 3,
                        "utf8mb4": 4, "utf16": 4, "utf16le": 4, "utf32": 4}
# CHARACTER SET binary makes a character column a byte column
_AS_BYTES = {"char": "binary", "varchar": "varbinary", "tinytext": "tinyblob", "text": "blob",
             "mediumtext": "mediumblob", "longtext": "longblob"}


def _sized(kind: str, length: int, charset: str | None) -> str:
    """TEXT(n) or BLOB(n): the smallest of the four sizes that holds n characters."""
    size = length * (_MAX_CHARACTER_BYTES.get(charset or "utf8mb4", 4) if kind == "text"
                     else 1)
    tiers = ("tiny", "", "medium", "long")
    base = kind
    for tier, limit in zip(tiers, (255, 65535, 16777215, 1 << 32), strict=True):
        if size <= limit:
            return tier + base
    return "long" + base


BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
CHARACTER_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                             "enum", "set"})


def canonical_type(name: str) -> str:
    name = " ".join(name.lower().split())
    return _ALIASES.get(name, name)


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str  # canonical lowercase SQL type: int, varchar, decimal, inet6, json, ...
    args: tuple[str, ...] = ()  # numbers in the parentheses; ENUM/SET: the labels
    unsigned: bool = False
    binary: bool = False  # character data in the binary character set
    nullable: bool = True
    json_check: bool = False  # CHECK (json_valid(col)): MariaDB's JSON alias
    charset: str | None = None  # the column's or its table's character set, when stated
    auto_increment: bool = False
    zerofill: bool = False
    rule: str | None = None  # "hash" or "mask:N": stored under a [capture] column rule

    def to_json(self) -> dict[str, Any]:
        data = {"name": self.name, "type": self.type, "args": list(self.args),
                "unsigned": self.unsigned, "binary": self.binary, "nullable": self.nullable,
                "json_check": self.json_check, "charset": self.charset}
        if self.auto_increment:
            data["auto_increment"] = True
        if self.zerofill:
            data["zerofill"] = True
        if self.rule:
            data["rule"] = self.rule
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ColumnSpec:
        return cls(data["name"], data["type"], tuple(data["args"]), data["unsigned"],
                   data["binary"], data["nullable"], data.get("json_check", False),
                   data.get("charset"), data.get("auto_increment", False),
                   data.get("zerofill", False), data.get("rule"))

    def column_type(self) -> str:
        """The type as MariaDB's ``SHOW COLUMNS`` shows it: ``int(11)``, ``int(10) unsigned
        zerofill``, ``decimal(10,0)``, ``varchar(255)``, ``enum('a','b')``, ``longtext`` for
        JSON."""
        kind, args = self.sized()
        if kind == "serial":
            return "bigint(20) unsigned"
        if kind in ("enum", "set"):
            return kind + "(" + ",".join(
                "'" + a.replace("\\", "\\\\").replace("'", "''") + "'" for a in args) + ")"
        if self.binary and kind in _AS_BYTES:
            kind = _AS_BYTES[kind]
        if kind == "json":
            kind = "longtext"
        elif kind == "float" and len(args) == 1:
            kind, args = ("double" if int(args[0]) > 24 else "float"), ()
        elif kind in _DISPLAY_WIDTHS and not args:
            args = (str(_DISPLAY_WIDTHS[kind] - (self.unsigned and kind != "bigint")),)
        elif kind == "decimal":
            args = (args[0] if args else "10", args[1] if len(args) > 1 else "0")
        elif kind in ("char", "binary", "bit") and not args:
            args = ("1",)
        elif kind == "year":
            args = ("4",)
        elif kind in ("datetime", "timestamp", "time") and args == ("0",):
            args = ()
        text = kind + ("(" + ",".join(args) + ")" if args else "")
        if self.unsigned and kind in _NUMBERS:
            text += " unsigned"
        return text + (" zerofill" if self.zerofill else "")

    @property
    def extended(self) -> str | None:
        if self.type in _EXTENDED_SIZES:
            return self.type
        if self.type == "json" or (self.json_check and self.type in _BLOBS):
            return "json"
        return None

    def sized(self) -> tuple[str, tuple[str, ...]]:
        """The type and its arguments, TEXT(n) and BLOB(n) as the size they make."""
        if self.type in ("text", "blob") and self.args and self.args[0].isdigit():
            return _sized(self.type, int(self.args[0]), self.charset), ()
        return self.type, self.args

    def column_def(self) -> ColumnDef:
        """The ColumnDef a FULL-metadata table map gives for this column."""
        kind, args = self.sized()
        number = int(args[0]) if args and args[0].isdigit() else None
        text = None if self.binary or kind in BINARY_TYPES else "utf-8"
        base = ColumnDef(self.name, int(T.NULL), nullable=self.nullable,
                         unsigned=self.unsigned, extended=self.extended, rule=self.rule)
        if kind == "serial":
            return replace(base, binlog_type=T.LONGLONG, unsigned=True, nullable=False)
        if kind in _INTEGERS:
            return replace(base, binlog_type=_INTEGERS[kind])
        if kind == "float":
            # FLOAT(p) with p > 24 is a DOUBLE; FLOAT(M,D) stays a FLOAT.
            double = number is not None and len(args) == 1 and number > 24
            return replace(base, binlog_type=T.DOUBLE if double else T.FLOAT,
                           meta=8 if double else 4)
        if kind == "double":
            return replace(base, binlog_type=T.DOUBLE, meta=8)
        if kind == "decimal":
            precision = number if number is not None else 10
            scale = int(args[1]) if len(args) > 1 else 0
            return replace(base, binlog_type=T.NEWDECIMAL, meta=(precision << 8) | scale)
        if kind == "bit":
            bits = number if number is not None else 1
            return replace(base, binlog_type=T.BIT, meta=((bits // 8) << 8) | (bits % 8))
        temporal = {"date": T.DATE, "time": T.TIME2, "datetime": T.DATETIME2,
                    "timestamp": T.TIMESTAMP2, "year": T.YEAR}
        if kind in temporal:
            fsp = number if number is not None and kind in ("time", "datetime", "timestamp") \
                else 0
            return replace(base, binlog_type=temporal[kind], meta=fsp)
        if kind in ("char", "binary"):
            return replace(base, binlog_type=T.STRING, charset=text)
        if kind in ("varchar", "varbinary"):
            return replace(base, binlog_type=T.VARCHAR, meta=number or 0, charset=text)
        if kind in _BLOBS:
            return replace(base, binlog_type=T.BLOB, meta=_BLOBS[kind], charset=text)
        if kind == "json":
            return replace(base, binlog_type=T.BLOB, meta=4, charset="utf-8")
        if kind == "enum":
            return replace(base, binlog_type=T.ENUM, meta=1 if len(args) < 256 else 2,
                           charset=text, enum_values=args)
        if kind == "set":
            return replace(base, binlog_type=T.SET, meta=(len(args) + 7) // 8, charset=text,
                           set_values=args)
        if kind in _GEOMETRIES:
            return replace(base, binlog_type=T.GEOMETRY, meta=4)
        if kind in _EXTENDED_SIZES:
            return replace(base, binlog_type=T.STRING, meta=0xFE00 | _EXTENDED_SIZES[kind])
        raise ValueError(f"column {self.name!r}: unknown type {kind!r}")
