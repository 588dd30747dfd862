"""A whole table's repair, read beside the stream.

A repair that must compare a whole table (a value-rewriting ALTER, a truncated partition: see
:mod:`.repair`) used to hold the pipeline while it built the table's view, read every row and
compared them: every table's stream stopped for as long, minutes for a million rows, and the
rows were held in memory. For a table with a primary key (the usual case) the repair now runs
in a process of its own (at a lower priority, sharing no interpreter lock with the service)
while every other table keeps streaming, and this one waits alone (steps 1 to 3 are the
process's, :mod:`.besideprocess`; the versions it folds are frozen by :mod:`.frozen`):

1. At the transaction X that made the change, the table's stored versions are *frozen* (their
   committed sizes then) and the rows of the batch not stored yet are copied: the process
   folds them into a private view in its own SQLite file, the stream's table right after X.
2. It opens a consistent read of the source (the watermark S) and writes the table's rows
   there into the same file, as the server sends them.
3. It compares the two in key order (a merge of two sorted scans) and writes each difference
   as the records that repair it: from the table as the stream has it at X to the table as
   the source has it at S.
4. Meanwhile the stream's changes to the table after X are held (:mod:`.held`), not given to
   the sinks, so the table's consumers still hold it as it was at X.
5. From the first transaction after the stream reached S and the read finished, the records
   are appended to transactions, ``ATTACH_ROWS`` at a time, with a pause between two shares
   that leaves the stream's own transactions most of the pipeline's time (a repair of
   millions of rows spans many transactions, each record saying why it is there); then the
   held changes after S, in their order, the same way (those up to S are in the records
   already), until none waits and the table streams live again. Every before-image a
   consumer then gets is the row it holds. On a source that writes nothing more, the stream's
   last transaction waits for them, its ``Commit`` held until the repair is out
   (:mod:`.lastcommit`).

Tables of less than ``MIN_BYTES`` stored are repaired in the transaction that changed them,
by the pipeline, as before: a fraction of a second, and no later transaction needed.

The service holds one share of records or held changes; the process, a batch of rows and its
SQLite cache; the table's rows and its held changes are on disk (``state/``, removed when
done). No checkpoint is written until the repair and the held changes are out, as before: a
crash replays the change and it is repaired again. A schema statement on the table while the
repair is under way calls it off (the changes it held are dropped: the read after the
statement holds them) and it starts again after the statement. A table without a primary
key, a cascade and a statement that turns system versioning on or off take the pipeline's own
path (:meth:`.rereads.Rereads._start`), and so does a system-versioned table once the read
finds it is one. Before it folds anything the process checks, in a second, that the table can
be read (its privilege, a lock held past the wait): a table that cannot is quarantined at
once, not after minutes of work. The columns the statement renamed are renamed in the view
once it is folded (the frozen versions end before the statement), as a consumer renames them.

An ALTER that retypes columns whose new types may render a stored value otherwise (``12.345``
in ``DECIMAL(10,1)``, a ``DATE`` in a ``DATETIME``) is itself held (:class:`HeldStatement`):
the process also finds the rows holding such values, and they go out first, deleted in the
old version exactly as a consumer holds them; then the statement; then the records, which
insert those rows as the source has them (:mod:`.retype`). A repair called off or failed lets
the statement go at once, the pipeline reading those rows itself.

A quarantined table's resync of at least ``MIN_BYTES`` stored takes this path too: its stored
versions are frozen as the quarantine left them, the source's primary key and columns are
learned first (the view is keyed by them), its changes are held from the moment the resync
starts (they were dropped while it was quarantined), and the table's release and ``resync``
version go out with the first share of records. A schema statement meanwhile asks for the
resync again; a table that turns out to have no key or to be gone from the source, and a
source that cannot be reached, go to the pipeline's own resync.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.capture import ColumnRules
from cdcserver.core.changes import (
    Change,
    Commit,
    Ddl,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import DiskFull, SourceError, SourceUnavailable, StoreDamaged
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.besideprocess import (
    DELETE,
    DIFFERENCES,
    INSERT,
    KINDS,
    UPDATE,
    Cancelled,
    Job,
    Result,
    images,
    work,
)
from cdcserver.reread.difference import Fit, past_watermark, reached
from cdcserver.reread.frozen import FrozenCatalog
from cdcserver.reread.held import HeldChanges
from cdcserver.reread.view import database_bytes, key_names, remove_database
from cdcserver.schema.rewrites import VERSIONING_REWRITES
from cdcserver.store.catalog import Catalog

log = logging.getLogger(__name__)

ATTACH_ROWS = 2_000  # differences appended to one batch of transactions at most (ms of work)



@dataclass
class HeldStatement:
    """An ALTER whose new version waits for its table's repair beside the stream (see the
    module's description): the rows it retypes go out before it, deleted in the old
    version."""

    ddl: Ddl
    change: TableChange  # the table's, in ``ddl``
    cause: str  # the statement's transaction

    @property
    def table(self) -> TableName:
        return TableName(self.change.database, self.change.table)

    @property
    def previous(self) -> TableLayout:
        assert self.change.previous is not None
        return self.change.previous



# Stored bytes of a table from which its whole-table repairs are read beside the stream; a
# smaller table is repaired in the transaction that changed it, as it always was (a fraction
# of a second; its records then need no later transaction to ride on). Tests of a service
# process lower it with the environment variable (0: every keyed table's repair and resync)
MIN_BYTES = int(os.environ.get("CDC_TEST_BESIDE_MIN_BYTES") or 8 << 20)


def eligible(markers: list[Rowless], catalog: Catalog) -> bool:
    """Whether the markers ask for one keyed table, whole, with no cascade to follow and no
    change of system versioning, whose stored versions hold at least ``MIN_BYTES``."""
    tables = {TableName(m.database, m.table) for m in markers}
    if any(rewrite in m.reason for m in markers for rewrite in VERSIONING_REWRITES):
        return False  # the rows gain or lose a period: the pipeline's path knows them
    if len(tables) != 1 or not all(
            m.layout is not None and m.layout.primary_key and not m.layout.sequence
            and not m.edges and not m.columns for m in markers):
        return False
    return big(catalog, tables.pop())


def resync_eligible(table: TableName, catalog: Catalog) -> bool:
    """Whether a quarantined table's resync is read beside the stream: its stored versions
    hold at least ``MIN_BYTES`` (its key is the source's, learned by the read)."""
    return big(catalog, table)


def big(catalog: Catalog, table: TableName) -> bool:
    """Whether the table's whole-table repairs are read beside the stream, by its size."""
    return stored_bytes(catalog, table) >= MIN_BYTES


def stored_bytes(catalog: Catalog, table: TableName) -> int:
    """The bytes of the table's stored records (a fold reads them all)."""
    entry = catalog.get(table)
    if entry is None:
        return 0
    return sum(info.committed - info.header.size for info in entry.versions.values())



# Tests hold a repair after it has read the source and before it compares: the path of a file
# whose existence lets it go on (None: no hold; a test of a service process sets it with the
# environment variable)
HOLD_BEFORE_COMPARE: str | None = os.environ.get("CDC_TEST_REPAIR_HOLD") or None


class BesideRepair:
    """One table's whole-table repair, read in a process of its own (see the module's
    description): the service's event loop shares no interpreter lock with it."""

    def __init__(self, markers: list[Rowless], cause: str, address: SourceAddress,
                 columns: ColumnRules, frozen: FrozenCatalog, unstored: list[Rows],
                 path: str, closing: threading.Event, resync: float | None = None,
                 renamed: dict[str, str] | None = None,
                 statement: HeldStatement | None = None) -> None:
        first = markers[0]
        self.table = TableName(first.database, first.table)
        self.resync = resync  # a quarantined table's resync: when it was asked for
        self.released = False  # (a resync) its release went out
        self.markers = markers
        self.cause = cause
        self.reason = "; ".join(dict.fromkeys(m.reason for m in markers))
        self.key = key_names(first.layout) if first.layout is not None else ()
        self.held = HeldChanges(f"{path}.held")  # the table's changes after the cause
        self.dropped = 0  # held rows the source's read held already
        self.started = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.fallback = ""  # why the pipeline's own path must do it after all
        self.point: SnapshotPoint | None = None
        self.layout: TableLayout | None = None  # the records'
        self.differences = 0
        self.sent = 0  # differences attached so far
        # a share of its records, of the rows retyped or of the changes it held went out
        self.placed_any = False
        self.statement = statement  # held for the repair, until ``statement_out``
        self.statement_out = False
        self.gone = 0  # rows the statement retypes (:class:`HeldStatement`)
        self._job = Job(self.table, first.layout, self.key, self.reason, cause, address,
                         columns, frozen,
                         [(r.layout, r.kind, list(r.rows)) for r in unstored], path,
                         HOLD_BEFORE_COMPARE, os.getpid(), dict(renamed or {}),
                         None if statement is None else
                         (statement.change, statement.previous))
        self._path = path
        self._closing = closing
        self._cancel = threading.Event()
        self._next = 0  # the next difference to attach
        self._next_gone = 0 if statement is not None else -1  # the next row retyped out
        self._view = 0  # the stream's table in the file's rows (the process says which)
        self._fit: Fit | None = None

    def start(self) -> None:
        log.info("%s: the repair of %s is read beside the stream (%s)", self.cause,
                 self.table, self.reason)
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        process = context.Process(target=work, args=(self._job, theirs),
                                  name=f"cdcserver repair {self.table}", daemon=True)
        process.start()
        theirs.close()
        threading.Thread(target=self._watch, args=(process, mine),
                         name=f"repair {self.table}", daemon=True).start()

    def cancel(self) -> None:
        """Stop the repair's process; its files go with it, the changes held too."""
        self._cancel.set()
        self.held.close()
        if self.done.is_set():
            self._remove()

    def _watch(self, process: Any, pipe: Any) -> None:
        """(A thread.) The process's progress and outcome, or its end when called off."""
        try:
            while self.error is None and self.point is None and not self.fallback:
                if self._cancel.is_set() or self._closing.is_set():
                    self.error = Cancelled(f"the repair of {self.table} was called off")
                elif pipe.poll(0.2):
                    self._heard(pipe.recv())
                elif not process.is_alive() and not pipe.poll(0):
                    self.error = SourceError(f"the repair's process ended (exit code "
                                             f"{process.exitcode})")
        except (EOFError, OSError) as exc:
            self.error = SourceError(f"the repair's process ended (exit code "
                                     f"{process.exitcode}): {exc}")
        finally:
            if process.is_alive():
                process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
            pipe.close()
            self.done.set()
            if self._cancel.is_set() or self.error is not None or self.fallback:
                self._remove()

    def _heard(self, message: tuple[Any, ...]) -> None:
        what = message[0]
        if what == "progress":
            log.info("%s: %d rows of %s read for its repair", self.cause, message[1],
                     self.table)
        elif what == "done":
            result: Result = message[1]
            self.layout, self.reason = result.layout, result.reason
            self.fallback, self.differences = result.fallback, result.differences
            self.gone, self._view = result.gone, result.view
            self.point = result.point
            if not self.fallback:
                log.info("%s: %d rows of %s differ from the stream at the watermark %s:%d; "
                         "read in %.1f s", self.cause, self.differences, self.table,
                         result.point.file, result.point.pos, time.monotonic() - self.started)
        elif what == "error":
            kind, text = message[1], message[2]
            # a disk-full repair needs what its file held again, and more: replication
            # resumes for it only when there is room for that (not to fill the disk again)
            self.error = Cancelled(text) if kind == "cancelled" else \
                SourceUnavailable(text) if kind == "retry" else \
                DiskFull(text, database_bytes(self._path)) if kind == "disk-full" else \
                StoreDamaged(text) if kind == "disk-failed" else SourceError(text)

    # -- the pipeline's side --------------------------------------------------------------

    def hold(self, rows: Rows) -> None:
        """The stream changed the table after the cause: the change waits for the repair."""
        self.held.add(rows)

    def due(self, commit: Commit) -> bool:
        """Whether records may be attached to this transaction: the read is done and the
        stream has reached the watermark."""
        if not self.done.is_set() or self.error is not None or self.fallback:
            return False
        assert self.point is not None
        return reached(commit.position, self.point)

    def attach(self, commit: Commit, note: str) -> list[Rows]:
        """(In a thread.) The next ``ATTACH_ROWS`` differences as records of ``commit``."""
        assert self.layout is not None
        if self._fit is None:
            self._fit = Fit(self.layout)
        names = [c.name for c in self.layout.columns]
        found: dict[int, list[tuple[Any, ...]]] = {DELETE: [], UPDATE: [], INSERT: []}
        with contextlib.closing(sqlite3.connect(self._path)) as db:
            rows = db.execute(DIFFERENCES, (self._view, self._next, ATTACH_ROWS)).fetchall()
        for seq, kind, mine, theirs in rows:
            self._next = seq + 1
            found[kind] += images(kind, mine, theirs, self._fit, names)
            self.sent += 1
        if len(rows) < ATTACH_ROWS:
            self._next = -1  # all out
        self.placed_any = self.placed_any or bool(rows)
        return [Rows(self.layout, KINDS[kind], commit.timestamp, images,
                     commit.position.file, commit.position.pos, repair=note)
                for kind, images in found.items() if images]

    @property
    def letting_go(self) -> HeldStatement | None:
        """The statement it holds, not out yet: to go out with the rows it retypes when
        the repair does not (it is called off, or fails)."""
        return None if self.statement is None or self.statement_out else self.statement

    def attach_retyped(self, commit: Commit, note: str) -> list[Change]:
        """(In a thread.) A held statement's next ``ATTACH_ROWS`` rows it retypes, deleted in
        the old version as a consumer holds them, as records of ``commit``; once none is
        left, the statement itself. Nothing once the statement is out."""
        held = self.letting_go
        if held is None:
            return []
        out: list[Change] = []
        if self._next_gone >= 0:
            with contextlib.closing(sqlite3.connect(self._path)) as db:
                rows = db.execute("SELECT seq, image FROM gone WHERE seq >= ? ORDER BY seq "
                                  "LIMIT ?", (self._next_gone, ATTACH_ROWS)).fetchall()
            if rows:
                self._next_gone = rows[-1][0] + 1
                self.placed_any = True
                out.append(Rows(held.previous, RowsKind.DELETE, commit.timestamp,
                                [pickle.loads(image) for _, image in rows],
                                commit.position.file, commit.position.pos, repair=note))
            if len(rows) == ATTACH_ROWS:
                return out  # more in the next share
            self._next_gone = -1
        self.statement_out = self.placed_any = True
        return [*out, replace(held.ddl, released=held.cause)]

    @property
    def attached(self) -> bool:
        """Whether every difference is out (then the held changes follow)."""
        return self._next < 0

    def release(self, commit: Commit) -> list[Rows]:
        """The next share of the held changes, in ``commit``: those the source's read
        already held (at or before the watermark) are dropped, the records brought the table
        there. Each is marked released (a sink that holds the repair had it where it was
        withheld, :meth:`.BesideRepairs._withheld`). Once one is out the repair counts as
        placed in part (:attr:`placed_any`), records or none: a commit that said it was
        not placed would have a replay give that sink its records, which fold in the
        changes already released to it."""
        point = self.point
        assert point is not None
        out = []
        for rows in self.held.take(ATTACH_ROWS):
            if rows.file and not past_watermark(rows.file, rows.pos, point):
                self.dropped += len(rows.rows)
                continue
            out.append(replace(rows, file=commit.position.file, pos=commit.position.pos,
                               start=0, released=self.cause if self.resync is None else ""))
        self.placed_any = self.placed_any or bool(out)
        return out

    @property
    def finished(self) -> bool:
        return self.attached and not self.held

    def close(self) -> None:
        self.held.close()
        self._remove()

    def _remove(self) -> None:
        """(The pipeline's thread or the watching one.) The repair's SQLite file."""
        remove_database(self._path)


