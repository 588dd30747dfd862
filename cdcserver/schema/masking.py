"""``[capture]`` column rules applied to a table: the columns it is stored with, and its rows.

A rule (:class:`~cdcserver.core.capture.ColumnRules`) leaves a column out (``exclude``), or
stores the hex SHA-256 of the salt and its value (``hash``: a ``varchar(64)``), or its first
N characters and ``***`` (``mask:N``: ``longtext``, or ``longblob`` for binary data). The
stored columns are a projection of the source's: :func:`project_layout` gives the layout the
stream and every sink see, with the binlog's row image (each column with its rule) kept in
``TableLayout.image`` for the decoder and the transcoder; :func:`project_definition` gives
the definition a dump's header and schema are made from. Both give the same Avro fields, so a
dump and the stream of one table agree; a stored column carries its rule in the schema
(``"masked"``: protocol.md, "Masked columns"), so a rule that changes makes a new version.

Two cases are decided here, each logged once per column:

- a primary-key column keeps its clear value: consumers identify rows by it (and the
  service repairs and dumps by it). A rule naming one is reported, by ``cdcserver check``
  too, and not applied;
- ``hash`` and ``mask`` apply to character and binary strings (CHAR, VARCHAR, TEXT, BINARY,
  VARBINARY, BLOB). A rule naming a column of another type (a number, a date, ENUM, SET,
  JSON...) leaves the column out instead: nothing unmasked is stored by mistake.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.capture import EXCLUDE, HASH, ColumnRules, value_function
from cdcserver.core.changes import ColumnDef, TableDescription, TableLayout
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.schema.columnspec import BINARY_TYPES, ColumnSpec
from cdcserver.schema.definition import TableDefinition

log = logging.getLogger(__name__)

Row = tuple[Any, ...]
RowFunction = Callable[[Row], Row]

_STRING_TYPES = frozenset({T.VARCHAR, T.VAR_STRING, T.STRING, T.BLOB, T.TINY_BLOB,
                           T.MEDIUM_BLOB, T.LONG_BLOB})
_STRING_SPECS = frozenset({"char", "varchar", "binary", "varbinary", "tinytext", "text",
                           "mediumtext", "longtext", "tinyblob", "blob", "mediumblob",
                           "longblob"})
_reported: set[tuple[str, str, str, str]] = set()


def ruled_spec(name: str, rule: str, nullable: bool, binary: bool) -> ColumnSpec:
    """The column a hashed or masked column is stored as."""
    if rule == HASH:
        return ColumnSpec(name, "varchar", ("64",), nullable=nullable, charset="utf8mb4",
                          rule=rule)
    if binary:
        return ColumnSpec(name, "longblob", nullable=nullable, rule=rule)
    return ColumnSpec(name, "longtext", nullable=nullable, charset="utf8mb4", rule=rule)


def applies_to(col: ColumnDef) -> bool:
    """Whether ``hash`` and ``mask`` can apply to a column of the binlog (a string)."""
    return col.extended is None and col.binlog_type in _STRING_TYPES


def _spec_applies_to(spec: ColumnSpec) -> bool:
    return spec.type in _STRING_SPECS and not spec.json_check and spec.extended is None


def decide(rules: ColumnRules, table: TableName, column: str, in_key: bool,
           strings: bool) -> str | None:
    """The rule a column is stored under, after the two exceptions (module docstring)."""
    rule = rules.rule(table, column)
    if rule is None:
        return None
    if in_key:
        _report(table, column, rule, "it is part of the primary key, which stays in clear")
        return None
    if rule != EXCLUDE and not strings:
        _report(table, column, rule, "hash and mask apply to strings only: the column is "
                                     "left out")
        return EXCLUDE
    return rule


def _report(table: TableName, column: str, rule: str, why: str) -> None:
    key = (table.database, table.table, column, rule)
    if key not in _reported:
        _reported.add(key)
        log.warning("%s.%s: the column rule %s is not applied as written: %s", table,
                    column, rule, why)


def describe_columns(rules: ColumnRules, table: TableName,
                     columns: list[tuple[str, str, bool]]) -> list[str]:
    """What the rules do to a table's columns, each ``(name, SQL type, in the primary key)``,
    in words (``cdcserver check``); the rules not applied as written say why."""
    found = []
    for name, sql_type, in_key in columns:
        rule = rules.rule(table, name)
        if rule is None:
            continue
        if in_key:
            found.append(f"{name} stays in clear ({rule} names a primary-key column)")
        elif rule != EXCLUDE and sql_type.lower() not in _STRING_SPECS:
            found.append(f"{name} left out ({rule} of a {sql_type} column: hash and mask "
                         "apply to strings)")
        else:
            found.append(f"{name} {'left out' if rule == EXCLUDE else rule}")
    return found


@dataclass(frozen=True)
class Projection:
    layout: TableLayout  # what is stored; ``layout.image`` is the binlog's row image
    row: RowFunction  # an image's values to the stored values


def project_layout(layout: TableLayout, rules: ColumnRules) -> Projection | None:
    """The layout as the rules store it, or None when no rule applies to its columns."""
    table = TableName(layout.database, layout.table)
    if layout.image is not None or not rules or not rules.touches(table):
        return None
    key = set(layout.primary_key)
    image: list[ColumnDef] = []
    columns: list[ColumnDef] = []
    kept: list[int] = []
    functions: dict[int, Callable[[Any], Any]] = {}
    ruled: dict[str, str] = {}
    for i, col in enumerate(layout.columns):
        rule = decide(rules, table, col.name, i in key, applies_to(col)) if col.name else None
        image.append(col if rule is None else replace(col, rule=rule))
        if rule == EXCLUDE:
            ruled[col.name.lower()] = rule
            continue
        if rule is not None:
            ruled[col.name.lower()] = rule
            functions[len(kept)] = value_function(rule, rules.salt)
            col = ruled_spec(col.name, rule, col.nullable, col.charset is None).column_def()
        kept.append(i)
        columns.append(col)
    if not ruled:
        return None
    projected = replace(layout, columns=tuple(columns),
                        primary_key=tuple(kept.index(i) for i in layout.primary_key),
                        description=_describe(layout, kept, ruled), image=tuple(image),
                        salt=rules.salt if HASH in ruled.values() else None)
    return Projection(projected, row_function(kept, functions, len(layout.columns)))


def _describe(layout: TableLayout, kept: list[int], ruled: dict[str, str]
              ) -> TableDescription | None:
    description = layout.description
    if description is None or len(description.column_types) != len(layout.columns):
        return None
    types = []
    for i in kept:
        col = layout.columns[i]
        rule = ruled.get(col.name.lower())
        types.append(description.column_types[i] if rule is None else
                     ruled_spec(col.name, rule, col.nullable,
                                col.charset is None).column_type())
    gone = {name for name, rule in ruled.items() if rule == EXCLUDE}
    indexes = tuple(ix for ix in description.indexes
                    if not any(c.lower() in gone for c in ix.columns))
    auto = description.auto_increment
    return TableDescription(tuple(types), None if auto and auto.lower() in gone else auto,
                            indexes)


def row_function(kept: list[int], functions: dict[int, Callable[[Any], Any]],
                 width: int) -> RowFunction:
    """A row of ``width`` values to the kept ones, the ruled ones through their function."""
    if not functions and kept == list(range(width)):
        return tuple
    positions = tuple(kept)
    changed = tuple(functions.items())

    def project(row: Row) -> Row:
        values = [row[i] for i in positions]
        for at, function in changed:
            values[at] = function(values[at])
        return tuple(values)
    return project


def project_rows(projection: Projection, rows: list[Row]) -> list[Row]:
    project = projection.row
    return [project(row) for row in rows]


def project_definition(table: TableName, definition: TableDefinition, rules: ColumnRules
                       ) -> TableDefinition:
    """The definition as the rules store the table (the definition itself when none
    applies): the same columns :func:`project_layout` gives its layout."""
    if not rules or not rules.touches(table):
        return definition
    key = {name.lower() for name in definition.primary_key}
    columns: list[ColumnSpec] = []
    gone: set[str] = set()
    for spec in definition.columns:
        rule = decide(rules, table, spec.name, spec.name.lower() in key,
                      _spec_applies_to(spec))
        if rule == EXCLUDE:
            gone.add(spec.name.lower())
        elif rule is not None:
            columns.append(ruled_spec(spec.name, rule, spec.nullable,
                                      spec.binary or spec.type in BINARY_TYPES))
        else:
            columns.append(spec)
    if len(columns) == len(definition.columns) and all(
            a is b for a, b in zip(columns, definition.columns, strict=True)):
        return definition

    def keeps(names: tuple[str, ...]) -> bool:
        return not any(name.lower() in gone for name in names)
    return replace(definition, columns=tuple(columns),
                   indexes=tuple(ix for ix in definition.indexes if keeps(ix.columns)),
                   foreign_keys=tuple(fk for fk in definition.foreign_keys
                                      if keeps(fk.columns)),
                   period=definition.period if definition.period is None or
                   keeps(definition.period) else None)


def rule_functions(layout: TableLayout, salt: bytes | None) -> RowFunction | None:
    """For a stored layout, the function turning clear values read from the source (in its
    columns' order) into stored ones; None when none of its columns is hashed or masked."""
    functions = {i: value_function(col.rule, salt) for i, col in enumerate(layout.columns)
                 if col.rule}
    if not functions:
        return None
    return row_function(list(range(len(layout.columns))), functions, len(layout.columns))
