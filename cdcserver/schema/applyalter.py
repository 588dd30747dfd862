"""An ``ALTER TABLE`` statement's actions applied to a table's definition, one at a time in
MariaDB's order (:mod:`.alter` applies each): the definition after it (None once it cannot be
followed), and what else the schema history must know of it: the name it gives the table, the
rows it moves without row events, the values it rewrites in place, the columns it renames
(the foreign keys on them follow).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from cdcserver.core.names import TableName
from cdcserver.schema.alter import IndexesUnknown, alter, one_at_a_time, phase, renamed_column
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.rewrites import action_rewrites
from cdcserver.schema.statements import (
    AddColumns,
    ChangeColumn,
    ConvertCharset,
    RenameTo,
    RowsChanged,
    SetVersioning,
)

log = logging.getLogger('cdcserver.schema.history')

# ALTER actions that can rewrite stored values (rewrites.py judges them when the old columns
# are known; on a table whose columns are not, each of them means a re-read)
MAY_REWRITE = (ChangeColumn, AddColumns, ConvertCharset, SetVersioning)


@dataclass
class Applied:
    """What an ALTER TABLE's actions did, as they were applied one by one."""

    definition: TableDefinition | None
    renamed_to: TableName | None = None
    moved: list[RowsChanged] = field(default_factory=list)  # rows without row events
    rewrites: list[str] = field(default_factory=list)  # values rewritten in place
    # columns renamed (old, new), in order, while the definition was followed
    renamed_columns: list[tuple[str, str]] = field(default_factory=list)


def apply_actions(table: TableName, definition: TableDefinition | None,
                  actions: tuple[object, ...]) -> Applied:
    """The statement's actions one at a time, in MariaDB's order, on the definition (None
    once it cannot be followed): what it renames the table to, the rows it moves without row
    events, the values it rewrites, the columns it renames."""
    applied = Applied(definition)
    for action in one_at_a_time(sorted(actions, key=phase)):
        if isinstance(action, RenameTo):
            applied.renamed_to = action.table
        elif isinstance(action, RowsChanged):
            applied.moved.append(action)
        elif applied.definition is not None:
            applied.definition = _apply_action(table, applied, action)
    if applied.definition is not None:
        applied.definition = applied.definition.with_keys_sorted()
    return applied


def _apply_action(table: TableName, applied: Applied, action: object
                  ) -> TableDefinition | None:
    definition = applied.definition
    assert definition is not None
    applied.rewrites += action_rewrites(definition, action)
    renamed = renamed_column(definition, action)
    if renamed is not None:
        applied.renamed_columns.append(renamed)
    try:
        return alter(table, definition, action)
    except IndexesUnknown as exc:
        log.info("schema history: %s: %s; its indexes are re-learned from the source "
                 "when it agrees", table, exc)
        return replace(definition, described=False)
    except (KeyError, ValueError) as exc:
        log.warning("schema history: %s: %s", table, exc)
        return None
