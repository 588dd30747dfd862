"""Recognising, where they happen, the changes the binlog carries no rows for.

InnoDB performs a foreign key's ``ON DELETE``/``ON UPDATE`` action (``CASCADE``, ``SET NULL``,
``SET DEFAULT``) inside the storage engine: the binlog holds the parent's row event and, as a
hint, the child's table map, but not one row of the child (a replica repeats the cascade
itself; a change stream cannot). ``REPLACE`` on a parent deletes and re-inserts the row and so
cascades too, though it is logged as a ``Write_rows`` event. A session with
``foreign_key_checks=0`` runs no cascade, and its row events say so (``NO_FOREIGN_KEY_CHECKS_F``).

Statements can change stored rows too: partition maintenance, ALTERs that rewrite values,
``DROP SYSTEM VERSIONING``, ``ALTER SEQUENCE``; the schema history says which
(``TableChange.rewrites``). ``CREATE SEQUENCE`` makes the sequence's one row without a row
event.

Each becomes a :class:`~cdcserver.core.changes.Rowless` marker in the transaction, which the
pipeline's repair stage (:mod:`cdcserver.reread.repair`) turns into change records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cdcserver.core.capture import RULED_STATEMENT
from cdcserver.core.changes import ForeignKeyEdge, Rowless, RowsKind, TableChange, TableLayout
from cdcserver.core.names import TableName

if TYPE_CHECKING:
    from cdcserver.schema.history import SchemaHistory

_CASCADING = frozenset({"cascade", "set null", "set default"})


def statement_markers(changes: Sequence[TableChange], sql: str,
                      hidden: Callable[[TableChange], bool] = lambda change: False
                      ) -> list[Rowless]:
    """A marker for each table whose stored rows a schema statement rewrote or removed. Its
    reason quotes the statement, but for a table ``hidden`` says column rules apply to:
    the text could name an excluded column or hold a value (a DEFAULT)."""
    statement = " ".join(sql.split())
    if len(statement) > 200:
        statement = statement[:197] + "..."
    return [Rowless(c.database, c.table,
                    f"{c.rewrites}: {RULED_STATEMENT if hidden(c) else statement}",
                    layout=c.layout)
            for c in changes if c.rewrites]


def sequence_markers(changes: Sequence[TableChange], history: SchemaHistory) -> list[Rowless]:
    """``CREATE SEQUENCE`` gives the sequence its row without a row event."""
    return [Rowless(c.database, c.table, "CREATE SEQUENCE makes its row without a row event",
                    layout=replace(c.layout, sequence=True))
            for c in changes if c.kind == "create" and c.layout is not None
            and history.is_sequence(TableName(c.database, c.table))]


# Why a session's own choice makes tables be read again (replication/decoder.py); the repair
# stage counts these apart (``cdc_rowless_changes_total{cause="session"}``)
STATEMENT_LOGGED = ("a data change logged as an SQL statement (a session set binlog_format to "
                    "STATEMENT or MIXED): the table is read again")
SAVEPOINT_ROLLBACK = ("a transaction rolled back to a savepoint after changing "
                      "non-transactional tables: which of its rows stand is read from the "
                      "table")
UNSURE_ROLLBACK = ("a transaction rolled back after changing non-transactional tables: which "
                   "of its rows survived is read from the table")
SESSION_REASONS = (STATEMENT_LOGGED, SAVEPOINT_ROLLBACK, UNSURE_ROLLBACK)


_DML_TARGET = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(?:INSERT|REPLACE|UPDATE|DELETE(?:\s+HISTORY)?)"
    r"(?:\s+(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|QUICK|IGNORE))*(?:\s+(?:INTO|FROM))?\s+"
    r"(`(?:[^`]|``)+`|\w+)(?:\s*\.\s*(`(?:[^`]|``)+`|\w+))?(?=\s|\(|$)", re.I | re.S)


def statement_dml_markers(sql: str, database: str, history: SchemaHistory
                          ) -> list[Rowless] | None:
    """MariaDB logs the changes to a table versioned by transaction ids (a ``BIGINT
    UNSIGNED`` period) as statements even with ``binlog_format=ROW``. Such a statement
    changed rows of its table without row events: a marker for it. None when the statement
    is not one of those (its table is not such a table, or cannot be told)."""
    m = _DML_TARGET.match(sql)
    if m is None:
        return None
    first, second = (p.strip("`").replace("``", "`") if p else p for p in m.groups())
    table = TableName(first, second) if second else TableName(database, first)
    definition = history.tables.get(table)
    if definition is None or definition.period is None:
        return None
    start = definition.columns[definition.index(definition.period[0])]
    if start.type != "bigint":
        return None
    from cdcserver.schema.layouts import layout_of

    return [Rowless(table.database, table.table, "a table versioned by transaction ids has "
                    "its changes logged as statements", layout=layout_of(table, definition))]


_QUOTED = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"", re.S)
_COMMENT = re.compile(r"/\*.*?\*/|(?:--\s|#)[^\n]*", re.S)
_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_REFERENCE = re.compile(rf"({_NAME})(?:\s*\.\s*({_NAME}))?")


def statement_tables(sql: str, database: str, history: SchemaHistory) -> list[TableName]:
    """Every table the schema history knows that a data-changing statement names, the
    tables it writes among them (a multi-table ``UPDATE``/``DELETE`` writes any of those it
    joins; ``INSERT ... SELECT`` reads some): more than it changed, never fewer, except what
    its triggers or stored functions change. Literals and comments are not looked in."""
    text = _COMMENT.sub(" ", _QUOTED.sub("''", sql))
    by_lower = {(t.database.lower(), t.table.lower()): t for t in history.tables}
    found: dict[TableName, None] = {}
    for match in _REFERENCE.finditer(text):
        first, second = (_unquoted(p) if p else p for p in match.groups())
        assert first is not None
        key = (first, second) if second else (database, first)
        table = by_lower.get((key[0].lower(), key[1].lower()))
        if table is not None:
            found[table] = None
    return list(found)


def _unquoted(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


class CascadeFinder:
    """Which child rows a parent's row event can have reached, from the foreign keys the
    schema history knows."""

    def __init__(self, history: SchemaHistory) -> None:
        self.history = history

    def markers(self, layout: TableLayout, kind: RowsKind, rows: Sequence[tuple[Any, ...]],
                table_maps: Callable[[], dict[TableName, TableLayout]]) -> list[Rowless]:
        """``table_maps``: the layouts of the tables mapped so far (a child's is there when
        the server logged its table map with the parent's, and is exactly the binlog's)."""
        parent = TableName(layout.database, layout.table)
        children = self.history.children_of(parent)
        if not children:
            return []
        mapped = table_maps()
        names = [c.name.lower() for c in layout.columns]
        edges = self._edges(parent, mapped)
        markers = []
        for child, fk in children:
            action = fk.on_update if kind == RowsKind.UPDATE else fk.on_delete
            if action not in _CASCADING:
                continue
            try:
                index = [names.index(c.lower()) for c in fk.parent_columns]
            except ValueError:
                continue  # the history's key names a column the table map lacks
            values = _referenced(kind, rows, index)
            if not values:
                continue
            verb = "UPDATE" if kind == RowsKind.UPDATE else "DELETE"
            how = "REPLACE" if kind == RowsKind.INSERT else verb
            markers.append(Rowless(
                child.database, child.table,
                f"ON {verb} {action.upper()} of {parent.ref()} ({how} of {len(values)} rows)",
                tuple(fk.columns), tuple(values), self._layout(child, mapped), edges))
        return markers

    def _edges(self, root: TableName, mapped: dict[TableName, TableLayout]
               ) -> tuple[ForeignKeyEdge, ...]:
        """Every cascading foreign key reachable from ``root``."""
        edges: list[ForeignKeyEdge] = []
        queue, seen = [root], {root}
        while queue:
            parent = queue.pop(0)
            for child, fk in self.history.children_of(parent):
                if fk.on_delete not in _CASCADING and fk.on_update not in _CASCADING:
                    continue
                edges.append(ForeignKeyEdge(parent, child, tuple(fk.columns),
                                            tuple(fk.parent_columns), fk.on_delete,
                                            fk.on_update, self._layout(child, mapped)))
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
        return tuple(edges)

    def _layout(self, table: TableName, mapped: dict[TableName, TableLayout]
                ) -> TableLayout | None:
        if table in mapped:
            return mapped[table]
        from cdcserver.schema.layouts import layout_of

        definition = self.history.tables.get(table)
        return layout_of(table, definition) if definition is not None else None


def _referenced(kind: RowsKind, rows: Sequence[tuple[Any, ...]], index: list[int]
                ) -> list[tuple[Any, ...]]:
    """The parent key values the rows event took away: deleted rows' keys, the old keys of
    updated rows whose key changed, and (``REPLACE``) inserted rows' keys."""
    found: dict[tuple[Any, ...], None] = {}
    if kind == RowsKind.UPDATE:
        for before, after in zip(rows[::2], rows[1::2], strict=True):
            old = tuple(before[i] for i in index)
            if old != tuple(after[i] for i in index):
                found[old] = None
    else:
        for row in rows:
            found[tuple(row[i] for i in index)] = None
    return [k for k in found if not any(v is None for v in k)]
