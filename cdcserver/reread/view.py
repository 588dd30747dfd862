"""The stream's own rows of a table: what a consumer that applies the stream holds.

A consumer applies each record (``insert`` and ``update_after`` store the row under its key,
``update_before`` and ``delete`` remove it) and empties the table when a version says it was
truncated, dropped or created afresh (``protocol.md``, "Schemas"). A table view is that
consumer's table, kept by the service so that a repair can compare it with the source: built
the first time it is needed by folding the table's stored versions (:meth:`Views.fold`), then
kept up to date with every change the pipeline passes on.

Rows are kept in SQLite (``state/views.sqlite``, rebuilt on every start: it is derived data),
one :class:`~cdcserver.reread.tableview.TableView` per watched table (:mod:`.tableview`); a
view is folded from the store by :mod:`.fold`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cdcserver.core.changes import Rows, TableLayout
from cdcserver.core.names import TableName
from cdcserver.reread.fold import fold_into
from cdcserver.reread.tableview import Row, TableView, ViewsClosed
from cdcserver.store.catalog import Catalog
from cdcserver.store.faults import unopenable

T = TypeVar("T")


class Views:
    """The views of the tables being watched, in one scratch SQLite file."""

    def __init__(self, path: str) -> None:
        remove_database(path)
        for left in glob.glob(glob.escape(path) + ".repair-*"):  # a killed service's repairs
            with contextlib.suppress(FileNotFoundError):
                os.unlink(left)
        self.path = path
        try:
            self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        except sqlite3.OperationalError as exc:  # "unable to open": the disk may say why
            raise unopenable(path) or exc from exc
        self.db.executescript("""
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            CREATE TABLE rows (view INTEGER, key BLOB, row BLOB, count INTEGER,
                               PRIMARY KEY (view, key));
            CREATE TABLE matches (view INTEGER, number INTEGER, value BLOB, key BLOB);
            CREATE INDEX matches_value ON matches (view, number, value);
            CREATE INDEX matches_key ON matches (view, key);
        """)
        self.tables: dict[TableName, TableView] = {}
        self._next = 0
        # Names a rename moved a view to that the store does not know yet (it stores the
        # statement at the end of the batch): a view of them cannot be folded from the store.
        self._unstored: set[TableName] = set()
        # Work in a thread holds the lock; closing waits for it (a pipeline cancelled while
        # a thread folds a view must not close the database under it) and stops a fold
        self._lock = threading.Lock()
        self._closing = threading.Event()

    @property
    def closing(self) -> threading.Event:
        """Set once the views close (the pipeline stops): work beside them stops too."""
        return self._closing

    def locked(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` (in a thread) while no other work uses the views."""
        with self._lock:
            if self._closing.is_set():
                raise ViewsClosed("the views are closed")
            return work(*args)

    def get(self, table: TableName) -> TableView | None:
        return self.tables.get(table)

    def new(self, table: TableName, key: tuple[str, ...]) -> TableView:
        self.drop(table)
        self._next += 1
        view = self.tables[table] = TableView(self.db, self._next, table, key)
        return view

    def unstored(self, table: TableName) -> bool:
        """Whether a rename the store does not hold yet moved a view to ``table``."""
        return table in self._unstored

    def stored(self) -> None:
        """The store holds every statement seen so far: views may be folded from it."""
        self._unstored.clear()

    def rekeyed(self, table: TableName, key: tuple[str, ...]) -> TableView:
        """The table's view under a new primary key, from its own rows: for a view a rename
        moved here that the store does not know yet (:meth:`unstored`), which folding the
        store again would lose. (Where rows collide under the new key, the last one read
        stays; a fold from the store keeps the stream's order.)"""
        return self._rebuilt(table, key, lambda row: row)

    def _rebuilt(self, table: TableName, key: tuple[str, ...],
                 row_now: Callable[[Row], Row]) -> TableView:
        """The table's view anew under ``key``, from its own rows as ``row_now`` makes them."""
        old = self.tables.pop(table)
        rows = list(old.rows())
        old.clear()
        view = self.new(table, key)
        for row, count in rows:
            moved = row_now(row)
            for _ in range(count):
                view.put(moved)
        return view

    def rename_columns(self, table: TableName, renamed: dict[str, str]) -> None:
        """An ALTER renamed columns (a swap is ``{a: b, b: a}``): the rows held keep their
        values under the new names, as a consumer's do."""
        old = self.tables.get(table)
        if old is not None:
            self._rebuilt(table, tuple(renamed.get(c, c) for c in old.key),
                          lambda row: {renamed.get(c, c): v for c, v in row.items()})

    def move(self, old: TableName, new: TableName) -> None:
        """``old`` was renamed ``new``: its view (if any) is ``new``'s now."""
        view = self.tables.pop(old, None)
        self.drop(new)
        self._unstored.discard(old)
        if view is not None:
            view.table = new
            self.tables[new] = view
            self._unstored.add(new)

    def drop(self, table: TableName) -> None:
        view = self.tables.pop(table, None)
        if view is not None:
            view.clear()

    def apply(self, rows: Rows) -> None:
        """Keep a watched table's view up to date with a change the stream carries."""
        view = self.tables.get(TableName(rows.layout.database, rows.layout.table))
        if view is not None:
            if view.key != key_names(rows.layout):
                if not self.unstored(view.table):
                    self.drop(view.table)  # a new primary key: fold again when needed
                    return
                view = self.rekeyed(view.table, key_names(rows.layout))
            view.apply(rows)

    def fold(self, catalog: Catalog, table: TableName, key: tuple[str, ...],
             stored: TableName | None = None) -> TableView:
        """A view built from the table's stored versions, as a consumer reading the stream
        from its first version holds it now (``stored``: the name the store holds its rows
        under, where a rename it does not hold yet gave them this one)."""
        view = self.new(table, key)
        self.db.execute("BEGIN")
        try:
            fold_into(view, catalog, stored or table, self._closing)
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # SQLite ends it itself on a full disk
                self.db.execute("ROLLBACK")
            raise
        return view

    def close(self) -> None:
        """Stop a fold under way, wait for the work holding the views, close them."""
        self._closing.set()
        with self._lock:
            self.db.close()


_DATABASE_FILES = ("", "-journal", "-wal", "-shm")  # a SQLite file and its journal files


def database_bytes(path: str) -> int:
    """The bytes a scratch SQLite file and its journal files hold (those there)."""
    size = 0
    for suffix in _DATABASE_FILES:
        with contextlib.suppress(FileNotFoundError):
            size += os.path.getsize(path + suffix)
    return size


def remove_database(path: str) -> None:
    """A scratch SQLite file and its journal files, if there."""
    for suffix in _DATABASE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def key_names(layout: TableLayout) -> tuple[str, ...]:
    return tuple(layout.columns[i].name for i in layout.primary_key)

