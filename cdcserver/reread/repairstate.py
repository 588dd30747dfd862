"""What the repair stage (:mod:`.repair`) keeps between batches, and what every part of it
uses: the repairs waiting for their watermark (:class:`.pendingrepairs.PendingRepairs`),
the tables quarantined and resynced, the repairs beside the stream, the transaction and
part being passed on; the stream's views of the tables repairs read, folded with the rows
the store does not hold yet; and the fates of a table's repair: called off, given up (the
table quarantined), released (a resync reached its watermark).

:class:`RepairState` is the ground of the stage's classes, each of which adds one concern:
:class:`.retypedout.RetypedOut`, :class:`.watermark.Watermarks`,
:class:`.besiderepairs.BesideRepairs`, :class:`.rereads.Rereads`, and
:class:`.repair.Repairer` on top.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pymysql

from cdcserver.core.capture import NO_COLUMN_RULES, ColumnRules
from cdcserver.core.changes import (
    Begin,
    Change,
    Commit,
    Ddl,
    Quarantine,
    Release,
    Rowless,
    Rows,
    TableChange,
    TableLayout,
)
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import DiskFull, SourceError, SourceUnavailable, StoreDamaged
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.replication.sources import Sources
from cdcserver.reread.beside import BesideRepair, HeldStatement
from cdcserver.reread.difference import Scope
from cdcserver.reread.pendingrepairs import PendingRepairs
from cdcserver.reread.repairstats import RepairStats
from cdcserver.reread.tableview import Row, TableView
from cdcserver.reread.view import Views, key_names
from cdcserver.store.catalog import Catalog
from cdcserver.store.faults import disk_failed, disk_full

log = logging.getLogger('cdcserver.reread.repair')

# A source that does not answer (every table's problem: replication restarts and retries)
UNREACHABLE = (SourceUnavailable, pymysql.err.OperationalError, pymysql.err.InterfaceError)
# (which of them are the source's, not the tables': :func:`.readview.unreachable`)


class RepairState:
    """The repair stage's state, the stream's views its repairs read, and a table's fates."""

    def __init__(self, address: SourceAddress | Sources, catalog: Catalog, views: Views,
                 stats: RepairStats | None = None,
                 columns: ColumnRules = NO_COLUMN_RULES) -> None:
        self.sources = Sources.of(address)
        self.columns = columns  # [capture] column rules: what is read is compared as stored
        self.catalog = catalog
        self.views = views
        self.stats = stats if stats is not None else RepairStats()
        self._pending = PendingRepairs()
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
        # the output since the pipeline last looked holds changes marked withheld or
        # released (:attr:`.Rows.withheld`): each sink's replay filter sorts them
        self.marked = False
        self._queued: dict[TableName, list[tuple[list[Rowless], str]]] = {}
        self._inline: list[tuple[list[Rowless], str]] = []
        # ALTERs held for their table's repair beside the stream (:class:`.beside.
        # HeldStatement`): those of the open transaction, to launch at its commit; and those
        # whose repair was called off or failed, to go out before the next change
        self._statements: dict[TableName, HeldStatement] = {}
        self._letting_go: list[HeldStatement] = []
        # the causes whose held statement went out without their repair (:meth:`_let_go`):
        # placed in part until their repair, read again, is
        self._let_go_out: set[str] = set()
        self._resync_here: set[TableName] = set()  # resyncs the pipeline reads itself
        self._launched = 0
        self._reading = 0  # repairs being read now (in no list meanwhile)
        self._next_share = 0.0  # (monotonic) when a repair beside the stream may go on
        # The stream's last transaction, its commit held while a repair beside the stream
        # is read or attached and the source writes nothing more (:meth:`.besiderepairs.
        # BesideRepairs.resume`); and whether the stream has more for the pipeline (set by
        # it; by default it has, and no commit is held)
        self._holding: Commit | None = None
        self.input_waiting: Callable[[], bool] = lambda: True

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    # -- the stream's views of the tables repairs read --------------------------------------

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
                if table_of(rows.layout) == stored:
                    view.apply(rows)
            if renamed:
                self.views.rename_columns(table, renamed)
                view = self.views.tables[table]
        return view

    def _stored_key(self, table: TableName) -> tuple[str, ...]:
        """The primary key of the table's newest stored version (a view's key, where the
        stream's columns are not at hand)."""
        entry = self.catalog.get(table)
        latest = entry.latest() if entry is not None else None
        return tuple(latest.schema.avsc.get("primary_key", ())) if latest is not None else ()

    # -- a table's fates: called off, given up, released -------------------------------------

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

    def _give_up(self, markers: list[Rowless], cause: str, exc: BaseException) -> None:
        """The rows cannot be read again exactly: quarantine their tables (see the module's
        description) from the transaction being passed on. Unless the service's own disk
        failed the read (full, failing): that is no fault of these tables, so replication
        pauses (:class:`DiskFull`) or starts over (:class:`StoreDamaged`), and the rows are
        read again after it (carried over, or from the checkpoint, which precedes them)."""
        if disk_full(exc) or disk_failed(exc):
            self._again.append((markers, cause))
            what = f"re-reading the rows {cause} changed without row events: {exc}"
            if disk_full(exc):
                raise DiskFull(what, getattr(exc, "needed", 0)) from exc
            raise StoreDamaged(what) from exc
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


def repair_note(reason: str, cause: str) -> str:
    """A repair record's ``cdc:repair`` (protocol.md, "In-band")."""
    return json.dumps({"reason": reason, "cause": cause}, ensure_ascii=False,
                      separators=(", ", ": "))


def cause_of(note: str) -> str:
    """The cause a repair record's note names (:func:`repair_note`); "" if none."""
    try:
        cause = json.loads(note).get("cause", "")
    except (ValueError, AttributeError):
        return ""
    return cause if isinstance(cause, str) else ""


def table_of(layout: TableLayout) -> TableName:
    return TableName(layout.database, layout.table)
