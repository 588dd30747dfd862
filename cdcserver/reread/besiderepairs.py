"""Whole-table repairs read beside the stream (:mod:`.beside`), from the pipeline's side:
launched at the transaction that made the change (a table with one under way queues the
next), the table's changes held meanwhile, their records and then the held changes attached
in shares with a pause between two, and a repair that fails read by the pipeline or its table
quarantined.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import replace

from cdcserver.core.changes import Change, Commit, Ddl, Rowless, Rows
from cdcserver.core.errors import DefinitionChanged
from cdcserver.core.names import TableName
from cdcserver.reread.beside import BesideRepair, HeldStatement, eligible, resync_eligible
from cdcserver.reread.besideprocess import Cancelled
from cdcserver.reread.frozen import FrozenCatalog
from cdcserver.reread.repairstate import UNREACHABLE, repair_note, table_of
from cdcserver.reread.retype import RETYPED_OUT
from cdcserver.reread.retypedout import RetypedOut
from cdcserver.reread.tableview import ViewsClosed

log = logging.getLogger('cdcserver.reread.repair')

SHARE_PAUSE = 0.05  # seconds between two shares of a repair's records beside the stream


class BesideRepairs(RetypedOut):
    """The repair stage, with the repairs read beside the stream."""

    def _launch_held(self, found: list[Rowless]) -> list[Rowless]:
        """The transaction's held statements each start their table's repair beside the
        stream, with its markers (:meth:`_to_hold` checked it can); the other markers."""
        statements, self._statements = self._statements, {}
        cause = str(self._begin.gtid) if self._begin is not None else ""
        for table, statement in statements.items():
            mine = [m for m in found if TableName(m.database, m.table) == table] or \
                [Rowless(table.database, table.table, statement.change.rewrites,
                         layout=statement.change.layout)]
            found = [m for m in found if TableName(m.database, m.table) != table]
            if self._launch(mine, cause, statement):
                self.views.drop(table)  # renamed for a statement the store does not hold
            else:  # (not expected: checked when it was held)
                self._letting_go.append(statement)
                self._inline.append((mine, cause))
        return found

    def _launch(self, markers: list[Rowless], cause: str,
                statement: HeldStatement | None = None) -> bool:
        """Start a whole-table repair beside the stream; False where it cannot be (then the
        pipeline reads it). A table with one under way queues the next until it is out."""
        if not eligible(markers, self.catalog):
            return False
        table = TableName(markers[0].database, markers[0].table)
        if table in self._renamed_tables and statement is None:
            # the store holds another table's rows under this name until the part is
            # stored: the process would fold those. Started with the next batch
            self._again.append((markers, cause))
            return True
        if table in self._beside or table in self._queued:
            self._queued.setdefault(table, []).append((markers, cause))
            return True
        if self._pending.concerns(table):
            return False  # the pipeline's own repair of it waits for its watermark
        unstored = [r for r in self._batch_rows + self._txn_rows if table_of(r.layout) == table]
        self._launched += 1
        path = f"{self.views.path}.repair-{os.getpid()}-{self._launched}"
        repair = BesideRepair(markers, cause, self.address, self.columns,
                              FrozenCatalog(self.catalog, table), unstored, path,
                              self.views.closing,
                              renamed=self._renamed_columns.get(table),
                              statement=statement)
        self._beside[table] = repair
        repair.start()
        return True

    def _launch_resync(self, marker: Rowless, asked: float) -> bool:
        """Start a quarantined table's resync beside the stream (its stored rows hold at least
        ``MIN_BYTES``); False where the pipeline reads it."""
        table = TableName(marker.database, marker.table)
        if not resync_eligible(table, self.catalog) or table in self._beside or \
                table in self._renamed_tables:
            return False
        self._launched += 1
        path = f"{self.views.path}.repair-{os.getpid()}-{self._launched}"
        repair = BesideRepair([marker], "resync", self.address, self.columns,
                              FrozenCatalog(self.catalog, table), [], path,
                              self.views.closing, resync=asked)
        self._beside[table] = repair
        repair.start()
        return True

    def _held(self, rows: Rows) -> bool:
        """Whether ``rows`` wait for their table's repair beside the stream (held): the
        table's consumers get the repair first. Rows that cannot be held (their images do
        not decode) call the repair off and go on (the store says what is wrong with them)."""
        repair = self._beside.get(table_of(rows.layout))
        if repair is None:
            return False
        try:
            repair.hold(rows)
        except Exception as exc:  # noqa: BLE001 - the rows go on; the store says what is wrong
            log.warning("%s: a change of %s could not be held for its repair (%s); the repair "
                        "is called off and read again", repair.cause, repair.table, exc)
            self._reissue += self._call_off(repair.table)
            return False
        return True

    def _withheld(self, rows: Rows) -> list[Rows]:
        """Held ``rows`` (:meth:`_held`), marked withheld where they are: a sink that holds
        the repair from before a restart, read again now, is not given its records (nor
        the changes they fold in) and gets the table's changes in place instead. A resync
        has no such sink."""
        repair = self._beside[table_of(rows.layout)]
        if repair.resync is not None:
            return []
        self.marked = True
        return [replace(rows, withheld=repair.cause)]

    async def _attach_beside(self, commit: Commit) -> list[Change]:
        """What the repairs beside the stream bring to ``commit``: a failed one's held
        statement (the repair is dealt with, :meth:`_beside_failed`), or the next share of
        a due one's records; a repair whose last share is out is done."""
        out: list[Change] = []
        for table, repair in list(self._beside.items()):
            if repair.done.is_set() and (repair.error is not None or repair.fallback):
                self._beside.pop(table)
                if repair.letting_go is not None:  # before whoever reads the table next
                    out += await self._let_go([repair.letting_go])
                repair.close()  # (its held changes: whoever reads the table next holds them)
                self._beside_failed(repair)
                continue
            if time.monotonic() < self._next_share or not repair.due(commit):
                continue
            started = time.monotonic()
            out += await self._share(table, repair, commit)
            # the stream's own transactions get the rest of the time
            self._next_share = time.monotonic() + SHARE_PAUSE + 0.5 * (time.monotonic() -
                                                                        started)
            if repair.finished:
                self._beside_done(table, repair)
        return out

    async def _share(self, table: TableName, repair: BesideRepair, commit: Commit
                     ) -> list[Change]:
        """The repair's next share in ``commit``: the rows its held statement retypes, then
        the statement; then its records (a resync's release first); then the table's changes
        held meanwhile, in their order."""
        if repair.letting_go is not None:  # first the rows it retypes, then it
            note = repair_note(f"{repair.letting_go.change.rewrites}: {RETYPED_OUT}",
                               repair.cause)
            first = await asyncio.to_thread(repair.attach_retyped, commit, note)
            self.marked = self.marked or any(isinstance(c, Ddl) for c in first)
            self._txn_rows += [r for r in first if isinstance(r, Rows)]
            return first
        if repair.attached:  # then the table's changes held meanwhile, in their order
            released = repair.release(commit)
            self._txn_rows += released
            self.marked = self.marked or any(r.released for r in released)
            return list(released)
        out: list[Change] = []
        if not repair.sent:
            await asyncio.to_thread(self.views.locked, self.views.drop, table)
        if repair.resync is not None and not repair.released:
            assert repair.point is not None
            repair.released = True
            out += self._release(table, repair.layout, repair.reason, repair.point,
                                 repair.resync, commit, "the records that follow")
        made = await asyncio.to_thread(repair.attach, commit,
                                       repair_note(repair.reason, repair.cause))
        for rows in made:
            self.stats.records[rows.kind] = self.stats.records.get(rows.kind, 0) + \
                len(rows.rows)
        return out + made

    def _beside_done(self, table: TableName, repair: BesideRepair) -> None:
        """The repair's last share is out: the table streams live again, and the repairs
        queued behind it are read."""
        self._beside.pop(table)
        repair.close()
        self.stats.repairs += 1
        assert repair.point is not None
        log.info("%s: repaired %d rows at the watermark %s:%d beside the stream, in "
                 "%.1f s; %d changes of its rows waited for it (%d of them were "
                 "read already) (%s)", table, repair.sent, repair.point.file,
                 repair.point.pos, time.monotonic() - repair.started,
                 repair.held.held, repair.dropped, repair_note(repair.reason, repair.cause))
        self.stats.repaired(table, repair.reason, repair.cause, repair.sent)
        self._reissue += self._queued.pop(table, [])

    def _beside_failed(self, repair: BesideRepair) -> None:
        exc = repair.error
        if isinstance(exc, (Cancelled, ViewsClosed)):
            return  # called off: whoever did it reads the markers again
        retried = exc is not None and isinstance(exc, (*UNREACHABLE, DefinitionChanged))
        if repair.resync is not None and (repair.fallback or retried):
            log.info("%s: its resync is read by the pipeline: %s", repair.table,
                     repair.fallback or exc)
            self._resyncs[repair.table] = (repair.reason.removeprefix("resync: "),
                                           repair.resync)
            self._resync_here.add(repair.table)
            return
        if repair.fallback:
            log.info("%s: the repair of %s is read by the pipeline: %s", repair.cause,
                     repair.table, repair.fallback)
        elif exc is not None and not (isinstance(exc, (*UNREACHABLE, DefinitionChanged))):
            self._give_up(repair.markers, repair.cause, exc)
            self._queued.pop(repair.table, None)
            return
        else:
            log.warning("re-reading the rows %s changed: %s; the pipeline reads them",
                        repair.cause, exc)
        self._inline.append((repair.markers, repair.cause))
        self._inline += self._queued.pop(repair.table, [])
