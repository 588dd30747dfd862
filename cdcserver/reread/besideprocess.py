"""The process that reads a whole table's repair beside the stream (:mod:`.beside`, steps 1
to 3): it folds the stream's table into a private view, spools the source's rows at the
watermark beside it, and writes their differences, each as the records that repair it, into
the repair's own SQLite file; the service attaches them from there.

It runs at a lower priority than the service and ends with it; what it is given is a pickled
:class:`Job`, what it says back goes through a pipe: progress, its :class:`Result`, or an
error the service reads again (the source's trouble) or quarantines the table for.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cdcserver.core.capture import ColumnRules
from cdcserver.core.changes import Rows, RowsKind, TableChange, TableLayout
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import DefinitionChanged
from cdcserver.core.lifetime import die_with_parent
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.difference import Fit, same_row, same_shape, view_key
from cdcserver.reread.frozen import FrozenCatalog
from cdcserver.reread.readview import (
    ReadView,
    check_readable,
    definition_changed,
    unreachable,
)
from cdcserver.reread.retype import renders_otherwise, retyped
from cdcserver.reread.tableview import Row, TableView, ViewsClosed
from cdcserver.reread.view import Views, key_names
from cdcserver.store.faults import disk_failed, disk_full

_PROGRESS_ROWS = 1_000_000  # rows read between two log lines
# The kinds of difference, as written (in this order the records of a share go out)
DELETE, UPDATE, INSERT = 0, 1, 2
KINDS = {DELETE: RowsKind.DELETE, UPDATE: RowsKind.UPDATE, INSERT: RowsKind.INSERT}


class Cancelled(Exception):
    """The repair was called off (a schema statement, the pipeline stopping)."""


@dataclass
class Job:
    """What the repair's process is given (it is pickled to it)."""

    table: TableName
    stream_layout: TableLayout | None  # None: a resync (the table read as the source has it)
    key: tuple[str, ...]
    reason: str
    cause: str
    address: SourceAddress
    columns: ColumnRules
    frozen: FrozenCatalog
    unstored: list[tuple[TableLayout, RowsKind, list[tuple[Any, ...]]]]
    path: str
    hold: str | None  # a file to wait for before comparing (a test's hold point)
    service: int  # the service's process id
    renamed: dict[str, str]  # columns the statement renamed (not in the frozen versions)
    retype: tuple[TableChange, TableLayout] | None  # a held statement's: the rows it retypes


@dataclass
class Result:
    point: SnapshotPoint
    layout: TableLayout | None  # the records' (None: a fallback)
    reason: str
    fallback: str
    differences: int
    gone: int  # rows a held statement retypes, deleted in the old version
    view: int = 0  # the id of the stream's table in the file's ``rows`` (its differences')


def work(job: Job, pipe: Any) -> None:
    """The repair's process: read, compare, say how it went (at a lower priority than the
    service: the stream's transactions come first)."""
    with contextlib.suppress(OSError):
        os.nice(10)
    _die_with_the_service(job.service)
    try:
        result = _Reader(job, lambda rows: pipe.send(("progress", rows))).run()
        pipe.send(("done", result))
    except BaseException as exc:  # noqa: BLE001 - told to the service
        kind = "cancelled" if isinstance(exc, (Cancelled, ViewsClosed)) else \
            "disk-full" if disk_full(exc) else "disk-failed" if disk_failed(exc) else \
            "retry" if _retried(exc) else "fail"
        pipe.send(("error", kind, f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def _die_with_the_service(service: int) -> None:
    """End with the service's thread that started this process (:mod:`core.lifetime`), so
    that a service killed with -9 leaves no repair reading on; end now if it already has
    (``service``: its process id)."""
    die_with_parent()
    if os.getppid() != service:  # the service ended before the signal was asked for
        os._exit(1)


def _retried(exc: BaseException) -> bool:
    """Whether the pipeline reads it again (the source's trouble, or a schema statement that
    raced the read); otherwise the table's (a privilege, a lock held past the wait, a
    discarded tablespace): it is quarantined, with no second read that would fail too."""
    return isinstance(exc, DefinitionChanged) or unreachable(exc) or definition_changed(exc)


class _Reader:
    """The work of the repair's process (see the module's description, steps 1 to 3)."""

    def __init__(self, job: Job, progress: Callable[[int], None]) -> None:
        self.job = job
        self.progress = progress
        self.reason = job.reason
        self.fallback = ""
        self.differences = 0
        self.gone = 0

    def run(self) -> Result:
        job = self.job
        check_readable(job.address, job.table)  # before minutes of folding
        private = Views(job.path)
        try:
            # a repair's view is keyed as the stream has the table; a resync's as the source
            view = self._fold(private, job.key) if job.stream_layout is not None else None
            read = ReadView(job.address, [job.table], job.columns)
            try:
                point = read.point
                layout = self._layout(read)
                if layout is not None:
                    if view is None:
                        view = self._fold(private, key_names(layout))
                    self._spool_source(private.db, view, read, layout)
            finally:
                read.close()
            if layout is not None:
                assert view is not None
                self._hold()
                self._compare(private.db, view, layout)
        finally:
            private.close()
        return Result(point, layout, self.reason, self.fallback, self.differences, self.gone,
                      view.id if view is not None else 0)

    def _fold(self, private: Views, key: tuple[str, ...]) -> TableView:
        """The stream's table right after the cause: its frozen versions and unstored rows,
        the rows a held statement retypes out, its columns renamed as the statement did."""
        job = self.job
        before = {new: old for old, new in job.renamed.items()}
        view = private.fold(job.frozen, job.table,  # type: ignore[arg-type]
                            tuple(before.get(c, c) for c in key))
        for stream_layout, kind, rows in job.unstored:
            view.apply(Rows(stream_layout, kind, 0, rows))
        if job.retype is not None:
            self._retyped_out(private.db, view, *job.retype)
        if job.renamed:
            private.rename_columns(job.table, job.renamed)
            view = private.tables[job.table]
        return view

    def _retyped_out(self, db: sqlite3.Connection, view: TableView, change: TableChange,
                     previous: TableLayout) -> None:
        """The rows whose values the statement's new types render otherwise: written (as the
        old version's deletes) to go out before the statement, and out of the view, so that
        the comparison inserts them as the source has them."""
        columns = retyped(change, previous)
        names, fit = [c.name for c in previous.columns], Fit(previous)
        db.execute("CREATE TABLE gone (seq INTEGER PRIMARY KEY, key BLOB, image BLOB)")
        db.execute("BEGIN")
        pending: list[tuple[int, bytes, bytes]] = []
        for key, row in _sorted_rows(db.cursor(), "SELECT key, row FROM rows WHERE view = ? "
                                     "ORDER BY key", (view.id,)):
            if renders_otherwise(row, columns):
                pending.append((self.gone, key, _pack(_values(fit(row, None), names))))
                self.gone += 1
            if len(pending) >= 10_000:
                db.executemany("INSERT INTO gone VALUES (?, ?, ?)", pending)
                pending = []
        db.executemany("INSERT INTO gone VALUES (?, ?, ?)", pending)
        db.execute("DELETE FROM rows WHERE view = ? AND key IN (SELECT key FROM gone)",
                   (view.id,))
        db.execute("COMMIT")

    def _hold(self) -> None:
        while self.job.hold is not None and not os.path.exists(self.job.hold):
            time.sleep(0.05)

    def _layout(self, read: ReadView) -> TableLayout | None:
        """The columns the rows are read and written in: the stream's, or the source's where
        it has moved on. None (and a fallback) where the pipeline's own path must read."""
        job = self.job
        source = read.source_layout(job.table)
        if read.versioned(job.table):
            self.fallback = "a system-versioned table"
            return None
        if job.stream_layout is None:  # a resync: in the source's columns, by its key
            if source is None or not source.primary_key:
                self.fallback = "the table is gone from the source" if source is None else \
                    "a table without a primary key"
                return None
            return source
        if view_key(job.stream_layout, source) != job.key:
            self.fallback = "the source's primary key is not the stream's"
            return None
        if source is None:
            return job.stream_layout  # gone at the watermark: every row of the view goes
        if not same_shape(job.stream_layout, source):
            self.reason += " (the whole table was read again: its columns on the source " \
                           "were no longer the stream's)"
            return source
        return job.stream_layout

    def _spool_source(self, db: sqlite3.Connection, view: TableView, read: ReadView,
                      layout: TableLayout) -> None:
        names = [c.name for c in layout.columns]
        db.execute("CREATE TABLE source (key BLOB PRIMARY KEY, row BLOB)")
        db.execute("BEGIN")
        count = 0
        for batch in read.row_batches(layout):
            db.executemany("INSERT OR REPLACE INTO source VALUES (?, ?)",
                           [(view.key_of(row), _pack(row))
                            for row in (dict(zip(names, values, strict=True))
                                        for values in batch)])
            before, count = count, count + len(batch)
            if count // _PROGRESS_ROWS != before // _PROGRESS_ROWS:
                self.progress(count)
        db.execute("COMMIT")

    def _compare(self, db: sqlite3.Connection, view: TableView, layout: TableLayout) -> None:
        """The view and the source in key order, each difference written as its key and
        kind: its records are made from the two rows as they go out (:func:`images`), so
        the file holds no third copy of the table (a whole table's repair differs in every
        row, the before and after images of an update twice the row)."""
        db.execute("CREATE TABLE diff (seq INTEGER PRIMARY KEY, key BLOB, kind INTEGER)")
        mine = _sorted_rows(db.cursor(), "SELECT key, row FROM rows WHERE view = ? "
                            "ORDER BY key", (view.id,))
        theirs = _sorted_rows(db.cursor(), "SELECT key, row FROM source ORDER BY key", ())
        pending: list[tuple[int, bytes, int]] = []
        db.execute("BEGIN")
        for key, a, b in _merged(mine, theirs):
            if a is not None and b is not None and same_row(a, b):
                continue
            kind = INSERT if a is None else DELETE if b is None else UPDATE
            pending.append((self.differences, key, kind))
            self.differences += 1
            if len(pending) >= 10_000:
                db.executemany("INSERT INTO diff VALUES (?, ?, ?)", pending)
                pending = []
        db.executemany("INSERT INTO diff VALUES (?, ?, ?)", pending)
        db.execute("COMMIT")


# A share of differences with the two rows each is made from (the view's, the source's)
DIFFERENCES = """
    SELECT d.seq, d.kind, r.row, s.row FROM diff AS d
    LEFT JOIN rows AS r ON r.view = ? AND r.key = d.key
    LEFT JOIN source AS s ON s.key = d.key
    WHERE d.seq >= ? ORDER BY d.seq LIMIT ?"""


def images(kind: int, mine: bytes | None, theirs: bytes | None, fit: Fit,
           names: list[str]) -> list[tuple[Any, ...]]:
    """The records that repair one difference (:data:`DIFFERENCES`' rows, pickled): the
    source's row inserted, the stream's deleted (as a consumer holds it, in the records'
    columns), or the one updated to the other."""
    a = pickle.loads(mine) if mine is not None else None
    b = pickle.loads(theirs) if theirs is not None else None
    if kind == INSERT:
        assert b is not None
        return [_values(b, names)]
    assert a is not None
    if kind == DELETE:
        return [_values(fit(a, None), names)]
    assert b is not None
    return [_values(fit(a, b), names), _values(b, names)]


def _sorted_rows(db: Any, sql: str, args: tuple[Any, ...]) -> Iterator[tuple[bytes, Row]]:
    for key, row in db.execute(sql, args):
        yield key, pickle.loads(row)


def _merged(mine: Iterator[tuple[bytes, Row]], theirs: Iterator[tuple[bytes, Row]]
            ) -> Iterator[tuple[bytes, Row | None, Row | None]]:
    """Two scans in key order, merged: (key, the view's row, the source's row)."""
    a, b = next(mine, None), next(theirs, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            assert a is not None
            yield a[0], a[1], None
            a = next(mine, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(theirs, None)
        else:
            yield a[0], a[1], b[1]
            a, b = next(mine, None), next(theirs, None)


def _values(row: Row, names: list[str]) -> tuple[Any, ...]:
    return tuple(row.get(n) for n in names)


def _pack(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)
