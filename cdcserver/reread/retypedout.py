"""Rows an ``ALTER`` retypes, out before it: deleted in the old version exactly as a consumer
holds them, so that no before-image is a row in a form it was never held in (the repair then
inserts them as the table has them). Read by the pipeline at the statement, or, for a big
table repaired beside the stream, the statement itself is held for that repair
(:class:`.beside.HeldStatement`) and lets go, after the rows it retypes, when the repair is
called off or fails.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from cdcserver.core.changes import Change, Ddl, Rows, RowsKind, TableChange
from cdcserver.core.names import TableName
from cdcserver.reread.beside import HeldStatement, big
from cdcserver.reread.difference import Fit
from cdcserver.reread.repairstate import RepairState, repair_note, table_of
from cdcserver.reread.retype import RETYPED_OUT, may_render_otherwise, renders_otherwise, retyped
from cdcserver.reread.tableview import Row
from cdcserver.reread.view import key_names
from cdcserver.schema.rewrites import DROP_VERSIONING, VERSIONING_REWRITES

log = logging.getLogger('cdcserver.reread.repair')


class RetypedOut(RepairState):
    """The repair stage, with the rows an ALTER retypes and the statements held for them."""

    async def _retyped_rows_out(self, ddl: Ddl) -> list[Rows]:
        """Before an ALTER the new version cannot tell a held row in, that row deleted in the
        old version, exactly as held; the repair then inserts it as the table has it, and no
        before-image is a row in a form it was never held in:

        - a retyped column whose new type renders its value otherwise (:mod:`.retype`), where
          the statement is not held for its table's repair beside the stream
          (:meth:`_to_hold`);
        - ``DROP SYSTEM VERSIONING``: every row, keyed with its ``row_end`` in the old
          version (in the new one a history row's delete would name its id only, which is the
          current row's too)."""
        out: list[Rows] = []
        for change in ddl.changes:
            table = TableName(change.database, change.table)
            previous = change.previous
            if change.kind != "alter" or not change.rewrites or previous is None or \
                    change.layout is None or not previous.primary_key or \
                    table in self._quarantined or table in self._beside or \
                    table in self._queued:
                continue
            unversioned = DROP_VERSIONING in change.rewrites
            columns = {} if unversioned else retyped(change, previous)
            if not unversioned and not may_render_otherwise(columns):
                continue
            view = await asyncio.to_thread(self.views.locked, self._view, table, previous)
            gone = [row for row, _ in view.rows()
                    if unversioned or renders_otherwise(row, columns)]
            what = "the rows go out again without their period" if unversioned else RETYPED_OUT
            out += self._deleted_before(ddl, change, gone, what,
                                        str(self._begin.gtid) if self._begin else "")
        return out

    @staticmethod
    def _deleted_before(ddl: Ddl, change: TableChange, gone: list[Row], what: str,
                        cause: str) -> list[Rows]:
        """``gone`` (rows of the table before the statement), deleted in the old version
        exactly as held, before the statement."""
        if not gone:
            return []
        assert change.previous is not None
        previous = change.previous
        names, fit = [c.name for c in previous.columns], Fit(previous)
        note = repair_note(f"{change.rewrites}: {what}", cause)
        return [Rows(previous, RowsKind.DELETE, ddl.timestamp,
                     [tuple(map(fit(row, None).get, names)) for row in gone],
                     ddl.file, ddl.pos, repair=note, start=ddl.start)]

    # -- statements held for a repair beside the stream (:class:`.beside.HeldStatement`) --

    def _to_hold(self, ddl: Ddl) -> HeldStatement | None:
        """The statement, where it is an ALTER of a table repaired beside the stream whose
        new types may render some stored value otherwise: held for the repair, which finds
        the rows concerned. None where the pipeline reads them now (:meth:`_retyped_rows_out`)
        or there are none."""
        if len(ddl.changes) != 1:
            return None
        change = ddl.changes[0]
        table = TableName(change.database, change.table)
        previous, layout = change.previous, change.layout
        if change.kind != "alter" or not change.rewrites or previous is None or \
                layout is None or not previous.primary_key or not layout.primary_key or \
                layout.sequence or table in self._quarantined or \
                any(rewrite in change.rewrites for rewrite in VERSIONING_REWRITES) or \
                self._pending.concerns(table):
            return None
        if not big(self.catalog, table) or \
                not may_render_otherwise(retyped(change, previous)):
            return None
        return HeldStatement(ddl, change, str(self._begin.gtid) if self._begin else "")

    def _held_statements(self, ddl: Ddl) -> list[HeldStatement]:
        """The statements held for the repairs of the tables ``ddl`` touches: they go out
        now, before it (it calls the repairs off)."""
        touched = {TableName(c.database, c.table) for c in ddl.changes} | \
            {c.renamed for c in ddl.changes if c.renamed is not None}
        held = []
        for table in touched:
            repair = self._beside.get(table)
            if repair is not None and repair.letting_go is not None:
                held.append(repair.letting_go)
                repair.statement = None  # let go here, not again when called off
        return held

    async def _let_go(self, held: list[HeldStatement] | None = None) -> list[Change]:
        """Statements held for repairs that were called off or failed (``held``; by default
        those waiting), each after the rows it retypes, read from the store here (the
        pipeline waits), deleted in the old version."""
        if held is None:
            held, self._letting_go = self._letting_go, []
        out: list[Change] = []
        for statement in held:
            gone = await asyncio.to_thread(self.views.locked, self._retyped_now, statement)
            deleted = self._deleted_before(statement.ddl, statement.change, gone, RETYPED_OUT,
                                           statement.cause)
            self._txn_rows += deleted
            out += [*deleted, replace(statement.ddl, released=statement.cause)]
            self.marked = True
            self._let_go_out.add(statement.cause)
            log.info("%s: its repair beside the stream did not finish; the statement it held "
                     "goes out, after %d rows it retypes", statement.table,
                     sum(len(r.rows) for r in deleted))
        return out

    def _retyped_now(self, statement: HeldStatement) -> list[Row]:
        """(In a thread, views locked.) The table's rows before the statement (the store
        holds no later version of it) whose values its new types render otherwise."""
        table, previous = statement.table, statement.previous
        self.views.drop(table)
        view = self.views.fold(self.catalog, table, key_names(previous))
        for rows in self._batch_rows + self._txn_rows:  # not in the store yet
            if table_of(rows.layout) == table:
                view.apply(rows)
        columns = retyped(statement.change, previous)
        gone = [row for row, _ in view.rows() if renders_otherwise(row, columns)]
        self.views.drop(table)
        return gone
