"""Following what a repair was recognised for (its :class:`~cdcserver.core.changes.Rowless`
markers) through what happens next: the cascades its changed rows set off in child tables, the
statements that rename its table before it is read, and repairs merged into one read."""

from __future__ import annotations

from dataclasses import replace

from cdcserver.core.changes import (
    Ddl,
    Rowless,
    TableChange,
)
from cdcserver.core.names import TableName
from cdcserver.reread.tableview import Row

_CASCADING = frozenset({"cascade", "set null", "set default"})


def cascades(marker: Rowless, changed: list[tuple[Row | None, Row | None]]) -> list[Rowless]:
    """Where the rows a repair changes are themselves parents: the rows of their children
    that a cascade may have reached too."""
    table = TableName(marker.database, marker.table)
    follow = []
    for edge in marker.edges:
        if edge.parent != table:
            continue
        values, events = [], set()
        for mine, theirs in changed:
            if mine is None:
                continue
            before = tuple(mine.get(c) for c in edge.parent_columns)
            if any(v is None for v in before):
                continue
            deleted = theirs is None and edge.on_delete in _CASCADING
            rekeyed = theirs is not None and edge.on_update in _CASCADING and \
                before != tuple(theirs.get(c) for c in edge.parent_columns)
            if deleted or rekeyed:
                values.append(before)
                events.add(f"ON DELETE {edge.on_delete.upper()}" if deleted
                           else f"ON UPDATE {edge.on_update.upper()}")
        if values:
            follow.append(Rowless(edge.child.database, edge.child.table,
                                  f"{', '.join(sorted(events))} of {table.ref()}",
                                  edge.columns, tuple(values), edge.layout, marker.edges))
    return follow


def retarget(marker: Rowless, ddl: Ddl) -> Rowless | None:
    """``marker`` after ``ddl``: under the table's new name and columns (following every
    rename of one statement in order: ``RENAME TABLE a TO tmp, b TO a, tmp TO b`` moves a's
    rows to b); None when the statement dropped or emptied the table (and with it the rows
    to repair)."""
    came_from = None  # the name a rename just moved the marker from: its create is that move
    for change in ddl.changes:
        if (change.database, change.table) != (marker.database, marker.table):
            continue
        if change.kind == "create" and change.renamed is not None and \
                change.renamed == came_from:
            came_from = None
            if change.layout is not None:
                marker = replace(marker, layout=change.layout)
            continue
        if change.kind == "drop" and change.renamed is not None:
            came_from = TableName(marker.database, marker.table)
            marker = replace(marker, database=change.renamed.database,
                             table=change.renamed.table)
            continue
        if change.kind in ("drop", "truncate", "create"):
            return None
        if change.layout is not None:
            marker = replace(marker, layout=change.layout)
    return marker


def keeps_rows(change: TableChange) -> bool:
    """Whether a consumer's rows of the table stay as they are through ``change``: an
    ALTER of known columns writes no record and empties nothing, so the view goes on as
    folding the store again would build it (a new primary key re-keys it when next used)."""
    return change.kind == "alter" and change.layout is not None


MAX_CAUSES = 8  # GTIDs a merged repair's cause names
OTHERS = "and others"


def named(cause: str) -> list[str]:
    """What a repair's cause names: its transactions (GTIDs), and :data:`OTHERS` last where
    :func:`together` named only the first few."""
    return cause.split(", ")


def together(repairs: list[tuple[list[Rowless], str]]) -> tuple[list[Rowless], str]:
    """Several repairs as one: every marker, read at one watermark; the cause names the
    transactions (the first few, then "and others")."""
    markers = [m for found, _ in repairs for m in found]
    causes = list(dict.fromkeys(c for _, cause in repairs for c in named(cause)))
    more = OTHERS in causes or len(causes) > MAX_CAUSES
    first = [c for c in causes if c != OTHERS][:MAX_CAUSES]
    return markers, ", ".join([*first, OTHERS] if more else first)
