"""The repair stage: changes the binlog carries no rows for become ordinary change records.

The pipeline passes every batch through :meth:`Repairer.process` before the sinks. Where a
transaction holds :class:`~cdcserver.core.changes.Rowless` markers (the decoder recognised a foreign
key's cascade, a partition's truncation, a value-rewriting ALTER...), the stage, before the
transaction goes on:

1. finds the rows concerned in the stream's own view of the table (:mod:`.view`): for a cascade
   the rows whose foreign-key columns held the parent keys the transaction deleted or changed
   (following further cascading foreign keys from there), otherwise every row;
2. reads exactly those rows from the source in one consistent read (:mod:`.readview`), whose
   binlog position and GTID state are the *watermark* S;
3. waits for the stream to reach S: right away if the transaction itself ends at S (the
   source had nothing newer), else at the later transaction after which the stream's GTID
   state is S's; changes the stream carries for those rows after S are its own truth, so such
   rows leave the repair (the merge step of DBLog's watermark algorithm);
4. at that point compares the view with the rows read and appends the difference to that
   transaction as ordinary records (``insert``, ``update_before``/``update_after``,
   ``delete``; ``Rows.repair`` says why), so a consumer that applies the stream holds the
   table as the source has it.

Steps 1 and 2 are :mod:`.rereads` (a big table's whole-table repair is read beside the
stream instead: :mod:`.besiderepairs`), steps 3 and 4 :mod:`.watermark`; the rows an ALTER
retypes go out before it (:mod:`.retypedout`); the stream's last transaction waits for a
repair beside the stream when the source writes nothing more (:mod:`.lastcommit`). The state
these share is :mod:`.repairstate`, what they count :mod:`.repairstats`; :class:`Repairer`
passes each change on.

The checkpoint never passes a rowless change that was not repaired: while a repair waits for
its watermark the pipeline writes no checkpoint (:attr:`Repairer.pending`), nor does a full
disk's pause, so a crash, or a pipeline started again in the same process, replays the change
and it is recognised again (the next pipeline takes over only the resyncs under way,
:meth:`Repairer.take_over`). A case
that cannot be repaired exactly (the table's columns are unknown) stops replication before
the change's ``Commit`` reaches any sink, with the way out in the message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    Quarantine,
    Rowless,
    Rows,
    RowsKind,
)
from cdcserver.core.names import TableName
from cdcserver.replication.rowless import SESSION_REASONS
from cdcserver.reread.difference import past_watermark
from cdcserver.reread.lastcommit import LastCommit
from cdcserver.reread.markers import keeps_rows, retarget, together
from cdcserver.reread.repairstate import table_of
from cdcserver.reread.view import Views
from cdcserver.schema.masking import project_layout

log = logging.getLogger(__name__)

class Repairer(LastCommit):
    """The repair stage (see the module's description): each batch passes through
    :meth:`process` before the sinks."""

    def take_marked(self) -> bool:
        """Whether the output since the last call holds changes marked withheld or released
        (:attr:`.Rows.withheld`), for the pipeline's replay filters to sort."""
        marked, self.marked = self.marked, False
        return marked

    @property
    def pending(self) -> bool:
        """Whether a repair waits for the stream to reach its watermark, or to be read (then
        no checkpoint may be written: it would pass the change the repair is for). A repair
        read again after a schema statement is in no list while it is read: the pipeline's
        flush looks in meanwhile, and the transactions since its change are stored."""
        return bool(self._pending or self._again or self._beside or self._queued or
                    self._inline or self._reissue or self._reading or self._letting_go)

    def waiting(self) -> list[dict[str, Any]]:
        """What holds the checkpoint back (:attr:`pending`), one entry per repair: its
        tables, the transaction it is for, and the stage it is in, for /health."""
        out: list[dict[str, Any]] = [
            {"stage": stage, "tables": sorted({m.qualified_name for m in markers}),
             "cause": cause} for stage, markers, cause in self._by_stage()]
        out += [{"stage": "its statement goes out", "tables": [s.table.ref()],
                 "cause": s.cause} for s in self._letting_go]
        if self._reading:
            out.append({"stage": "being read", "tables": [], "cause": "",
                        "count": self._reading})
        return out

    def waiting_causes(self) -> frozenset[str] | None:
        """The causes of :meth:`waiting`'s repairs, without building its entries (the
        pipeline asks after every part, and a lagging stream may hold thousands); None while
        one is being read (its cause is not at hand yet)."""
        if self._reading:
            return None
        waiting = self._pending.causes()  # (the same set while none comes or goes)
        others = {cause for _, _, cause in self._other_stages()}
        others.update(s.cause for s in self._letting_go)
        if "" in waiting or "" in others:
            return None
        return waiting | others if others - waiting else waiting

    def _by_stage(self) -> Iterator[tuple[str, list[Rowless], str]]:
        """The repairs waiting that are known by their markers: stage, markers and cause."""
        for p in self._pending:
            yield "waits for its watermark", p.markers, p.cause
        yield from self._other_stages()

    def _other_stages(self) -> Iterator[tuple[str, list[Rowless], str]]:
        """:meth:`_by_stage`'s repairs that do not wait for a watermark (a few at a time)."""
        for markers, cause in self._again:
            yield "read again (carried over)", markers, cause
        for b in self._beside.values():
            yield "read beside the stream", b.markers, b.cause
        for queued in self._queued.values():
            for markers, cause in queued:
                yield "queued behind the table's repair beside the stream", markers, cause
        for markers, cause in self._inline:
            yield "to be read by the pipeline", markers, cause
        for markers, cause in self._reissue:
            yield "read again at this commit", markers, cause

    def request_resync(self, table: TableName, why: str) -> bool:
        """Read a quarantined table again at a watermark and release it there (in the first
        batch from now); False if one is asked for or under way already."""
        if table in self._resyncs or table in self.resyncing:
            return False
        self._resyncs[table] = (why, time.monotonic())
        return True

    @property
    def resyncing(self) -> set[TableName]:
        return set(self._resyncs) | self._resyncing | \
            {t for t, r in self._beside.items() if r.resync is not None}

    def carry_over(self) -> list[tuple[list[Rowless], str]]:
        """The waiting repairs (markers and cause), for the next pipeline's repairer. (Not
        the statements held for repairs beside the stream: no checkpoint passed them, so the
        next pipeline, which starts at the sinks' checkpoints, holds them again.)"""
        beside = [(b.markers, b.cause) for b in self._beside.values()]
        for repair in self._beside.values():
            repair.cancel()
        queued = [q for waiting in self._queued.values() for q in waiting]
        return [(p.markers, p.cause) for p in self._pending] + self._again + beside + \
            queued + self._inline

    def stop(self) -> None:
        """The pipeline stopped: the repairs beside the stream end, and the changes they held
        are dropped (no checkpoint passed them: the binlog gives them again; their markers
        stay for :meth:`carry_over`)."""
        for repair in self._beside.values():
            repair.cancel()

    def take_over(self, waiting: list[tuple[list[Rowless], str]]) -> None:
        """Of the repairs a previous pipeline left waiting, the resyncs, asked for again
        (each read in the first batch, released at its watermark). Every other one is the
        repair of a change the replay brings again and recognises again: it starts at the
        sinks' checkpoints, which never pass a change whose repair is pending (taken over
        as well, it was read twice)."""
        for markers, cause in waiting:
            if cause != "resync":
                continue
            for marker in markers:
                table = TableName(marker.database, marker.table)
                self._resyncs.setdefault(table, (marker.reason.removeprefix("resync: "),
                                                 time.monotonic()))

    @property
    def placing_beside(self) -> bool:
        """Whether a repair beside the stream has placed part of its records (a share at a
        time) and not the rest: which of its rows a sink holds is not a matter of its cause
        alone then. So too while the repair of a cause whose held statement went out
        without it (:meth:`_let_go`) is pending: a sink given the statement holds part of
        what that cause brings."""
        if any(b.placed_any for b in self._beside.values()):
            return True
        if self._let_go_out:
            self._let_go_out &= {entry["cause"] for entry in self.waiting()}
        return bool(self._let_go_out)

    @property
    def reading_beside(self) -> bool:
        """Whether a repair reads beside the stream (the pipeline then looks in, with
        :meth:`idle`, while the source writes nothing)."""
        return bool(self._beside)

    async def idle(self) -> list[Change]:
        """No transaction came for a while: a repair beside the stream that failed is dealt
        with now (its table quarantined, or read by the pipeline), not at the next
        transaction. What it returns goes to the sinks outside any transaction."""
        for table, repair in list(self._beside.items()):
            if repair.done.is_set() and (repair.error is not None or repair.fallback) and \
                    repair.letting_go is None:  # (its statement goes out in a transaction)
                self._beside.pop(table)
                repair.close()
                self._beside_failed(repair)
        inline, self._inline = self._inline, []
        if inline:
            await self._start(*together(inline), None, beside_ok=False)
        out: list[Change] = [*self._stopping]
        self._stopping = []
        return out

    async def process(self, batch: list[Change]) -> list[Change]:
        """What goes on for a part of the stream. Where it ends with the stream's last
        transaction and a repair beside the stream has more for it, without that
        transaction's ``Commit``: :attr:`holding`, and :meth:`resume` gives the rest."""
        assert self._holding is None, "resume() the held transaction first"
        out = await self._part_starts()
        for change in batch:
            if isinstance(change, Rows) and self._held(change):
                out += self._withheld(change)  # waits for its table's repair (:mod:`.held`)
                continue
            if self._letting_go and self._begin is not None and not isinstance(change, Begin):
                out += await self._let_go()  # before anything else of their tables
            open_from = len(self._batch_rows)
            passed = await self._passed(change)
            if change is batch[-1] and isinstance(change, Commit) and \
                    self._hold(change, open_from):
                passed.pop()  # the Commit, last: :mod:`.lastcommit`
            out += passed
        return out

    async def _part_starts(self) -> list[Change]:
        """A batch starts: the previous one (a part the pipeline stored, its renames
        included) is in the store; repairs carried over and resyncs asked for are read; the
        quarantines since go out first."""
        self._batch_rows = []
        self.views.stored()  # the previous part, its renames included, is in the store
        self._renamed_columns, self._renamed_tables = {}, {}
        self._learn_quarantines()
        if self._again:
            again, self._again = self._again, []
            await self._start(*together(again), None)
        for table, (why, asked) in list(self._resyncs.items()):
            del self._resyncs[table]
            marker = Rowless(table.database, table.table, f"resync: {why}")
            await self._start([marker], "resync", None, resync=asked,
                              beside_ok=table not in self._resync_here)
            self._resync_here.discard(table)
        out: list[Change] = [*self._stopping]
        self._stopping = []
        return out

    async def _passed(self, change: Change) -> list[Change]:
        """What goes on for ``change``: itself after what it brings, or what stands for it."""
        if isinstance(change, Rows):
            return await self._rows(change)
        if isinstance(change, Ddl):
            return await self._statement(change)
        out: list[Change] = []
        if isinstance(change, Begin):
            self._transaction_opens(change)
            for repair in self._beside.values():
                repair.held.begin()
        elif isinstance(change, Rowless):
            change = self._recognised(change)
        elif isinstance(change, Quarantine):  # rows the decoder could not decode
            self._call_off(TableName(change.database, change.table))
            self._quarantined.add(TableName(change.database, change.table))
            self.views.drop(TableName(change.database, change.table))
        elif isinstance(change, Abort):
            self._transaction_opens(None)
            for repair in self._beside.values():  # (what it held of it is read again)
                repair.held.roll_back()
        elif isinstance(change, Commit):
            out += await self._committing(change)
            out += self._stopping
            self._stopping = []
        return [*out, change]

    def _transaction_opens(self, begin: Begin | None) -> None:
        """A transaction begins (``begin``), or the one open was rolled back (None)."""
        self._begin, self._found, self._txn_rows = begin, [], []
        self._sequence_rows, self._overlay = {}, {}
        self._statements = {}

    async def _rows(self, rows: Rows) -> list[Change]:
        """A row event, as it goes on: told against the rows the stream holds where a repair
        of its table waits (:meth:`_as_held`); a sequence's write as the update it is."""
        if table_of(rows.layout) in self._quarantined:
            return [rows]  # not stored: it changes neither a view nor a repair
        if rows.layout.sequence and rows.kind == RowsKind.INSERT:
            rows = await asyncio.to_thread(self.views.locked, self._sequence_write, rows)
        out: list[Change] = []
        for told in await self._as_held(rows):
            if told.as_logged_for:  # (for a sink that holds the repairs: not the views')
                out.append(told)
                continue
            self._txn_rows.append(told)
            self._merge(told)
            out.append(told)
        return out

    def _recognised(self, marker: Rowless) -> Rowless:
        """A change without row events, recognised by the decoder: to repair at the
        transaction's commit (counted, and as the rules store its layout)."""
        marker = self._stored_marker(marker)
        # A quarantined table's resync reads it all: its own rows need no repair
        # (a cascade on from it to other tables still does)
        if marker.edges or TableName(marker.database, marker.table) not in self._quarantined:
            self._found.append(marker)
        kind = "foreign key" if marker.columns else \
            "session" if marker.reason in SESSION_REASONS else "statement"
        self.stats.rowless[kind] = self.stats.rowless.get(kind, 0) + 1
        log.debug("%s: rows changed without row events (%s) in %s", marker.qualified_name,
                  marker.reason, self._begin.gtid if self._begin else "?")
        return marker

    async def _statement(self, ddl: Ddl) -> list[Change]:
        """A schema statement, after the statements held for the repairs it calls off and
        the rows it retypes; or held itself, for its table's repair beside the stream."""
        out = await self._let_go(self._held_statements(ddl))
        statement = self._to_hold(ddl)
        if statement is None:
            for deleted in await self._retyped_rows_out(ddl):
                self._txn_rows.append(deleted)
                out.append(deleted)
        self._schema_changed(ddl)
        if statement is not None:  # it goes out with its table's repair; marked here, for
            self._statements[statement.table] = statement  # the sinks' replay filters
            self.marked = True
            return [*out, replace(ddl, withheld=statement.cause)]
        return [*out, ddl]

    def _stored_marker(self, marker: Rowless) -> Rowless:
        """The marker with its layout (the history's, the source's) as the rules store it."""
        projection = None if marker.layout is None else \
            project_layout(marker.layout, self.columns)
        return marker if projection is None else replace(marker, layout=projection.layout)

    def _learn_quarantines(self) -> None:
        """Tables the store quarantined since: their views no longer hold what is stored (the
        stage saw rows of them the store then dropped), so they are built again."""
        for table in set(self.catalog.quarantined) - self._quarantined:
            self.views.drop(table)
            self._call_off(table)
        self._quarantined = set(self.catalog.quarantined) | \
            {TableName(q.database, q.table) for q in self._stopping}

    async def _committing(self, commit: Commit) -> list[Change]:
        """The transaction ends: bring the views up to it, start a repair for what it
        changed without rows, and attach the repairs whose watermark it reaches."""
        watched = [r for r in self._txn_rows if self.views.get(table_of(r.layout)) is not None]
        if watched:
            await asyncio.to_thread(self.views.locked, _apply_all, self.views, watched)
        found, self._found = self._launch_held(self._found), []
        again, self._reissue = self._reissue, []
        inline, self._inline = self._inline, []
        if found:
            assert self._begin is not None
            again.append((found, str(self._begin.gtid)))
        if again:  # one read for all: a lagging stream may hold many on one table
            await self._start(*together(again), commit)
        if inline:
            await self._start(*together(inline), commit, beside_ok=False)
        out = await self._attach_beside(commit)
        self._batch_rows += self._txn_rows
        self._txn_rows = []
        self._begin = None
        due = await self._attach_due(commit)
        return out + due

    def _schema_changed(self, ddl: Ddl) -> None:
        """A statement renamed, dropped, emptied or altered tables. Their views are built
        again from the store when next needed (the pipeline stores each such statement's
        transaction before the next: :func:`cdcserver.sinks.pipeline.segments`). A repair whose
        rows were read after the statement (its watermark is later) read the table as the
        statement left it, not as the stream has it before the statement: it is read again
        once the statement has passed, under the table's new name and columns (a dropped or
        truncated table needs no repair any more)."""
        touched = {TableName(c.database, c.table) for c in ddl.changes}
        renames = [(TableName(c.database, c.table), c.renamed)
                   for c in ddl.changes if c.kind == "drop" and c.renamed is not None]
        if renames:
            self._follow_renames(renames)
        renamed = {t for pair in renames for t in pair}
        self._renamed_tables = _stored_names(renames)
        self._views_changed(ddl, renamed)
        self._repairs_follow(ddl, touched | renamed)
        self._read_again_after(ddl, touched)

    def _views_changed(self, ddl: Ddl, renamed: set[TableName]) -> None:
        """The views of the tables the statement changed: their columns renamed where it
        keeps their rows, else dropped (a renamed table's view followed it already)."""
        for change in ddl.changes:
            table = TableName(change.database, change.table)
            if keeps_rows(change) and change.renamed_columns and table not in renamed:
                if self.views.get(table) is not None:
                    self.views.rename_columns(table, dict(change.renamed_columns))
                # and a view folded again before the store holds the statement (a repair
                # read again now, keyed like the source) renames them too
                self._renamed_columns[table] = dict(change.renamed_columns)
            if table in renamed or keeps_rows(change):
                continue
            self.views.drop(table)

    def _repairs_follow(self, ddl: Ddl, tables: set[TableName]) -> None:
        """The repairs of ``tables`` beside the stream are called off and read again after
        the statement, under their tables' names then; so are those the pipeline is to
        read."""
        for table in [t for t in self._beside if t in tables] + \
                [t for t in self._queued if t in tables]:
            for markers, cause in self._call_off(table):
                kept = [m for m in (retarget(m, ddl) for m in markers) if m is not None]
                if kept:
                    self._reissue.append((kept, cause))
        inline, self._inline = self._inline, []  # the pipeline's to read: they follow too
        for markers, cause in inline:
            if any(TableName(m.database, m.table) in tables for m in markers):
                markers = [m for m in (retarget(m, ddl) for m in markers) if m is not None]
            if markers:
                self._inline.append((markers, cause))

    def _read_again_after(self, ddl: Ddl, touched: set[TableName]) -> None:
        """The repairs of ``touched`` read after the statement (their watermark is later)
        are read again once it has passed; a resync is asked for again."""
        for pending in list(self._pending):
            if past_watermark(ddl.file, ddl.pos, pending.point) or \
                    not any(s.table in touched for s in pending.scopes):
                continue
            self._pending.remove(pending)
            markers = [m for m in (retarget(m, ddl) for m in pending.markers) if m is not None]
            if pending.resync:  # asked for again, under the table's name now
                self._resyncing -= {s.table for s in pending.scopes}
                for m in markers:
                    self._resyncs.setdefault(TableName(m.database, m.table),
                                             (m.reason.removeprefix("resync: "),
                                              pending.started))
            elif markers:
                self._reissue.append((markers, pending.cause))

    def _follow_renames(self, renames: list[tuple[TableName, TableName]]) -> None:
        """A statement renamed tables: the views a waiting repair reads follow the rows to
        their new names, in the statement's order (a swap is three renames). The store does
        not hold the statement yet (it ends this batch), so a view built from it later would
        not know the renames: each one needed is built now, from what the store holds,
        which is the table before the statement."""
        needed = {TableName(m.database, m.table) for p in self._pending for m in p.markers}
        for old, _ in renames:
            if old in needed and self.views.get(old) is None:
                self._keyed_view(old, self._stored_key(old))
        for old, new in renames:
            self.views.move(old, new)

    def _sequence_write(self, rows: Rows) -> Rows:
        """A sequence has one row; MariaDB logs each write of it (NEXTVAL past the cache,
        SETVAL) as an insert. In the stream it is what it is: an update of that row."""
        table = table_of(rows.layout)
        names = [c.name for c in rows.layout.columns]
        current = self._sequence_rows.get(table)  # written earlier in this transaction
        if current is None:
            found = [row for row, count in self._view(table, rows.layout).rows()
                     for _ in range(count)]
            if len(found) != 1:
                return rows  # no row yet (or a view that cannot tell): an insert
            current = found[0]
        pairs: list[tuple[Any, ...]] = []
        for after in rows.rows:
            pairs += [tuple(current.get(n) for n in names), tuple(after)]
            current = dict(zip(names, after, strict=True))
        self._sequence_rows[table] = current
        return Rows(rows.layout, RowsKind.UPDATE, rows.timestamp, pairs, rows.file, rows.pos,
                    start=rows.start)


def _apply_all(views: Views, rows: list[Rows]) -> None:
    for change in rows:
        views.apply(change)


def _stored_names(renames: list[tuple[TableName, TableName]]
                  ) -> dict[TableName, TableName | None]:
    """For each table a statement's renames (in order: a swap is three) touched, the name
    the store holds its rows under before the statement; None for a name left empty."""
    where: dict[TableName, TableName | None] = {}
    for old, new in renames:
        moved = where.get(old, old)
        where[old] = None  # empty, unless a later rename brings a table here
        where[new] = moved
    return {table: stored for table, stored in where.items() if stored != table}
