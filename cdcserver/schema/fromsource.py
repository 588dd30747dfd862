"""What the schema history learns from the source itself: a table's ``SHOW CREATE TABLE``
read as DDL, for a table whose creation predates the binlog, a definition recorded before the
history kept indexes, and a table's engine; and, for a table it does not know, the types only
DDL can tell, kept by column name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from cdcserver.core.changes import TableLayout
from cdcserver.core.names import TableName
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.layouts import OLD_TEMPORAL, agrees, signature
from cdcserver.schema.statements import CreateTable

log = logging.getLogger('cdcserver.schema.history')

Lookup = Callable[[TableName], str | None]  # SHOW CREATE TABLE text now, None if no table


class LookupFailed(Exception):
    """The source could not say (logged): what depended on it stays as it is."""


def source_definition(lookup: Lookup, table: TableName, what: str) -> TableDefinition | None:
    """The table's definition on the source now; None where it has no table, or none this
    reader follows. :class:`LookupFailed` where the lookup failed (``what`` it was for is
    logged)."""
    try:
        text = lookup(table)
    except Exception as exc:  # (any failure: the source could not say)
        log.warning("schema history: cannot read the %s of %s: %s", what, table, exc)
        raise LookupFailed(str(exc)) from exc
    statement = ddl.parse(text, table.database) if text else None
    if not isinstance(statement, CreateTable) or statement.definition is None:
        return None
    return statement.definition


def described_by(definition: TableDefinition, found: TableDefinition, layout: TableLayout
              ) -> TableDefinition | None:
    """A definition recorded before the history kept indexes and AUTO_INCREMENT, with those
    of ``found`` (the source's), when it agrees with the table map and with the recorded
    columns; None otherwise."""
    if not agrees(layout, found) or [(c.name.lower(), c.column_type()) for c in
                                     found.columns] != [(c.name.lower(), c.column_type())
                                                        for c in definition.columns]:
        return None
    return replace(definition, indexes=found.indexes, columns=tuple(
        replace(mine, auto_increment=theirs.auto_increment, zerofill=theirs.zerofill)
        for mine, theirs in zip(definition.columns, found.columns, strict=True)),
        described=True)


def typed_by_name(layout: TableLayout, sources: list[TableDefinition]) -> TableLayout:
    """An unknown table's layout, each column with the type only DDL can tell (UUID, INET4,
    INET6, JSON) that one of ``sources`` (the source's definition now, the table's last known
    one) gives a column of that name and binlog type: a value's type does not change because
    a statement could not be read."""
    described = layout.metadata != "none"
    columns = []
    for column in layout.columns:
        precise = column.binlog_type not in OLD_TEMPORAL
        mine = signature(column, described, precise)
        for definition in sources:
            if definition.has(column.name):
                spec = definition.columns[definition.index(column.name)]
                if signature(spec.column_def(), described, precise) == mine:
                    column = replace(column, extended=spec.extended)
                    break
        columns.append(column)
    return replace(layout, columns=tuple(columns))
