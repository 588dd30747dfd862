"""Steps 1 and 2 of a repair (:mod:`.repair`): what to read, and reading it. The rows
concerned are found in the stream's views (for a cascade, the rows whose foreign-key columns
held the parent keys, following further cascades from there; otherwise every row), then read
from the source in one consistent read whose position is the repair's watermark
(:mod:`.readview`). A whole big table is read beside the stream instead
(:mod:`.besiderepairs`); a source that cannot be reached is tried again, then stops the
pipeline; a table that cannot be read is quarantined.
"""

from __future__ import annotations

import asyncio
import logging

from cdcserver.core.changes import Commit, Rowless, TableLayout
from cdcserver.core.errors import DefinitionChanged, SourceUnavailable
from cdcserver.core.names import TableName
from cdcserver.reread.besiderepairs import BesideRepairs
from cdcserver.reread.difference import Scope, differences, reached, same_shape, view_key
from cdcserver.reread.markers import cascades
from cdcserver.reread.pendingrepairs import Pending
from cdcserver.reread.readview import ReadView, definition_changed, unreachable
from cdcserver.reread.repairstate import UNREACHABLE
from cdcserver.reread.tableview import Row, TableView, ViewsClosed

log = logging.getLogger('cdcserver.reread.repair')

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


class Rereads(BesideRepairs):
    """The repair stage, with its reads of the rows concerned at a watermark."""

    async def _start(self, markers: list[Rowless], cause: str, commit: Commit | None, *,
                     resync: float | None = None, beside_ok: bool = True) -> None:
        """Read what ``markers`` name at a watermark; the repair waits for the stream there
        (``commit``: the transaction that made the changes, not yet passed on; ``resync``:
        when a quarantined table's resync was asked for). A source that cannot be reached
        stops the pipeline for a restart (:class:`SourceUnavailable`); a table that cannot
        be read is quarantined, and every other table goes on."""
        self._reading += 1
        try:
            await self._read_and_wait(list(markers), cause, commit, resync, beside_ok)
        finally:
            self._reading -= 1

    async def _read_and_wait(self, markers: list[Rowless], cause: str, commit: Commit | None,
                             resync: float | None, beside_ok: bool) -> None:
        if beside_ok and (self._launch(markers, cause) if resync is None else
                          self._launch_resync(markers[0], resync)):
            return
        tables = {TableName(m.database, m.table) for m in markers}
        tables |= {e.child for m in markers for e in m.edges}
        held = sorted(t for t in tables if t in self._beside)
        if held and resync is None:  # its rows wait for its repair: read after it
            self._queued.setdefault(held[0], []).append((markers, cause))
            return
        pending = await self._read_with_retries(markers, tables, cause)
        if pending is None:
            return  # no row of the stream concerned, or the tables given up
        if resync is not None:
            pending.resync, pending.started = True, resync
            self._resyncing |= tables
        self._pending.add(pending)
        if commit is None or not reached(commit.position, pending.point):
            log.info("%s: the repair of %s waits for the stream to reach %s:%d", cause,
                     ", ".join(sorted({m.qualified_name for m in markers})),
                     pending.point.file, pending.point.pos)

    async def _read_with_retries(self, markers: list[Rowless], tables: set[TableName],
                                 cause: str) -> Pending | None:
        """:meth:`_read`, tried again while the source does not answer or a schema statement
        races it; None where no row of the stream is concerned, or the tables are given up
        (:meth:`_give_up`). A source that still does not answer at the last try stops the
        pipeline (:class:`SourceUnavailable`)."""
        for attempt in range(len(RETRY_DELAYS) + 1):
            last = attempt == len(RETRY_DELAYS)
            try:
                return await asyncio.to_thread(self.views.locked, self._read, markers, tables,
                                               cause)
            except UNREACHABLE as exc:
                if definition_changed(exc):  # a schema statement raced the read: again
                    if last:
                        self._give_up(markers, cause, exc)
                        return None
                elif not unreachable(exc):
                    self._give_up(markers, cause, exc)
                    return None
                if last:
                    raise SourceUnavailable(f"cannot re-read the rows {cause} changed without "
                                            f"row events: {exc}") from exc
                failure: BaseException = exc
            except DefinitionChanged as exc:  # a schema statement raced the read: again
                if last:
                    self._give_up(markers, cause, exc)
                    return None
                failure = exc
            except ViewsClosed:
                raise  # the pipeline stops: the repair is read again after the restart
            except Exception as exc:  # noqa: BLE001 - a fault of these tables, not the source's
                self._give_up(markers, cause, exc)
                return None
            log.warning("re-reading the rows %s changed: %s; trying again", cause, failure)
            await asyncio.sleep(RETRY_DELAYS[attempt])
        return None  # (not reached: the last try returns or raises)

    def _read(self, markers: list[Rowless], tables: set[TableName], cause: str
              ) -> Pending | None:
        """In a thread: the scopes' candidate rows from the views, then the source's rows for
        them at one watermark, following cascades as far as they reach. None when no row of
        the stream is concerned."""
        scopes: dict[TableName, Scope] = {}
        queue = []
        for marker in markers:
            view = self._view(TableName(marker.database, marker.table), marker.layout) \
                if marker.layout is not None else None
            if self._scope(scopes, marker, view, marker.layout) is not None:
                queue.append(marker)
        if not queue:
            return None
        read = ReadView(self.address, sorted(tables), self.columns)
        try:
            done: set[TableName] = set()
            while queue:
                marker = queue.pop(0)
                scope = scopes[TableName(marker.database, marker.table)]
                if scope.table in done and scope.keys is None:
                    continue
                changed = self._read_scope(read, scope)
                done.add(scope.table)
                for follow in cascades(marker, changed):
                    child = self._view(TableName(follow.database, follow.table),
                                       follow.layout) if follow.layout is not None else None
                    if self._scope(scopes, follow, child, follow.layout) is not None:
                        queue.append(follow)
            return Pending(read.point, cause, list(scopes.values()), markers)
        finally:
            read.close()

    @staticmethod
    def _scope(scopes: dict[TableName, Scope], marker: Rowless, view: TableView | None,
               layout: TableLayout | None) -> Scope | None:
        """Add the rows ``marker`` names to its table's scope; None when it adds none. A
        table whose columns the stream does not know (``layout`` None) is read whole, in
        the columns the source gives it."""
        table = TableName(marker.database, marker.table)
        scope = scopes.get(table)
        if scope is None:
            scope = scopes[table] = Scope(table, layout, marker.reason, set())
        elif marker.reason not in scope.reason:
            scope.reason += f"; {marker.reason}"
        if view is None or not marker.columns or not view.key:
            scope.keys = None  # every row (a table without a key is compared whole)
        elif scope.keys is not None:
            before = len(scope.keys)
            scope.keys |= {view.key_of(r) for r in view.matching(marker.columns, marker.values)}
            if len(scope.keys) == before:
                return None
        return scope

    def _read_scope(self, read: ReadView, scope: Scope) -> list[tuple[Row | None, Row | None]]:
        """Read the scope's rows at the watermark; return how the view's rows differ from
        them there (for following cascades). A whole table is read in the columns the
        source gives it at the watermark, and so are the named rows of a table whose
        columns there are not the stream's (the source has moved on: the rows the stream
        names may no longer be found by the stream's columns)."""
        source = read.source_layout(scope.table)
        if scope.key is None:
            scope.key = view_key(scope.layout, source)
        if source is not None and (scope.keys is None or scope.layout is None or
                                   not same_shape(scope.layout, source)):
            if scope.keys is not None:
                log.info("%s: its columns on the source are not the stream's here; the "
                         "whole table is read", scope.table)
                self.stats.widened += 1
                scope.reason += " (the whole table was read again: its columns on the " \
                                "source were no longer the stream's)"
            scope.keys, scope.layout = None, source
        if scope.layout is None:  # gone from the source, and never known: nothing to read
            scope.source = {}
            return []
        layout = scope.layout
        view = self._scope_view(scope)
        names = [c.name for c in layout.columns]
        if scope.keys is None:
            rows = read.rows(layout)
        else:
            index = layout.primary_key
            wanted = [view.get(k) for k in scope.keys]
            keys = [tuple(r[names[i]] for i in index) for r in wanted if r is not None]
            rows = read.rows(layout, index, keys)
        scope.source = {}
        for values in rows:
            row = dict(zip(names, values, strict=True))
            key = view.key_of(row)
            known = scope.source.get(key)
            scope.source[key] = (row, known[1] + 1 if known else 1)
        return differences(view, scope)
