"""One ``ALTER TABLE`` action applied to a table's definition: a function per kind of action,
in the order MariaDB applies them, and what the actions rename or rewrite."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from cdcserver.core.changes import Index
from cdcserver.core.names import TableName
from cdcserver.schema.columnspec import CHARACTER_TYPES, ColumnSpec
from cdcserver.schema.definition import (
    IMPLICIT_ROW_END,
    IMPLICIT_ROW_START,
    TableDefinition,
    named,
    with_foreign_key_index,
    with_index,
)
from cdcserver.schema.statements import (
    AddColumns,
    AddForeignKey,
    AddIndex,
    AddPeriod,
    ChangeColumn,
    ConvertCharset,
    DropColumn,
    DropForeignKey,
    DropIndex,
    Position,
    RenameColumn,
    RenameIndex,
    SetEngine,
    SetPrimaryKey,
    SetVersioning,
    UnknownAction,
)

log = logging.getLogger('cdcserver.schema.history')


def column_renames(actions: Sequence[object], definition: TableDefinition | None
                   ) -> tuple[tuple[str, str], ...]:
    """The columns an ALTER's actions rename, (old, new) each, as MariaDB reads them: every
    name refers to the table before the statement (``CHANGE a b INT, CHANGE b a INT`` swaps
    the two)."""
    renames = []
    for action in actions:
        if isinstance(action, RenameColumn):
            renames.append((action.old, action.new))
        elif isinstance(action, ChangeColumn) and \
                action.old.lower() != action.column.name.lower() and \
                (definition is None or definition.has(action.old)):
            renames.append((action.old, action.column.name))
    return tuple(renames)


def one_at_a_time(actions: list[object]) -> list[object]:
    """The actions, with column renames whose new name is another renamed column's old one
    (a swap) done through a name no column has: applied in order, each then finds the
    column it means."""
    renames = column_renames(actions, None)
    sources = {old.lower() for old, _ in renames}
    if not any(new.lower() in sources for _, new in renames):
        return actions
    out: list[object] = []
    later: list[object] = []
    for number, action in enumerate(actions):
        if isinstance(action, RenameColumn) and action.new.lower() in sources:
            temporary = f"\x00cdc-rename-{number}"
            out.append(RenameColumn(action.old, temporary))
            later.append(RenameColumn(temporary, action.new))
        elif isinstance(action, ChangeColumn) and action.column.name.lower() in sources \
                and action.old.lower() != action.column.name.lower():
            temporary = f"\x00cdc-rename-{number}"
            out.append(replace(action, column=replace(action.column, name=temporary)))
            later.append(RenameColumn(temporary, action.column.name))
        else:
            out.append(action)
    return out + later


def renamed_column(definition: TableDefinition, action: object) -> tuple[str, str] | None:
    """(old, new) when ``action`` renames a column of the table."""
    if isinstance(action, RenameColumn):
        return action.old, action.new
    if isinstance(action, ChangeColumn) and action.old.lower() != \
            action.column.name.lower() and definition.has(action.old):
        return action.old, action.column.name
    return None


class IndexesUnknown(Exception):
    """An index statement that does not fit the indexes the history has (a table learned
    from the source after the statement ran, say): the columns are still known, the
    indexes are not. Never a reason to forget the table."""


_INDEX_ACTIONS = (AddIndex, DropIndex, RenameIndex)


def phase(action: object) -> int:
    """The order MariaDB applies an ALTER TABLE's actions in, whatever order they are
    written in: keys dropped and renamed, then columns changed, then keys added."""
    if isinstance(action, (DropIndex, RenameIndex, DropForeignKey)):
        return 0
    if isinstance(action, SetPrimaryKey):
        return 0 if not action.columns else 2
    if isinstance(action, (AddIndex, AddForeignKey)):
        return 2
    return 1


def alter(table: TableName, definition: TableDefinition, action: object) -> TableDefinition:
    """The definition after one ALTER TABLE action (KeyError, ValueError: it cannot be
    followed)."""
    if isinstance(action, _INDEX_ACTIONS) and not definition.described:
        return definition  # re-learned from the source as a whole
    renamed = renamed_column(definition, action)
    if renamed is not None or isinstance(action, DropColumn):
        definition = _keys_after_column_change(table, definition, action, renamed)
    if renamed is not None:
        definition = definition.with_renamed_column(*renamed)
    step = _ALTER_STEPS.get(type(action))
    if step is None:
        raise ValueError(f"unexpected action {action!r}")
    return step(table, definition, action)


def _add_foreign_key(table: TableName, definition: TableDefinition,
                     action: AddForeignKey) -> TableDefinition:
    definition = with_foreign_key_index(definition, Index(action.key.name, action.key.columns))
    key = named(action.key, table.table, definition.foreign_keys)
    return replace(definition, foreign_keys=(*definition.foreign_keys, key))


def _drop_foreign_key(table: TableName, definition: TableDefinition,
                      action: DropForeignKey) -> TableDefinition:
    return replace(definition, foreign_keys=tuple(
        k for k in definition.foreign_keys if k.name.lower() != action.name.lower()))


def _add_period(table: TableName, definition: TableDefinition,
                action: AddPeriod) -> TableDefinition:
    return replace(definition, period=(action.start, action.end), implicit_period=False)


def _set_versioning(table: TableName, definition: TableDefinition,
                    action: SetVersioning) -> TableDefinition:
    if not action.on:
        return definition.unversioned()
    if definition.period is not None:  # ADD PERIOD FOR SYSTEM_TIME named the columns
        return definition.versioned(definition.period, implicit=False)
    return definition.versioned((IMPLICIT_ROW_START, IMPLICIT_ROW_END), implicit=True)


def _add_columns(table: TableName, definition: TableDefinition,
                 action: AddColumns) -> TableDefinition:
    columns = list(definition.columns)
    for column in action.columns:
        if definition.has(column.name):
            if action.if_not_exists:
                continue
            raise ValueError(f"column {column.name} already exists")
        column = _with_table_charset(column, definition)
        _insert(columns, column, action.position, definition)
        definition = replace(definition, columns=tuple(columns))
    return definition


def _drop_column(table: TableName, definition: TableDefinition,
                 action: DropColumn) -> TableDefinition:
    if not definition.has(action.name):
        if action.if_exists:
            return definition
        raise KeyError(f"no column {action.name}")
    columns = list(definition.columns)
    del columns[definition.index(action.name)]
    pk = [c for c in definition.primary_key if c.lower() != action.name.lower()]
    return replace(definition.without_column(action.name), columns=tuple(columns),
                   primary_key=tuple(pk))


def _change_column(table: TableName, definition: TableDefinition,
                   action: ChangeColumn) -> TableDefinition:
    if not definition.has(action.old):
        if action.if_exists:
            return definition
        raise KeyError(f"no column {action.old}")
    columns, pk = list(definition.columns), list(definition.primary_key)
    index = definition.index(action.old)
    column = _with_table_charset(action.column, definition)
    if action.old.lower() in (p.lower() for p in pk):
        column = replace(column, nullable=False)
        pk = [column.name if p.lower() == action.old.lower() else p for p in pk]
    del columns[index]
    if action.position is None:
        columns.insert(index, column)
    else:
        _insert(columns, column, action.position, replace(definition, columns=tuple(columns)))
    return replace(definition, columns=tuple(columns), primary_key=tuple(pk))


def _rename_column(table: TableName, definition: TableDefinition,
                   action: RenameColumn) -> TableDefinition:
    columns = list(definition.columns)
    index = definition.index(action.old)
    columns[index] = replace(columns[index], name=action.new)
    pk = [action.new if p.lower() == action.old.lower() else p for p in definition.primary_key]
    return replace(definition, columns=tuple(columns), primary_key=tuple(pk))


def _set_primary_key(table: TableName, definition: TableDefinition,
                     action: SetPrimaryKey) -> TableDefinition:
    for name in action.columns:
        definition.index(name)
    columns = [replace(c, nullable=False) if c.name in action.columns else c
               for c in definition.columns]
    primary = action.columns
    end = definition.period[1] if definition.period is not None else None
    if primary and end is not None and end.lower() not in (c.lower() for c in primary):
        primary += (end,)  # a versioned table's unique keys end with its row end
    return replace(definition, columns=tuple(columns), primary_key=primary)


def _convert_charset(table: TableName, definition: TableDefinition,
                     action: ConvertCharset) -> TableDefinition:
    columns = [replace(c, charset=action.charset, binary=action.charset == "binary")
               if c.type in CHARACTER_TYPES else c for c in definition.columns]
    return replace(definition, columns=tuple(columns), default_charset=action.charset)


def _set_engine(table: TableName, definition: TableDefinition,
                action: SetEngine) -> TableDefinition:
    return replace(definition, engine=action.engine)


def _unknown_action(table: TableName, definition: TableDefinition,
                    action: UnknownAction) -> TableDefinition:
    raise ValueError(f"ALTER TABLE action not understood: {action.text[:60]!r}")


def _index_action(table: TableName, definition: TableDefinition,
                  action: AddIndex | DropIndex | RenameIndex) -> TableDefinition:
    return _indexes_altered(definition, action)


# One step per kind of action (each takes the table, the definition and the action)
_ALTER_STEPS: dict[type, Callable[[TableName, TableDefinition, Any], TableDefinition]] = {
    AddForeignKey: _add_foreign_key, DropForeignKey: _drop_foreign_key,
    AddIndex: _index_action, DropIndex: _index_action, RenameIndex: _index_action,
    AddPeriod: _add_period, SetVersioning: _set_versioning,
    AddColumns: _add_columns, DropColumn: _drop_column,
    ChangeColumn: _change_column, RenameColumn: _rename_column,
    SetPrimaryKey: _set_primary_key, ConvertCharset: _convert_charset,
    SetEngine: _set_engine, UnknownAction: _unknown_action,
}


def _indexes_altered(definition: TableDefinition,
                     action: AddIndex | DropIndex | RenameIndex) -> TableDefinition:
    """``definition`` with an index added, dropped or renamed; IndexesUnknown when the
    statement does not fit the indexes known (a table learned from the source as it is
    now meets the statements that made it so: those that already show change nothing)."""
    names = [i.name.lower() for i in definition.indexes]
    if isinstance(action, AddIndex):
        index = _unique_with_row_end(definition, action.index)
        name = index.name.lower()
        if name and name in names:
            if action.if_not_exists or index in definition.indexes:
                return definition
            if not action.replace:
                raise IndexesUnknown(f"index {index.name} already exists")
            definition = replace(definition, indexes=tuple(
                i for i in definition.indexes if i.name.lower() != name))
        if not index.columns or not all(definition.has(c) for c in index.columns):
            raise IndexesUnknown(f"index {index.name or '?'} on columns not known")
        return with_index(definition, index)
    old = action.name if isinstance(action, DropIndex) else action.old
    if old.lower() not in names:
        if isinstance(action, DropIndex) and action.if_exists:
            return definition
        if isinstance(action, RenameIndex) and action.new.lower() in names:
            return definition
        raise IndexesUnknown(f"no index {old}")
    if isinstance(action, DropIndex):
        return replace(definition, indexes=tuple(
            i for i in definition.indexes if i.name.lower() != old.lower()))
    return replace(definition, indexes=tuple(
        replace(i, name=action.new) if i.name.lower() == old.lower() else i
        for i in definition.indexes))


def _unique_with_row_end(definition: TableDefinition, index: Index) -> Index:
    """A unique key of a system-versioned table ends with its row end (MariaDB adds it)."""
    if not index.unique or definition.period is None:
        return index
    end = definition.period[1]
    if end.lower() in (c.lower() for c in index.columns):
        return index
    return replace(index, columns=(*index.columns, end))


def _keys_after_column_change(table: TableName, definition: TableDefinition, action: object,
                              renamed: tuple[str, str] | None) -> TableDefinition:
    """The table's own foreign keys after a column is renamed or dropped (a key on a
    dropped column goes with it)."""
    keys = []
    for key in definition.foreign_keys:
        if renamed is not None:
            old, new = renamed
            key = replace(key, columns=tuple(new if c.lower() == old.lower() else c
                                             for c in key.columns))
            if TableName(*key.parent) == table:
                key = replace(key, parent_columns=tuple(
                    new if c.lower() == old.lower() else c for c in key.parent_columns))
        elif isinstance(action, DropColumn) and action.name.lower() in (
                c.lower() for c in key.columns):
            continue
        keys.append(key)
    return replace(definition, foreign_keys=tuple(keys))


def _insert(columns: list[ColumnSpec], column: ColumnSpec, position: Position | None,
            definition: TableDefinition) -> None:
    if position is None and definition.implicit_period:
        columns.insert(definition.index(IMPLICIT_ROW_START), column)  # they stay last
    elif position is None:
        columns.append(column)
    elif position[0] == "first":
        columns.insert(0, column)
    else:
        assert position[1] is not None
        columns.insert(definition.index(position[1]) + 1, column)


def _with_table_charset(column: ColumnSpec, definition: TableDefinition) -> ColumnSpec:
    charset = definition.default_charset
    if column.type in CHARACTER_TYPES and column.charset is None and charset is not None:
        return replace(column, charset=charset, binary=charset == "binary")
    return column
