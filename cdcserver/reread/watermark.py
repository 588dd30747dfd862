"""Steps 3 and 4 of a repair (:mod:`.repair`): the stream reaching a repair's watermark. Until
then a change of a table the repair waits on is told against the rows the stream holds
(:mod:`.asheld`), and rows the stream changes after the watermark are its own truth (they
leave the repair); at the transaction that reaches it, the difference between the view and
the rows read is attached as ordinary records, and a resync releases its table there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from cdcserver.core.changes import Change, Commit, Rows, RowsKind
from cdcserver.core.names import TableName
from cdcserver.reread.asheld import as_held
from cdcserver.reread.difference import Stand, records
from cdcserver.reread.pendingrepairs import Pending
from cdcserver.reread.repairstate import RepairState, repair_note, table_of
from cdcserver.reread.tableview import Row, pack
from cdcserver.reread.view import key_names

log = logging.getLogger('cdcserver.reread.repair')


class Watermarks(RepairState):
    """The repair stage, with its repairs reaching their watermarks."""

    async def _as_held(self, rows: Rows) -> list[Rows]:
        """A change of a table whose repair waits for its watermark, told against the rows
        the stream holds (:mod:`.asheld`): every before-image true. Others as they are."""
        table = table_of(rows.layout)
        key = key_names(rows.layout)
        waiting = self._pending.before(table, rows.file, rows.pos) \
            if key and not rows.layout.sequence else []
        if not waiting:
            return [rows]
        overlay = self._overlay.setdefault(table, {})
        told = await asyncio.to_thread(self.views.locked, self._told_as_held, rows, key,
                                       overlay)
        if (len(told) == 1 and told[0] is rows) or self._unplaced_change_of(table):
            return told
        causes = _covering(waiting, table, key, rows) or \
            tuple(sorted({p.cause for p in waiting}))
        # A sink that holds those repairs from before a restart (the replay reads them
        # again) holds the source's rows: the binlog's change is its own (the sinks' replay
        # filters choose, pipeline._ReplayFilter)
        self.marked = True
        return [replace(rows, as_logged_for=causes),
                *(replace(t, as_held_for=causes) for t in told)]

    def _unplaced_change_of(self, table: TableName) -> bool:
        """Whether a change without rows of ``table`` is not pending yet (found in the open
        transaction, or to be read again at its commit): no sink holds its repair, so the
        binlog's rows are no sink's."""
        waiting = [m for markers, _ in (*self._inline, *self._reissue) for m in markers]
        return any(TableName(m.database, m.table) == table for m in (*self._found, *waiting))

    def _told_as_held(self, rows: Rows, key: tuple[str, ...],
                      overlay: dict[bytes, Row | None]) -> list[Rows]:
        """In a thread, views locked: :func:`as_held` against the view keyed like ``rows``.
        A repair's view may be keyed otherwise: by the source's key where the source has
        moved on by its watermark (versioning added since, whose ``row_end`` joins the key),
        or dropped by a statement since; it is folded again here, and again by the repair
        (which reads it anew at that statement anyway)."""
        return as_held(rows, self._keyed_view(table_of(rows.layout), key), overlay)

    def _merge(self, rows: Rows) -> None:
        """Rows the stream changes after a pending repair's watermark are its own truth."""
        table = table_of(rows.layout)
        for pending in self._pending.passed(table, rows.file, rows.pos):
            for scope in pending.scopes:
                if scope.table == table and scope.keys is not None:
                    view = self.views.get(table)
                    if view is None:
                        continue
                    names = [c.name for c in rows.layout.columns]
                    for values in rows.rows:
                        key = view.key_of(dict(zip(names, values, strict=True)))
                        scope.keys.discard(key)
                        scope.source.pop(key, None)

    async def _attach_due(self, commit: Commit) -> list[Change]:
        stand = Stand(commit.position)
        due = self._pending.take_reached(stand)
        if not due:
            return []
        out: list[Change] = []
        for pending in due:
            if pending.resync:
                out += self._released(pending, commit)
            rows = await asyncio.to_thread(self.views.locked, self._difference, pending,
                                           commit)
            self._batch_rows += rows  # a view folded again in this part must hold them
            out += rows
        return out

    def _released(self, pending: Pending, commit: Commit) -> list[Change]:
        """A resync reached its watermark: the table is released, with a version of its own
        (the table's columns on the source there) that its difference is written in."""
        out: list[Change] = []
        for scope in pending.scopes:
            out += self._release(scope.table, scope.layout, scope.reason, pending.point,
                                 pending.started, commit,
                                 "the records of this transaction that follow")
        return out

    def _difference(self, pending: Pending, commit: Commit) -> list[Rows]:
        out: list[Rows] = []
        for scope in pending.scopes:
            if scope.layout is None:
                continue
            view = self._scope_view(scope)
            note = repair_note(scope.reason, pending.cause)
            made = records(scope, view, note, commit)
            for rows in made:
                view.apply(rows)
                self.stats.records[rows.kind] = self.stats.records.get(rows.kind, 0) + \
                    len(rows.rows)
            count = sum(len(r.rows) // (2 if r.kind == RowsKind.UPDATE else 1) for r in made)
            if made:
                log.info("%s: repaired %d rows at the watermark %s:%d (%s)", scope.table,
                         count, pending.point.file, pending.point.pos, note)
            self.stats.repaired(scope.table, scope.reason, pending.cause, count)
            out += made
        self.stats.repairs += 1
        return out


def _covering(waiting: list[Pending], table: TableName, key: tuple[str, ...],
              rows: Rows) -> tuple[str, ...]:
    """Of the repairs ``waiting`` for ``table``, the causes of those whose rows include one
    ``rows`` changes: a sink that holds those holds the source's rows for these keys, and
    the binlog's images are its own, whatever other repairs of the table it does not hold
    (soak seed 100: after a resume in the process, the store held a cascade's repair from
    the run before and not a later cascade's of other rows, and was given a delete told
    against rows without the first). A repair of the whole table, or one whose rows were
    keyed otherwise, includes every row. Empty when none is known to include them."""
    index = rows.layout.primary_key  # ``key``'s columns, as TableView.key_of packs them
    keys = {pack(tuple(values[i] for i in index)) for values in rows.rows}
    causes = set()
    for pending in waiting:
        for scope in pending.scopes:
            if scope.table != table:
                continue
            if scope.keys is None or scope.key != key or scope.layout is None or \
                    key_names(scope.layout) != key or keys & scope.keys or \
                    not keys.isdisjoint(scope.source):
                causes.add(pending.cause)
                break
    return tuple(sorted(causes))
