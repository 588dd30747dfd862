"""The foreign keys between the tables the schema history knows, when their parent, or one of
its columns, is renamed: they follow it, as InnoDB has them follow."""

from __future__ import annotations

from dataclasses import replace

from cdcserver.core.names import TableName
from cdcserver.schema.definition import TableDefinition


def with_renamed_parent_column(tables: dict[TableName, TableDefinition], parent: TableName,
                               old: str, new: str) -> dict[TableName, TableDefinition]:
    """The children whose keys name ``parent``'s column ``old``, naming ``new`` instead."""
    changed = {}
    for child, definition in tables.items():
        if child == parent:
            continue
        keys = tuple(replace(k, parent_columns=tuple(
            new if c.lower() == old.lower() else c for c in k.parent_columns))
            if TableName(*k.parent) == parent else k for k in definition.foreign_keys)
        if keys != definition.foreign_keys:
            changed[child] = replace(definition, foreign_keys=keys)
    return changed


def with_renamed_parent(tables: dict[TableName, TableDefinition], old: TableName,
                        new: TableName) -> dict[TableName, TableDefinition]:
    """The children of ``old``, referencing it by its new name ``new``."""
    changed = {}
    for child, definition in tables.items():
        if any(TableName(*k.parent) == old for k in definition.foreign_keys):
            changed[child] = referencing(definition, old, new)
    return changed


def referencing(definition: TableDefinition, old: TableName, new: TableName
                ) -> TableDefinition:
    """``definition`` with its keys on ``old`` on ``new`` (a key of a renamed table on
    itself follows it too)."""
    return replace(definition, foreign_keys=tuple(
        replace(k, parent=(new.database, new.table)) if TableName(*k.parent) == old else k
        for k in definition.foreign_keys))
