"""Table definitions as DDL states them, and how they map onto binlog column types.

A :class:`TableDefinition` is what the schema history knows about a table: its columns in
order (name, SQL type, arguments, unsignedness, binary or character data, NULL-ability) and
primary key. :meth:`TableDefinition.column_defs` turns it into the :class:`ColumnDef` the
binlog's table map would give for the same table, so the two sources can be compared through
the same Avro mapping, and it names the types the binlog cannot express (``INET4``, ``INET6``,
``UUID``, ``JSON``). Each column is a :class:`~cdcserver.schema.columnspec.ColumnSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.changes import ColumnDef, Index, TableDescription
from cdcserver.schema.columnspec import ColumnSpec


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
