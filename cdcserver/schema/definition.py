"""Table definitions as DDL states them, and how they map onto binlog column types.

A :class:`TableDefinition` is what the schema history knows about a table: its columns in
order (name, SQL type, arguments, unsignedness, binary or character data, NULL-ability) and
primary key. :meth:`TableDefinition.column_defs` turns it into the :class:`ColumnDef` the
binlog's table map would give for the same table, so the two sources can be compared through
the same Avro mapping, and it names the types the binlog cannot express (``INET4``, ``INET6``,
``UUID``, ``JSON``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.changes import ColumnDef, Index, TableDescription
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


@dataclass(frozen=True)
class ForeignKey:
    """``columns`` of the table reference ``parent_columns`` of ``parent``; ``on_delete`` and
    ``on_update`` are the referential actions, lowercase (``cascade``, ``set null``,
    ``set default``, ``restrict``, ``no action``)."""

    name: str
    columns: tuple[str, ...]
    parent: tuple[str, str]  # (database, table)
    parent_columns: tuple[str, ...]
    on_delete: str = "restrict"
    on_update: str = "restrict"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "columns": list(self.columns), "parent": list(self.parent),
                "parent_columns": list(self.parent_columns), "on_delete": self.on_delete,
                "on_update": self.on_update}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForeignKey:
        return cls(data["name"], tuple(data["columns"]), (data["parent"][0], data["parent"][1]),
                   tuple(data["parent_columns"]), data["on_delete"], data["on_update"])


def with_index(definition: TableDefinition, index: Index) -> TableDefinition:
    """The table with ``index`` added; an unnamed index is named after its first column,
    with ``_2``, ``_3``... when that name is taken, as MariaDB names it. A foreign key's
    own index gives way to a stated one that starts with its columns."""
    kept = definition.indexes
    if not index.generated:
        kept = tuple(i for i in kept if not (i.generated and _prefix(i.columns, index.columns)))
    name = index.name
    if not name:
        taken = {"primary"} | {i.name.lower() for i in kept}
        name, n = index.columns[0], 1
        while name.lower() in taken:
            n += 1
            name = f"{index.columns[0]}_{n}"
    return replace(definition, indexes=(*kept, replace(index, name=name)))


def _prefix(columns: tuple[str, ...], of: tuple[str, ...]) -> bool:
    return [c.lower() for c in of[:len(columns)]] == [c.lower() for c in columns]


def with_foreign_key_index(definition: TableDefinition, index: Index) -> TableDefinition:
    """The table with the index a foreign key makes (named after its constraint, else its
    first column), unless an index already starts with the key's columns."""
    wanted = [c.lower() for c in index.columns]
    for columns in (definition.primary_key, *(i.columns for i in definition.indexes)):
        if [c.lower() for c in columns[:len(wanted)]] == wanted:
            return definition
    return with_index(definition, replace(index, generated=True))


def named(key: ForeignKey, table: str, existing: tuple[ForeignKey, ...]) -> ForeignKey:
    """``key`` with a name: its own, or the one InnoDB gives an unnamed key of ``table``,
    ``table_ibfk_N`` (N one more than the keys already so named)."""
    if key.name:
        return key
    taken = {k.name.lower() for k in existing}
    n = 1 + sum(1 for k in existing if k.name.lower().startswith(f"{table.lower()}_ibfk_"))
    while f"{table}_ibfk_{n}".lower() in taken:
        n += 1
    return replace(key, name=f"{table}_ibfk_{n}")


# The columns MariaDB gives a table made WITH SYSTEM VERSIONING without naming its own: at
# the end of the row, after every column added later, and the row end in every unique key.
IMPLICIT_ROW_START = "row_start"
IMPLICIT_ROW_END = "row_end"
IMPLICIT_PERIOD = (ColumnSpec(IMPLICIT_ROW_START, "timestamp", ("6",), nullable=False),
                   ColumnSpec(IMPLICIT_ROW_END, "timestamp", ("6",), nullable=False))

# A SEQUENCE is a table of one row with these columns (MariaDB 10.3 to 11.4).
SEQUENCE_COLUMNS = (
    ColumnSpec("next_not_cached_value", "bigint", ("21",), nullable=False),
    ColumnSpec("minimum_value", "bigint", ("21",), nullable=False),
    ColumnSpec("maximum_value", "bigint", ("21",), nullable=False),
    ColumnSpec("start_value", "bigint", ("21",), nullable=False),
    ColumnSpec("increment", "bigint", ("21",), nullable=False),
    ColumnSpec("cache_size", "bigint", ("21",), unsigned=True, nullable=False),
    ColumnSpec("cycle_option", "tinyint", ("1",), unsigned=True, nullable=False),
    ColumnSpec("cycle_count", "bigint", ("21",), nullable=False),
)


@dataclass(frozen=True)
class TableDefinition:
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...] = ()
    default_charset: str | None = None
    engine: str | None = None  # lowercase; None when the statement did not say
    foreign_keys: tuple[ForeignKey, ...] = ()
    # WITH SYSTEM VERSIONING: the row start and row end columns; ``implicit_period`` when
    # MariaDB made them (IMPLICIT_PERIOD, hidden from SHOW CREATE TABLE).
    period: tuple[str, str] | None = None
    implicit_period: bool = False
    sequence: bool = False  # a SEQUENCE (CREATE SEQUENCE, or a table with SEQUENCE=1)
    indexes: tuple[Index, ...] = ()  # every index but the primary key, each named
    # False for a definition recorded before the history kept indexes and AUTO_INCREMENT
    # (its ``indexes`` and ``auto_increment`` say nothing): re-learned when the source agrees.
    described: bool = True

    def index(self, name: str) -> int:
        lowered = name.lower()
        for i, col in enumerate(self.columns):
            if col.name.lower() == lowered:
                return i
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(c.name.lower() == name.lower() for c in self.columns)

    def column_defs(self) -> tuple[ColumnDef, ...]:
        return tuple(c.column_def() for c in self.columns)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "columns": [c.to_json() for c in self.columns],
            "primary_key": list(self.primary_key), "default_charset": self.default_charset,
            "engine": self.engine}
        if self.foreign_keys:
            data["foreign_keys"] = [k.to_json() for k in self.foreign_keys]
        if self.period is not None:
            data["period"] = list(self.period)
            data["implicit_period"] = self.implicit_period
        if self.sequence:
            data["sequence"] = True
        if self.described:
            data["indexes"] = [{"name": i.name, "columns": list(i.columns), "unique": i.unique,
                                "kind": i.kind, **({"generated": True} if i.generated else {})}
                               for i in self.indexes]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableDefinition:
        period = data.get("period")
        return cls(tuple(ColumnSpec.from_json(c) for c in data["columns"]),
                   tuple(data["primary_key"]), data.get("default_charset"), data.get("engine"),
                   tuple(ForeignKey.from_json(k) for k in data.get("foreign_keys", ())),
                   (period[0], period[1]) if period else None,
                   data.get("implicit_period", False), data.get("sequence", False),
                   tuple(Index(i["name"], tuple(i["columns"]), i["unique"], i["kind"],
                               i.get("generated", False))
                         for i in data.get("indexes", ())), "indexes" in data)

    def describe(self) -> TableDescription:
        """The table as ``SHOW COLUMNS`` and ``SHOW INDEX`` would show it, but for the
        columns of an implicit system-versioning period: hidden from both, they are in
        every row image, so they are listed (and stay out of the keys, as shown)."""
        auto = next((c.name for c in self.columns if c.auto_increment), None)
        keys: tuple[Index, ...] = (Index("PRIMARY", self.primary_key, True),) \
            if self.primary_key else ()
        keys += self.indexes
        if self.implicit_period:
            keys = tuple(replace(k, columns=tuple(c for c in k.columns
                                                  if c.lower() != IMPLICIT_ROW_END))
                         for k in keys)
        return TableDescription(tuple(c.column_type() for c in self.columns), auto, keys)

    def with_keys_sorted(self) -> TableDefinition:
        """The indexes in MariaDB's order, which it sets at the end of every CREATE and ALTER
        (``sort_keys``): unique keys first, those with a NULL-able column after the others;
        full-text keys last; otherwise the order they had, new ones after."""
        nullable = {c.name.lower() for c in self.columns if c.nullable}

        def rank(index: Index) -> int:
            if index.unique:
                return any(c.lower() in nullable for c in index.columns)
            return 3 if index.kind == "fulltext" else 2

        return replace(self, indexes=tuple(sorted(self.indexes, key=rank)))

    def versioned(self, period: tuple[str, str], *, implicit: bool) -> TableDefinition:
        """This table WITH SYSTEM VERSIONING: the implicit columns added at the end when
        ``implicit``, and the row end in the primary key (MariaDB adds it to every unique
        key, so that a row's history rows can share its key)."""
        columns = self.columns + (IMPLICIT_PERIOD if implicit else ())
        pk = self.primary_key
        if pk and period[1].lower() not in (c.lower() for c in pk):
            pk = (*pk, period[1])
        indexes = tuple(replace(i, columns=(*i.columns, period[1])) if i.unique and
                        period[1].lower() not in (c.lower() for c in i.columns) else i
                        for i in self.indexes)
        return replace(self, columns=columns, primary_key=pk, period=period,
                       implicit_period=implicit, indexes=indexes)

    def unversioned(self) -> TableDefinition:
        """This table after DROP SYSTEM VERSIONING: the implicit columns go, the row end
        leaves the primary key (explicit row start/end columns are dropped by the statement's
        own DROP COLUMN)."""
        if self.period is None:
            return self
        end = self.period[1].lower()
        columns = tuple(c for c in self.columns if not self.implicit_period
                        or c.name.lower() not in (IMPLICIT_ROW_START, IMPLICIT_ROW_END))
        pk = tuple(c for c in self.primary_key if c.lower() != end)
        indexes = tuple(replace(i, columns=tuple(c for c in i.columns if c.lower() != end))
                        if i.unique else i for i in self.indexes)
        return replace(self, columns=columns, primary_key=pk, period=None,
                       implicit_period=False, indexes=indexes)

    def without_column(self, name: str) -> TableDefinition:
        """The indexes once column ``name`` is dropped: it leaves every index, and an index
        left without columns goes (MariaDB's rule)."""
        lowered = name.lower()
        indexes = tuple(replace(i, columns=tuple(c for c in i.columns if c.lower() != lowered))
                        for i in self.indexes)
        return replace(self, indexes=tuple(i for i in indexes if i.columns))

    def with_renamed_column(self, old: str, new: str) -> TableDefinition:
        """The indexes once column ``old`` is named ``new``."""
        return replace(self, indexes=tuple(
            replace(i, columns=tuple(new if c.lower() == old.lower() else c
                                     for c in i.columns)) for i in self.indexes))
