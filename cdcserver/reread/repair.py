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
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.capture import NO_COLUMN_RULES, ColumnRules
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
    DefinitionChanged,
    SourceError,
    SourceUnavailable,
)
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.replication.rowless import SESSION_REASONS
from cdcserver.replication.sources import Sources
from cdcserver.reread.asheld import as_held
from cdcserver.reread.beside import BesideRepair, HeldStatement, big, eligible, resync_eligible
from cdcserver.reread.besideprocess import Cancelled
from cdcserver.reread.difference import (
    Fit,
    Scope,
    differences,
    past_watermark,
    reached,
    records,
    same_shape,
    view_key,
)
from cdcserver.reread.frozen import FrozenCatalog
from cdcserver.reread.markers import cascades, keeps_rows, retarget, together
from cdcserver.reread.readview import ReadView, definition_changed, unreachable
from cdcserver.reread.retype import (
    RETYPED_OUT,
    may_render_otherwise,
    renders_otherwise,
    retyped,
)
from cdcserver.reread.tableview import Row, TableView, ViewsClosed
from cdcserver.reread.view import Views, key_names
from cdcserver.schema.masking import project_layout
from cdcserver.schema.rewrites import DROP_VERSIONING, VERSIONING_REWRITES
from cdcserver.store.catalog import Catalog

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
SHARE_PAUSE = 0.05  # seconds between two shares of a repair's records beside the stream
# A source that does not answer (every table's problem: replication restarts and retries)
_UNREACHABLE = (SourceUnavailable, pymysql.err.OperationalError, pymysql.err.InterfaceError)
# (which of them are the source's, not the tables': :func:`.readview.unreachable`)


RECENT = 20  # repairs /health names


@dataclass
class RepairStats:
    """Counted for /metrics: rowless changes recognised and records emitted to repair them."""

    rowless: dict[str, int] = field(default_factory=dict)  # by kind of cause
    repairs: int = 0  # repairs attached to the stream
    records: dict[str, int] = field(default_factory=dict)  # by event type
    resyncs: list[float] = field(default_factory=list)  # seconds each took (asked to done)
    widened: int = 0  # repairs of named rows that read the whole table instead
    # The last repairs out, newest last: what happened to which table and when it was
    # repaired (/health, `cdcserver status`, the admin API)
    recent: list[dict[str, Any]] = field(default_factory=list)

    def repaired(self, table: TableName, reason: str, cause: str, records: int) -> None:
        self.recent = [*self.recent, {"table": str(table), "reason": reason, "cause": cause,
                                      "records": records, "at": time.time()}][-RECENT:]


@dataclass
class _Pending:
    point: SnapshotPoint
    cause: str  # the GTID of the transaction that made the change
    scopes: list[Scope]
    markers: list[Rowless]  # what was recognised, to read again if the pipeline restarts
    resync: bool = False  # a quarantined table's resync: released, in a version of its own
    started: float = 0.0  # (monotonic) when the resync was asked for


class Repairer:
    def __init__(self, address: SourceAddress | Sources, catalog: Catalog, views: Views,
                 stats: RepairStats | None = None,
                 columns: ColumnRules = NO_COLUMN_RULES) -> None:
        self.sources = Sources.of(address)
        self.columns = columns  # [capture] column rules: what is read is compared as stored
        self.catalog = catalog
        self.views = views
        self.stats = stats if stats is not None else RepairStats()
        self._pending: list[_Pending] = []
        self._again: list[tuple[list[Rowless], str]] = []  # carried over, to read again
        self._begin: Begin | None = None
        self._found: list[Rowless] = []  # in the open transaction
        self._txn_rows: list[Rows] = []  # of the open transaction
        self._sequence_rows: dict[TableName, Row] = {}  # sequences it wrote, their new row
        # what this transaction changed in views of tables a repair waits on (:mod:`.asheld`)
        self._overlay: dict[TableName, dict[bytes, Row | None]] = {}
        # columns a statement of this part renamed, in a table with no view yet: the store
        # holds the statement only once the part is stored, so a fold before then renames
        self._renamed_columns: dict[TableName, dict[str, str]] = {}
        # and the tables a statement of this part renamed: the name the store holds each
        # one's rows under until the part is stored (None: no table, it was renamed away)
        self._renamed_tables: dict[TableName, TableName | None] = {}
        self._batch_rows: list[Rows] = []  # committed earlier in this batch (not in the store)
        self._reissue: list[tuple[list[Rowless], str]] = []  # to read again at this commit
        # Quarantined tables (the store's, and those this stage gave up on): their rows are
        # not stored, so they change no view, and a resync brings them back
        self._quarantined: set[TableName] = set(catalog.quarantined)
        self._stopping: list[Quarantine] = []  # to emit before the next commit
        self._resyncs: dict[TableName, tuple[str, float]] = {}  # asked for: why, when
        self._resyncing: set[TableName] = set()  # read, waiting for their watermark
        # Whole-table repairs read in a thread beside the stream (:mod:`.beside`), the
        # repairs of their tables that came next, and those the pipeline must read itself
        self._beside: dict[TableName, BesideRepair] = {}
        self._queued: dict[TableName, list[tuple[list[Rowless], str]]] = {}
        self._inline: list[tuple[list[Rowless], str]] = []
        # ALTERs held for their table's repair beside the stream (:class:`.beside.
        # HeldStatement`): those of the open transaction, to launch at its commit; and those
        # whose repair was called off or failed, to go out before the next change
        self._statements: dict[TableName, HeldStatement] = {}
        self._letting_go: list[HeldStatement] = []
        self._resync_here: set[TableName] = set()  # resyncs the pipeline reads itself
        self._launched = 0
        self._reading = 0  # repairs being read now (in no list meanwhile)
        self._next_share = 0.0  # (monotonic) when a repair beside the stream may go on

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    @property
    def pending(self) -> bool:
        """Whether a repair waits for the stream to reach its watermark, or to be read (then
        no checkpoint may be written: it would pass the change the repair is for). A repair
        read again after a schema statement is in no list while it is read: the pipeline's
        flush looks in meanwhile, and the transactions since its change are stored."""
        return bool(self._pending or self._again or self._beside or self._queued or
                    self._inline or self._reissue or self._reading or self._letting_go)

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
        """Repairs a previous pipeline left waiting: read again before the first batch."""
        self._again = list(waiting)

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
        for change in batch:
            if isinstance(change, Rows) and self._held(change):
                continue  # waits for its table's repair or resync (:mod:`.held`)
            if self._letting_go and self._begin is not None and not isinstance(change, Begin):
                out += await self._let_go()  # before anything else of their tables
            if isinstance(change, Begin):
                self._begin, self._found, self._txn_rows = change, [], []
                self._sequence_rows, self._overlay = {}, {}
                self._statements = {}
            elif isinstance(change, Rows) and _name(change.layout) in self._quarantined:
                pass  # not stored: it changes neither a view nor a repair
            elif isinstance(change, Rows):
                if change.layout.sequence and change.kind == RowsKind.INSERT:
                    change = await asyncio.to_thread(self.views.locked, self._sequence_write,
                                                    change)
                for told in await self._as_held(change):
                    self._txn_rows.append(told)
                    self._merge(told)
                    out.append(told)
                continue
            elif isinstance(change, Rowless):
                change = self._stored_marker(change)
                # A quarantined table's resync reads it all: its own rows need no repair
                # (a cascade on from it to other tables still does)
                if change.edges or \
                        TableName(change.database, change.table) not in self._quarantined:
                    self._found.append(change)
                kind = "foreign key" if change.columns else \
                    "session" if change.reason in SESSION_REASONS else "statement"
                self.stats.rowless[kind] = self.stats.rowless.get(kind, 0) + 1
                log.debug("%s: rows changed without row events (%s) in %s",
                          change.qualified_name, change.reason,
                          self._begin.gtid if self._begin else "?")
            elif isinstance(change, Ddl):
                out += await self._let_go(self._held_statements(change))
                statement = self._to_hold(change)
                if statement is None:
                    for deleted in await self._retyped_rows_out(change):
                        self._txn_rows.append(deleted)
                        out.append(deleted)
                self._schema_changed(change)
                if statement is not None:  # it goes out with its table's repair
                    self._statements[statement.table] = statement
                    continue
            elif isinstance(change, Quarantine):  # rows the decoder could not decode
                self._call_off(TableName(change.database, change.table))
                self._quarantined.add(TableName(change.database, change.table))
                self.views.drop(TableName(change.database, change.table))
            elif isinstance(change, Abort):
                self._begin, self._found, self._txn_rows = None, [], []
                self._sequence_rows, self._overlay = {}, {}
                self._statements = {}
            elif isinstance(change, Commit):
                out += await self._committing(change)
                out += self._stopping
                self._stopping = []
            out.append(change)
        return out

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
        note = _note(f"{change.rewrites}: {what}", cause)
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
                any(s.table == table for p in self._pending for s in p.scopes):
            return None
        if not big(self.catalog, table) or \
                not may_render_otherwise(retyped(change, previous)):
            return None
        return HeldStatement(ddl, change, str(self._begin.gtid) if self._begin else "")

    def _held_statements(self, ddl: Ddl) -> list[HeldStatement]:
        """The statements held for the repairs of the tables ``ddl`` touches: they go out
        now, before it (it calls the repairs off)."""
        touched = {TableName(c.database, c.table) for c in ddl.changes} | \
            {TableName.parse(c.renamed) for c in ddl.changes if c.renamed}
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
            out += [*deleted, statement.ddl]
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
            if _name(rows.layout) == table:
                view.apply(rows)
        columns = retyped(statement.change, previous)
        gone = [row for row, _ in view.rows() if renders_otherwise(row, columns)]
        self.views.drop(table)
        return gone

    async def _as_held(self, rows: Rows) -> list[Rows]:
        """A change of a table whose repair waits for its watermark, told against the rows
        the stream holds (:mod:`.asheld`): every before-image true. Others as they are."""
        table = _name(rows.layout)
        key = key_names(rows.layout)
        if not key or rows.layout.sequence or not any(
                s.table == table and not past_watermark(rows.file, rows.pos, p.point)
                for p in self._pending for s in p.scopes):
            return [rows]
        overlay = self._overlay.setdefault(table, {})
        return await asyncio.to_thread(self.views.locked, self._told_as_held, rows, key,
                                       overlay)

    def _told_as_held(self, rows: Rows, key: tuple[str, ...],
                      overlay: dict[bytes, Row | None]) -> list[Rows]:
        """In a thread, views locked: :func:`as_held` against the view keyed like ``rows``.
        A repair's view may be keyed otherwise: by the source's key where the source has
        moved on by its watermark (versioning added since, whose ``row_end`` joins the key),
        or dropped by a statement since; it is folded again here, and again by the repair
        (which reads it anew at that statement anyway)."""
        return as_held(rows, self._keyed_view(_name(rows.layout), key), overlay)

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
        watched = [r for r in self._txn_rows if self.views.get(_name(r.layout)) is not None]
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

    # -- whole tables beside the stream (:mod:`.beside`) ------------------------------------

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
        if any(s.table == table for p in self._pending for s in p.scopes):
            return False  # the pipeline's own repair of it waits for its watermark
        unstored = [r for r in self._batch_rows + self._txn_rows if _name(r.layout) == table]
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
        repair = self._beside.get(_name(rows.layout))
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

    def _call_off(self, table: TableName) -> list[tuple[list[Rowless], str]]:
        """Stop the table's repair under way (quarantined, or a schema statement): its
        markers, and those queued behind it, for whoever reads them again. The changes it
        held are dropped: the table's next read (a repair or resync at a later watermark)
        holds them, and a consumer never got them, so nothing goes out that the records of
        that read do not bring (every before-image stays the row a consumer holds)."""
        repair = self._beside.pop(table, None)
        queued = self._queued.pop(table, [])
        if repair is None:
            return queued
        if repair.letting_go is not None:  # out before anything else of the table
            self._letting_go.append(repair.letting_go)
        repair.cancel()  # and the changes it held: the table's next read holds them
        if repair.resync is not None:  # still quarantined: its resync starts again
            self._resyncs[table] = (repair.reason.removeprefix("resync: "), repair.resync)
            return queued
        return [(repair.markers, repair.cause), *queued]

    async def _attach_beside(self, commit: Commit) -> list[Change]:
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
            note = _note(repair.reason, repair.cause)
            if repair.letting_go is not None:  # first the rows it retypes, then it
                first = await asyncio.to_thread(
                    repair.attach_retyped, commit,
                    _note(f"{repair.letting_go.change.rewrites}: {RETYPED_OUT}", repair.cause))
                self._txn_rows += [r for r in first if isinstance(r, Rows)]
                out += first
            elif not repair.attached:
                if not repair.sent:
                    await asyncio.to_thread(self.views.locked, self.views.drop, table)
                if repair.resync is not None and not repair.released:
                    assert repair.point is not None
                    repair.released = True
                    out += self._release(table, repair.layout, repair.reason, repair.point,
                                         repair.resync, commit, "the records that follow")
                made = await asyncio.to_thread(repair.attach, commit, note)
                for rows in made:
                    self.stats.records[rows.kind] = self.stats.records.get(rows.kind, 0) + \
                        len(rows.rows)
                out += made
            else:  # then the table's changes held meanwhile, in their order
                released = repair.release(commit)
                self._txn_rows += released
                out += released
            # the stream's own transactions get the rest of the time
            self._next_share = time.monotonic() + SHARE_PAUSE + 0.5 * (time.monotonic() -
                                                                        started)
            if repair.finished:
                self._beside.pop(table)
                repair.close()
                self.stats.repairs += 1
                assert repair.point is not None
                log.info("%s: repaired %d rows at the watermark %s:%d beside the stream, in "
                         "%.1f s; %d changes of its rows waited for it (%d of them were "
                         "read already) (%s)", table, repair.sent, repair.point.file,
                         repair.point.pos, time.monotonic() - repair.started,
                         repair.held.held, repair.dropped, note)
                self.stats.repaired(table, repair.reason, repair.cause, repair.sent)
                self._reissue += self._queued.pop(table, [])
        return out

    def _beside_failed(self, repair: BesideRepair) -> None:
        exc = repair.error
        if isinstance(exc, (Cancelled, ViewsClosed)):
            return  # called off: whoever did it reads the markers again
        retried = exc is not None and isinstance(exc, (*_UNREACHABLE, DefinitionChanged))
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
        elif exc is not None and not (isinstance(exc, (*_UNREACHABLE, DefinitionChanged))):
            self._give_up(repair.markers, repair.cause, exc)
            self._queued.pop(repair.table, None)
            return
        else:
            log.warning("re-reading the rows %s changed: %s; the pipeline reads them",
                        repair.cause, exc)
        self._inline.append((repair.markers, repair.cause))
        self._inline += self._queued.pop(repair.table, [])

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
        self._renamed_tables = _stored_names(renames)
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
        for table in [t for t in self._beside if t in touched or t in renamed] + \
                [t for t in self._queued if t in touched or t in renamed]:
            for markers, cause in self._call_off(table):
                kept = [m for m in (retarget(m, ddl) for m in markers) if m is not None]
                if kept:
                    self._reissue.append((kept, cause))
        inline, self._inline = self._inline, []  # the pipeline's to read: they follow too
        for markers, cause in inline:
            if any(TableName(m.database, m.table) in touched or
                   TableName(m.database, m.table) in renamed for m in markers):
                markers = [m for m in (retarget(m, ddl) for m in markers) if m is not None]
            if markers:
                self._inline.append((markers, cause))
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
        tables |= {TableName.parse(e.child) for m in markers for e in m.edges}
        held = sorted(t for t in tables if t in self._beside)
        if held and resync is None:  # its rows wait for its repair: read after it
            self._queued.setdefault(held[0], []).append((markers, cause))
            return
        for attempt in range(len(RETRY_DELAYS) + 1):
            last = attempt == len(RETRY_DELAYS)
            try:
                pending = await asyncio.to_thread(self.views.locked, self._read, markers,
                                                  tables, cause)
                break
            except _UNREACHABLE as exc:
                if definition_changed(exc):  # a schema statement raced the read: again
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
        if commit is None or not reached(commit.position, pending.point):
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
            self._call_off(table)
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
            return _Pending(read.point, cause, list(scopes.values()), markers)
        finally:
            read.close()

    def _view(self, table: TableName, layout: TableLayout) -> TableView:
        """The stream's view of ``table``, keyed by ``layout``'s primary key: built from the
        store, and the rows not in it yet, when there is none or it was keyed otherwise
        (keyed anew from its own rows where a rename the store does not hold yet moved it
        here)."""
        return self._keyed_view(table, key_names(layout))

    def _scope_view(self, scope: Scope) -> TableView:
        """The view a scope is compared with, keyed by :func:`view_key`."""
        assert scope.layout is not None
        return self._keyed_view(scope.table, scope.key or key_names(scope.layout))

    def _keyed_view(self, table: TableName, key: tuple[str, ...]) -> TableView:
        view = self.views.get(table)
        if view is not None and view.key != key and self.views.unstored(table):
            return self.views.rekeyed(table, key)  # the store does not know the rename yet
        if view is None or view.key != key:
            renamed = self._renamed_columns.get(table, {})  # by a statement not stored yet
            before = {new: old for old, new in renamed.items()}
            # the rows of a table a rename not stored yet brought here are the store's under
            # their name before it (and the part's rows under that name, not this one's)
            stored = self._renamed_tables.get(table, table)
            key = tuple(before.get(c, c) for c in key)
            view = self.views.new(table, key) if stored is None else \
                self.views.fold(self.catalog, table, key, stored)
            for rows in self._batch_rows + self._txn_rows:  # not in the store yet
                if _name(rows.layout) == stored:
                    view.apply(rows)
            if renamed:
                self.views.rename_columns(table, renamed)
                view = self.views.tables[table]
        return view

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

    # -- 3 and 4: reaching the watermark, and the difference ---------------------------------

    def _merge(self, rows: Rows) -> None:
        """Rows the stream changes after a pending repair's watermark are its own truth."""
        table = _name(rows.layout)
        for pending in self._pending:
            if not past_watermark(rows.file, rows.pos, pending.point):
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
        due = [p for p in self._pending if reached(commit.position, p.point)]
        if not due:
            return []
        self._pending = [p for p in self._pending if not any(p is d for d in due)]
        out: list[Change] = []
        for pending in due:
            if pending.resync:
                out += self._released(pending, commit)
            rows = await asyncio.to_thread(self.views.locked, self._difference, pending,
                                           commit)
            self._batch_rows += rows  # a view folded again in this part must hold them
            out += rows
        return out

    def _released(self, pending: _Pending, commit: Commit) -> list[Change]:
        """A resync reached its watermark: the table is released, with a version of its own
        (the table's columns on the source there) that its difference is written in."""
        out: list[Change] = []
        for scope in pending.scopes:
            out += self._release(scope.table, scope.layout, scope.reason, pending.point,
                                 pending.started, commit,
                                 "the records of this transaction that follow")
        return out

    def _release(self, table: TableName, layout: TableLayout | None, reason: str,
                 point: SnapshotPoint, asked: float, commit: Commit, records: str
                 ) -> list[Change]:
        """The table released in ``commit``, with a version in ``layout`` (None: gone)."""
        seconds = time.monotonic() - asked
        note = (f"{reason.removeprefix('resync: ')}; read again at {point.file}:{point.pos}: "
                f"{records} bring the stream to the table's rows there")
        kind = "resync" if layout is not None else "drop"
        self._quarantined.discard(table)
        self._resyncing.discard(table)
        self.views.drop(table)  # built again from the store, as the release left it
        self.stats.resyncs.append(seconds)
        log.warning("%s: resynced in %.2f s at the watermark %s:%d", table, seconds,
                    point.file, point.pos)
        return [Release(table.database, table.table, note),
                Ddl(table.database, "-- cdcserver resync", commit.timestamp, kind=kind,
                    changes=(TableChange(kind, table.database, table.table, layout,
                                         note=note),),
                    file=commit.position.file, pos=commit.position.pos)]

    def _difference(self, pending: _Pending, commit: Commit) -> list[Rows]:
        out: list[Rows] = []
        for scope in pending.scopes:
            if scope.layout is None:
                continue
            view = self._scope_view(scope)
            note = _note(scope.reason, pending.cause)
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


def _apply_all(views: Views, rows: list[Rows]) -> None:
    for change in rows:
        views.apply(change)


def _note(reason: str, cause: str) -> str:
    """A repair record's ``cdc:repair`` (protocol.md, "In-band")."""
    return json.dumps({"reason": reason, "cause": cause}, ensure_ascii=False,
                      separators=(", ", ": "))


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


def _name(layout: TableLayout) -> TableName:
    return TableName(layout.database, layout.table)
