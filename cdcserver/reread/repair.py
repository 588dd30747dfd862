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

The checkpoint never passes a rowless change that was not repaired: while a repair waits for
its watermark the pipeline writes no checkpoint (:attr:`Repairer.pending`), so a crash replays
the change and it is recognised again; a pipeline started again in the same process (after a
full disk) gets the waiting repairs (:meth:`Repairer.carry_over`) and reads them again. A case
that cannot be repaired exactly (the table's columns are unknown) stops replication before
the change's ``Commit`` reaches any sink, with the way out in the message.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pymysql

from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    Quarantine,
    Release,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import (
    ER_TABLE_DEF_CHANGED,
    DefinitionChanged,
    SourceError,
    SourceUnavailable,
)
from cdcserver.core.gtid import BinlogPosition, binlog_ordinal, same_state
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.replication.sources import Sources
from cdcserver.reread.readview import ReadView
from cdcserver.reread.values import from_text
from cdcserver.reread.view import Row, TableView, Views, ViewsClosed, key_names
from cdcserver.store.catalog import Catalog
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.schema import Field, Kind

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
# A source that does not answer (every table's problem: replication restarts and retries)
_UNREACHABLE = (SourceUnavailable, pymysql.err.OperationalError, pymysql.err.InterfaceError)
# ... by MariaDB's error numbers: can't connect, gone away, lost, too many connections,
# shutting down, connection killed, the account refused; any other (a table's privilege,
# its definition) concerns the tables read
_UNREACHABLE_ERRNOS = frozenset({2002, 2003, 2006, 2013, 2055, 1040, 1045, 1053, 1927})


def unreachable(exc: BaseException) -> bool:
    if isinstance(exc, (SourceUnavailable, pymysql.err.InterfaceError)):
        return True
    return bool(exc.args) and exc.args[0] in _UNREACHABLE_ERRNOS


def _definition_changed(exc: BaseException) -> bool:
    """A read that met a schema statement newer than its snapshot (error 1412): read again."""
    return isinstance(exc, pymysql.err.MySQLError) and bool(exc.args) and \
        exc.args[0] == ER_TABLE_DEF_CHANGED


@dataclass
class RepairStats:
    """Counted for /metrics: rowless changes recognised and records emitted to repair them."""

    rowless: dict[str, int] = field(default_factory=dict)  # by kind of cause
    repairs: int = 0  # repairs attached to the stream
    records: dict[str, int] = field(default_factory=dict)  # by event type
    resyncs: list[float] = field(default_factory=list)  # seconds each took (asked to done)
    widened: int = 0  # repairs of named rows that read the whole table instead


@dataclass
class _Scope:
    """The rows of one table a repair covers: ``keys`` (None: every row) and what the
    source held for them at the watermark."""

    table: TableName
    layout: TableLayout | None  # None until read: the stream did not know the columns
    reason: str
    keys: set[bytes] | None
    source: dict[bytes, tuple[Row, int]] = field(default_factory=dict)
    key: tuple[str, ...] | None = None  # the view's, once read (:func:`_view_key`)


@dataclass
class _Pending:
    point: SnapshotPoint
    cause: str  # the GTID of the transaction that made the change
    scopes: list[_Scope]
    markers: list[Rowless]  # what was recognised, to read again if the pipeline restarts
    resync: bool = False  # a quarantined table's resync: released, in a version of its own
    started: float = 0.0  # (monotonic) when the resync was asked for


class Repairer:
    def __init__(self, address: SourceAddress | Sources, catalog: Catalog, views: Views,
                 stats: RepairStats | None = None) -> None:
        self.sources = Sources.of(address)
        self.catalog = catalog
        self.views = views
        self.stats = stats if stats is not None else RepairStats()
        self._pending: list[_Pending] = []
        self._again: list[tuple[list[Rowless], str]] = []  # carried over, to read again
        self._begin: Begin | None = None
        self._found: list[Rowless] = []  # in the open transaction
        self._txn_rows: list[Rows] = []  # of the open transaction
        self._sequence_rows: dict[TableName, Row] = {}  # sequences it wrote, their new row
        self._batch_rows: list[Rows] = []  # committed earlier in this batch (not in the store)
        self._reissue: list[tuple[list[Rowless], str]] = []  # to read again at this commit
        # Quarantined tables (the store's, and those this stage gave up on): their rows are
        # not stored, so they change no view, and a resync brings them back
        self._quarantined: set[TableName] = set(catalog.quarantined)
        self._stopping: list[Quarantine] = []  # to emit before the next commit
        self._resyncs: dict[TableName, tuple[str, float]] = {}  # asked for: why, when
        self._resyncing: set[TableName] = set()  # read, waiting for their watermark

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    @property
    def pending(self) -> bool:
        """Whether a repair waits for the stream to reach its watermark (then no checkpoint
        may be written: it would pass the change the repair is for)."""
        return bool(self._pending or self._again)

    def request_resync(self, table: TableName, why: str) -> bool:
        """Read a quarantined table again at a watermark and release it there (in the first
        batch from now); False if one is asked for or under way already."""
        if table in self._resyncs or table in self._resyncing:
            return False
        self._resyncs[table] = (why, time.monotonic())
        return True

    @property
    def resyncing(self) -> set[TableName]:
        return set(self._resyncs) | self._resyncing

    def carry_over(self) -> list[tuple[list[Rowless], str]]:
        """The waiting repairs (markers and cause), for the next pipeline's repairer."""
        return [(p.markers, p.cause) for p in self._pending] + self._again

    def take_over(self, waiting: list[tuple[list[Rowless], str]]) -> None:
        """Repairs a previous pipeline left waiting: read again before the first batch."""
        self._again = list(waiting)

    async def process(self, batch: list[Change]) -> list[Change]:
        self._learn_quarantines()
        if self._again:
            await self._start(*_together(self._again), None)
            self._again = []
        for table, (why, asked) in list(self._resyncs.items()):
            del self._resyncs[table]
            marker = Rowless(table.database, table.table, f"resync: {why}")
            await self._start([marker], "resync", None, resync=asked)
        out: list[Change] = [*self._stopping]
        self._stopping = []
        self._batch_rows = []
        self.views.stored()  # the previous part, its renames included, is in the store
        for change in batch:
            if isinstance(change, Begin):
                self._begin, self._found, self._txn_rows = change, [], []
                self._sequence_rows = {}
            elif isinstance(change, Rows) and _name(change.layout) in self._quarantined:
                pass  # not stored: it changes neither a view nor a repair
            elif isinstance(change, Rows):
                if change.layout.sequence and change.kind == RowsKind.INSERT:
                    change = await asyncio.to_thread(self.views.locked, self._sequence_write,
                                                    change)
                self._txn_rows.append(change)
                self._merge(change)
            elif isinstance(change, Rowless):
                self._found.append(change)
                kind = "foreign key" if change.columns else "statement"
                self.stats.rowless[kind] = self.stats.rowless.get(kind, 0) + 1
                log.debug("%s: rows changed without row events (%s) in %s",
                          change.qualified_name, change.reason,
                          self._begin.gtid if self._begin else "?")
            elif isinstance(change, Ddl):
                self._schema_changed(change)
            elif isinstance(change, Quarantine):  # rows the decoder could not decode
                self._quarantined.add(TableName(change.database, change.table))
                self.views.drop(TableName(change.database, change.table))
            elif isinstance(change, Abort):
                self._begin, self._found, self._txn_rows = None, [], []
                self._sequence_rows = {}
            elif isinstance(change, Commit):
                out += await self._committing(change)
                out += self._stopping
                self._stopping = []
            out.append(change)
        return out

    def _learn_quarantines(self) -> None:
        """Tables the store quarantined since: their views no longer hold what is stored (the
        stage saw rows of them the store then dropped), so they are built again."""
        for table in set(self.catalog.quarantined) - self._quarantined:
            self.views.drop(table)
        self._quarantined = set(self.catalog.quarantined) | \
            {TableName(q.database, q.table) for q in self._stopping}

    async def _committing(self, commit: Commit) -> list[Change]:
        """The transaction ends: bring the views up to it, start a repair for what it
        changed without rows, and attach the repairs whose watermark it reaches."""
        watched = [r for r in self._txn_rows if self.views.get(_name(r.layout)) is not None]
        if watched:
            await asyncio.to_thread(self.views.locked, _apply_all, self.views, watched)
        found, self._found = self._found, []
        again, self._reissue = self._reissue, []
        if found:
            assert self._begin is not None
            again.append((found, str(self._begin.gtid)))
        if again:  # one read for all: a lagging stream may hold many on one table
            await self._start(*_together(again), commit)
        self._batch_rows += self._txn_rows
        self._txn_rows = []
        self._begin = None
        return await self._attach_due(commit)

    def _schema_changed(self, ddl: Ddl) -> None:
        """A statement renamed, dropped, emptied or altered tables. Their views are built
        again from the store when next needed (the pipeline stores each such statement's
        transaction before the next: :func:`cdcserver.sinks.pipeline.segments`). A repair whose
        rows were read after the statement (its watermark is later) read the table as the
        statement left it, not as the stream has it before the statement: it is read again
        once the statement has passed, under the table's new name and columns (a dropped or
        truncated table needs no repair any more)."""
        touched = {TableName(c.database, c.table): c for c in ddl.changes}
        renames = [(TableName(c.database, c.table), TableName.parse(c.renamed))
                   for c in ddl.changes if c.kind == "drop" and c.renamed]
        if renames:
            self._follow_renames(renames)
        renamed = {t for pair in renames for t in pair}
        for change in ddl.changes:
            table = TableName(change.database, change.table)
            if table in renamed or _keeps_rows(change):
                continue
            self.views.drop(table)
        for pending in list(self._pending):
            if _after(ddl.file, ddl.pos, pending.point) or \
                    not any(s.table in touched for s in pending.scopes):
                continue
            self._pending.remove(pending)
            markers = [m for m in (_retarget(m, ddl) for m in pending.markers) if m is not None]
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

    def _stored_key(self, table: TableName) -> tuple[str, ...]:
        """The primary key of the table's newest stored version (a view's key, where the
        stream's columns are not at hand)."""
        entry = self.catalog.get(table)
        latest = entry.latest() if entry is not None else None
        return tuple(latest.schema.avsc.get("primary_key", ())) if latest is not None else ()

    def _sequence_write(self, rows: Rows) -> Rows:
        """A sequence has one row; MariaDB logs each write of it (NEXTVAL past the cache,
        SETVAL) as an insert. In the stream it is what it is: an update of that row."""
        table = _name(rows.layout)
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

    # -- 1 and 2: what to read, and reading it ---------------------------------------------

    async def _start(self, markers: list[Rowless], cause: str, commit: Commit | None, *,
                     resync: float | None = None) -> None:
        """Read what ``markers`` name at a watermark; the repair waits for the stream there
        (``commit``: the transaction that made the changes, not yet passed on; ``resync``:
        when a quarantined table's resync was asked for). A source that cannot be reached
        stops the pipeline for a restart (:class:`SourceUnavailable`); a table that cannot
        be read is quarantined, and every other table goes on."""
        markers = list(markers)
        tables = {TableName(m.database, m.table) for m in markers}
        tables |= {TableName.parse(e.child) for m in markers for e in m.edges}
        for attempt in range(len(RETRY_DELAYS) + 1):
            last = attempt == len(RETRY_DELAYS)
            try:
                pending = await asyncio.to_thread(self.views.locked, self._read, markers,
                                                  tables, cause)
                break
            except _UNREACHABLE as exc:
                if _definition_changed(exc):  # a schema statement raced the read: again
                    if last:
                        self._give_up(markers, cause, exc)
                        return
                elif not unreachable(exc):
                    self._give_up(markers, cause, exc)
                    return
                if last:
                    raise SourceUnavailable(f"cannot re-read the rows {cause} changed without "
                                            f"row events: {exc}") from exc
                failure: BaseException = exc
            except DefinitionChanged as exc:  # a schema statement raced the read: again
                if last:
                    self._give_up(markers, cause, exc)
                    return
                failure = exc
            except ViewsClosed:
                raise  # the pipeline stops: the repair is read again after the restart
            except Exception as exc:  # noqa: BLE001 - a fault of these tables, not the source's
                self._give_up(markers, cause, exc)
                return
            log.warning("re-reading the rows %s changed: %s; trying again", cause, failure)
            await asyncio.sleep(RETRY_DELAYS[attempt])
        if pending is None:
            return
        if resync is not None:
            pending.resync, pending.started = True, resync
            self._resyncing |= tables
        self._pending.append(pending)
        if commit is None or not _reached(commit.position, pending.point):
            log.info("%s: the repair of %s waits for the stream to reach %s:%d", cause,
                     ", ".join(sorted({m.qualified_name for m in markers})),
                     pending.point.file, pending.point.pos)

    def _give_up(self, markers: list[Rowless], cause: str, exc: BaseException) -> None:
        """The rows cannot be read again exactly: quarantine their tables (see the module's
        description) from the transaction being passed on."""
        log.error("cannot re-read the rows %s changed without row events (%s): %s", cause,
                  ", ".join(sorted({m.qualified_name for m in markers})), exc,
                  exc_info=not isinstance(exc, (SourceError, pymysql.err.MySQLError)))
        for table in sorted({TableName(m.database, m.table) for m in markers}):
            self._resyncing.discard(table)
            self.views.drop(table)
            self._quarantined.add(table)
            what = "its resync" if cause == "resync" else \
                f"the rows {cause} changed without row events"
            self._stopping.append(Quarantine(
                table.database, table.table,
                f"{what} could not be read again: {type(exc).__name__}: {exc}"))

    def _read(self, markers: list[Rowless], tables: set[TableName], cause: str
              ) -> _Pending | None:
        """In a thread: the scopes' candidate rows from the views, then the source's rows for
        them at one watermark, following cascades as far as they reach. None when no row of
        the stream is concerned."""
        scopes: dict[TableName, _Scope] = {}
        queue = []
        for marker in markers:
            view = self._view(TableName(marker.database, marker.table), marker.layout) \
                if marker.layout is not None else None
            if self._scope(scopes, marker, view, marker.layout) is not None:
                queue.append(marker)
        if not queue:
            return None
        read = ReadView(self.address, sorted(tables))
        try:
            done: set[TableName] = set()
            while queue:
                marker = queue.pop(0)
                scope = scopes[TableName(marker.database, marker.table)]
                if scope.table in done and scope.keys is None:
                    continue
                changed = self._read_scope(read, scope)
                done.add(scope.table)
                for follow in _cascades(marker, changed):
                    child = self._view(TableName(follow.database, follow.table),
                                       follow.layout) if follow.layout is not None else None
                    if self._scope(scopes, follow, child, follow.layout) is not None:
                        queue.append(follow)
            return _Pending(read.point, cause, list(scopes.values()), markers)
        finally:
            read.close()

    def _view(self, table: TableName, layout: TableLayout) -> TableView:
        """The stream's view of ``table``, keyed by ``layout``'s primary key: built from the
        store, and the rows not in it yet, when there is none or it was keyed otherwise
        (keyed anew from its own rows where a rename the store does not hold yet moved it
        here)."""
        return self._keyed_view(table, key_names(layout))

    def _scope_view(self, scope: _Scope) -> TableView:
        """The view a scope is compared with, keyed by :func:`_view_key`."""
        assert scope.layout is not None
        return self._keyed_view(scope.table, scope.key or key_names(scope.layout))

    def _keyed_view(self, table: TableName, key: tuple[str, ...]) -> TableView:
        view = self.views.get(table)
        if view is not None and view.key != key and self.views.unstored(table):
            return self.views.rekeyed(table, key)  # the store does not know the rename yet
        if view is None or view.key != key:
            view = self.views.fold(self.catalog, table, key)
            for rows in self._batch_rows + self._txn_rows:  # not in the store yet
                if _name(rows.layout) == table:
                    view.apply(rows)
        return view

    @staticmethod
    def _scope(scopes: dict[TableName, _Scope], marker: Rowless, view: TableView | None,
               layout: TableLayout | None) -> _Scope | None:
        """Add the rows ``marker`` names to its table's scope; None when it adds none. A
        table whose columns the stream does not know (``layout`` None) is read whole, in
        the columns the source gives it."""
        table = TableName(marker.database, marker.table)
        scope = scopes.get(table)
        if scope is None:
            scope = scopes[table] = _Scope(table, layout, marker.reason, set())
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

    def _read_scope(self, read: ReadView, scope: _Scope) -> list[tuple[Row | None, Row | None]]:
        """Read the scope's rows at the watermark; return how the view's rows differ from
        them there (for following cascades). A whole table is read in the columns the
        source gives it at the watermark, and so are the named rows of a table whose
        columns there are not the stream's (the source has moved on: the rows the stream
        names may no longer be found by the stream's columns)."""
        source = read.source_layout(scope.table)
        if scope.key is None:
            scope.key = _view_key(scope.layout, source)
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
        return _differences(view, scope)

    # -- 3 and 4: reaching the watermark, and the difference ---------------------------------

    def _merge(self, rows: Rows) -> None:
        """Rows the stream changes after a pending repair's watermark are its own truth."""
        table = _name(rows.layout)
        for pending in self._pending:
            if not _after(rows.file, rows.pos, pending.point):
                continue
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
        due = [p for p in self._pending if _reached(commit.position, p.point)]
        if not due:
            return []
        self._pending = [p for p in self._pending if not any(p is d for d in due)]
        out: list[Change] = []
        for pending in due:
            if pending.resync:
                out += self._released(pending, commit)
            rows = await asyncio.to_thread(self.views.locked, self._difference, pending,
                                           commit)
            out += rows
        return out

    def _released(self, pending: _Pending, commit: Commit) -> list[Change]:
        """A resync reached its watermark: the table is released, with a version of its own
        (the table's columns on the source there) that its difference is written in."""
        out: list[Change] = []
        for scope in pending.scopes:
            table = scope.table
            seconds = time.monotonic() - pending.started
            note = (f"{scope.reason.removeprefix('resync: ')}; read again at "
                    f"{pending.point.file}:{pending.point.pos}: the records of this "
                    "transaction that follow bring the stream to the table's rows there")
            kind = "resync" if scope.layout is not None else "drop"
            out += [Release(table.database, table.table, note),
                    Ddl(table.database, "-- cdcserver resync", commit.timestamp, kind=kind,
                        changes=(TableChange(kind, table.database, table.table,
                                             scope.layout, note=note),),
                        file=commit.position.file, pos=commit.position.pos)]
            self._quarantined.discard(table)
            self._resyncing.discard(table)
            self.views.drop(table)  # built again from the store, as the release left it
            self.stats.resyncs.append(seconds)
            log.warning("%s: resynced in %.2f s at the watermark %s:%d", table, seconds,
                        pending.point.file, pending.point.pos)
        return out

    def _difference(self, pending: _Pending, commit: Commit) -> list[Rows]:
        out: list[Rows] = []
        for scope in pending.scopes:
            if scope.layout is None:
                continue
            view = self._scope_view(scope)
            note = json.dumps({"reason": scope.reason, "cause": pending.cause},
                              ensure_ascii=False, separators=(", ", ": "))
            made = _records(scope, view, note, commit)
            for rows in made:
                view.apply(rows)
                self.stats.records[rows.kind] = self.stats.records.get(rows.kind, 0) + \
                    len(rows.rows)
            if made:
                log.info("%s: repaired %d rows at the watermark %s:%d (%s)", scope.table,
                         sum(len(r.rows) // (2 if r.kind == RowsKind.UPDATE else 1)
                             for r in made), pending.point.file, pending.point.pos, note)
            out += made
        self.stats.repairs += 1
        return out


_CASCADING = frozenset({"cascade", "set null", "set default"})


def _cascades(marker: Rowless, changed: list[tuple[Row | None, Row | None]]) -> list[Rowless]:
    """Where the rows a repair changes are themselves parents: the rows of their children
    that a cascade may have reached too."""
    table = marker.qualified_name
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
            database, _, name = edge.child.partition(".")
            follow.append(Rowless(database, name, f"{', '.join(sorted(events))} of {table}",
                                  edge.columns, tuple(values), edge.layout, marker.edges))
    return follow


def _retarget(marker: Rowless, ddl: Ddl) -> Rowless | None:
    """``marker`` after ``ddl``: under the table's new name and columns (following every
    rename of one statement in order: ``RENAME TABLE a TO tmp, b TO a, tmp TO b`` moves a's
    rows to b); None when the statement dropped or emptied the table (and with it the rows
    to repair)."""
    came_from = ""  # the name a rename just moved the marker from: its create is that move
    for change in ddl.changes:
        if (change.database, change.table) != (marker.database, marker.table):
            continue
        if change.kind == "create" and change.renamed and change.renamed == came_from:
            came_from = ""
            if change.layout is not None:
                marker = replace(marker, layout=change.layout)
            continue
        if change.kind == "drop" and change.renamed:
            came_from = marker.qualified_name
            database, _, table = change.renamed.partition(".")
            marker = replace(marker, database=database, table=table)
            continue
        if change.kind in ("drop", "truncate", "create"):
            return None
        if change.layout is not None:
            marker = replace(marker, layout=change.layout)
    return marker


def _keeps_rows(change: TableChange) -> bool:
    """Whether a consumer's rows of the table stay as they are through ``change``: an
    ALTER of known columns writes no record and empties nothing, so the view goes on as
    folding the store again would build it (a new primary key re-keys it when next used)."""
    return change.kind == "alter" and change.layout is not None


MAX_CAUSES = 8  # GTIDs a merged repair's cause names
OTHERS = "and others"


def _together(repairs: list[tuple[list[Rowless], str]]) -> tuple[list[Rowless], str]:
    """Several repairs as one: every marker, read at one watermark; the cause names the
    transactions (the first few, then "and others")."""
    markers = [m for found, _ in repairs for m in found]
    causes = list(dict.fromkeys(c for _, cause in repairs for c in cause.split(", ")))
    more = OTHERS in causes or len(causes) > MAX_CAUSES
    named = [c for c in causes if c != OTHERS][:MAX_CAUSES]
    return markers, ", ".join([*named, OTHERS] if more else named)


def _apply_all(views: Views, rows: list[Rows]) -> None:
    for change in rows:
        views.apply(change)


def _name(layout: TableLayout) -> TableName:
    return TableName(layout.database, layout.table)


def same_shape(a: TableLayout, b: TableLayout) -> bool:
    """Whether rows of ``a`` and ``b`` are the same Avro records: the same columns, in
    the same order, of the same types, under the same primary key."""
    first, second = TableSchema.from_layout(a, 0, ""), TableSchema.from_layout(b, 0, "")
    return (first.avsc["fields"] == second.avsc["fields"]
            and first.avsc.get("primary_key") == second.avsc.get("primary_key"))


def _after(file: str, pos: int, point: SnapshotPoint) -> bool:
    return bool(file) and binlog_ordinal(file, pos) > binlog_ordinal(point.file, point.pos)


def _reached(position: BinlogPosition, point: SnapshotPoint) -> bool:
    """Whether the stream, right after the transaction that ends at ``position``, stands at
    the watermark (or has passed it: the merge step kept the repair exact)."""
    if same_state(position.gtid_state, point.gtid):
        return True
    return bool(position.file) and binlog_ordinal(position.file, position.pos) >= \
        binlog_ordinal(point.file, point.pos)


def _view_key(stream: TableLayout | None, source: TableLayout | None) -> tuple[str, ...]:
    """The key a scope's view and the source's rows are compared under: the stream's
    primary key and the source's together. The source's alone may be narrower where it has
    moved on (a swap put another table under the name, versioning was dropped since):
    rows the stream keeps apart, a row and its history rows, would merge in the view, and
    be lost where a rename the store does not hold yet allows no fold again. A column only
    one side has is NULL on the other, so neither side's rows merge."""
    stream_key = key_names(stream) if stream is not None else ()
    source_key = key_names(source) if source is not None else ()
    if not stream_key or not source_key:  # no key: the view is a multiset of whole rows
        return stream_key if stream is not None else source_key
    return stream_key + tuple(c for c in source_key if c not in stream_key)


def _differences(view: TableView, scope: _Scope) -> list[tuple[Row | None, Row | None]]:
    """(the view's row, the source's row) for each row that differs; None where absent."""
    changed: list[tuple[Row | None, Row | None]] = []
    if view.key:
        keys: set[bytes] = set(scope.keys) if scope.keys is not None else \
            {view.key_of(r) for r, _ in view.rows()} | set(scope.source)
        for key in keys:
            mine = view.get(key)
            theirs = scope.source.get(key)
            source_row = theirs[0] if theirs else None
            if mine is None and source_row is None:
                continue
            if mine is None or source_row is None or not _same_row(mine, source_row):
                changed.append((mine, source_row))
        return changed
    mine_counts: dict[bytes, tuple[Row, int]] = {view.key_of(r): (r, n) for r, n in view.rows()}
    for key in set(mine_counts) | set(scope.source):
        row_a, a = mine_counts.get(key, (None, 0))
        row_b, b = scope.source.get(key, (None, 0))
        changed += [(row_a, None)] * max(a - b, 0) + [(None, row_b)] * max(b - a, 0)
    return changed


def _same_row(mine: Row, theirs: Row) -> bool:
    """A column the stream's row lacks (added after the row was sent) is NULL to a
    consumer: the same as the source's NULL, different from any default value."""
    return all(mine.get(name) == value for name, value in theirs.items())


def _records(scope: _Scope, view: TableView, note: str, commit: Commit) -> list[Rows]:
    layout = scope.layout
    assert layout is not None, "a scope is read before its records are made"
    names = [c.name for c in layout.columns]

    def values(row: Row) -> tuple[Any, ...]:
        return tuple(row.get(n) for n in names)

    inserts, updates, deletes = [], [], []
    changed = _differences(view, scope)
    fit = _Fit(layout)
    for mine, theirs in changed:
        if mine is None and theirs is not None:
            inserts.append(values(theirs))
        elif theirs is None and mine is not None:
            deletes.append(values(fit(mine, None)))
        elif mine is not None and theirs is not None:
            updates += [values(fit(mine, theirs)), values(theirs)]
    if layout.sequence and len(deletes) == len(inserts) == 1:  # its one row, changed
        updates, deletes, inserts = [deletes[0], inserts[0]], [], []
    out = []
    for kind, rows in ((RowsKind.DELETE, deletes), (RowsKind.UPDATE, updates),
                       (RowsKind.INSERT, inserts)):
        if rows:
            out.append(Rows(layout, kind, commit.timestamp, _sorted(rows, layout, kind),
                            commit.position.file, commit.position.pos, repair=note))
    return out


class _Fit:
    """A row as the stream last had it, in the table's columns now. A value whose Python
    type the column's type does not hold (a column an ALTER retyped: a DATETIME that became
    a DECIMAL, an INT that became a VARCHAR) is converted the way its text reads in the new
    type; failing that it is the source's value, or NULL. Whatever ``mine`` holds, the store
    can write the result."""

    def __init__(self, layout: TableLayout) -> None:
        fields = TableSchema.from_layout(layout, 0, "").columns
        self.fields = {f.column: f for f in fields}
        self.converters = {f.column: from_text(f) for f in fields}

    def __call__(self, mine: Row, theirs: Row | None) -> Row:
        row = dict(mine)
        for name, value in mine.items():
            field = self.fields.get(name)
            if value is None or field is None or holds(field, value):
                continue
            try:
                converted = self.converters[name](_text(value))
            except (ValueError, TypeError, ArithmeticError, UnicodeError, OverflowError):
                converted = None
            if converted is None or not holds(field, converted):
                converted = theirs.get(name) if theirs is not None else None
            row[name] = converted
        return row


_HELD: dict[Kind, tuple[type, ...]] = {
    Kind.BOOLEAN: (int,), Kind.INT: (int,), Kind.LONG: (int,), Kind.FLOAT: (float, int),
    Kind.DOUBLE: (float, int), Kind.DECIMAL: (Decimal, int), Kind.STRING: (str,),
    Kind.ENUM: (str,), Kind.BYTES: (bytes, bytearray), Kind.UUID: (str,),
    Kind.DATE: (dt.date, str), Kind.DATETIME: (dt.datetime, str),
    Kind.TIMESTAMP: (dt.datetime, str), Kind.TIME: (dt.timedelta, str), Kind.NULL: (),
}


def holds(field: Field, value: Any) -> bool:
    """Whether the store writes ``value`` in ``field`` (the binlog decoder's types; MariaDB's
    text for a zero or partial date)."""
    if isinstance(value, bool):
        return False
    if field.kind == Kind.DATE and isinstance(value, dt.datetime):
        return False  # a datetime is a date in Python, not in the store
    return isinstance(value, _HELD.get(field.kind, ()))


def _text(value: Any) -> bytes:
    """A value as MariaDB prints it (what ``from_text`` reads)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None).isoformat(sep=" ").encode()
    if isinstance(value, dt.timedelta):
        seconds = int(value.total_seconds())
        sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
        return f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}".encode()
    return str(value).encode("utf-8", "surrogateescape")


def _sorted(rows: list[tuple[Any, ...]], layout: TableLayout, kind: RowsKind
            ) -> Sequence[tuple[Any, ...]]:
    """In key order, so that two services make the same records (pairs stay together)."""
    key = layout.primary_key or tuple(range(len(layout.columns)))

    def order(row: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(repr(row[i]) for i in key)

    if kind != RowsKind.UPDATE:
        return sorted(rows, key=order)
    pairs = sorted(zip(rows[::2], rows[1::2], strict=True), key=lambda p: order(p[0]))
    return [row for pair in pairs for row in pair]

