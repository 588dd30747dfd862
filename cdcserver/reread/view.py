"""The stream's own rows of a table: what a consumer that applies the stream holds.

A consumer applies each record (``insert`` and ``update_after`` store the row under its key,
``update_before`` and ``delete`` remove it) and empties the table when a version says it was
truncated, dropped or created afresh (``protocol.md``, "Schemas"). A :class:`TableView` is that
consumer's table, kept by the service so that a repair can compare it with the source: built
the first time it is needed by folding the table's stored versions (:meth:`Views.fold`), then
kept up to date with every change the pipeline passes on.

Rows are kept in SQLite (``state/views.sqlite``, rebuilt on every start: it is derived data)
under their primary key, as dictionaries of column name to the replication's Python values; a
table without a primary key is a multiset of whole rows. For foreign-key cascades a view can
find the rows whose columns hold given values (:meth:`TableView.matching`); the match is loose
(case and trailing spaces are ignored in text) because the source's collation decides
equality and the repair re-reads every candidate anyway.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from cdcserver.core.changes import Rows, RowsKind, TableLayout
from cdcserver.core.names import TableName
from cdcserver.reread.values import from_avro
from cdcserver.store.avrofile import Block, scan_blocks
from cdcserver.store.catalog import Catalog, VersionInfo
from cdcserver.store.records import Record, decode_records

Row = dict[str, Any]
T = TypeVar("T")


class ViewsClosed(Exception):
    """The views were closed (the pipeline stops) while work on them was under way."""
_EMPTYING = ("truncate", "drop", "create")  # a version that starts the table afresh


class TableView:
    """One table's rows as the stream has them; ``key`` names the primary key's columns
    (empty: a multiset of whole rows)."""

    def __init__(self, db: sqlite3.Connection, number: int, table: TableName,
                 key: tuple[str, ...]) -> None:
        self.db = db
        self.id = number
        self.table = table
        self.key = key
        self._indexes: dict[tuple[str, ...], int] = {}  # matched columns -> index number

    # -- keys --------------------------------------------------------------------------

    def key_of(self, row: Row) -> bytes:
        if self.key:
            return _pack(tuple(row.get(c) for c in self.key))
        return _pack(tuple(sorted(row.items())))

    # -- changes -----------------------------------------------------------------------

    @property
    def keyed_fold(self) -> bool:
        """Whether changes may be collapsed per key before they are written (:meth:`settle`):
        a keyed view with no index of matched columns to keep in step."""
        return bool(self.key) and not self._indexes

    def settle(self, final: dict[bytes, Row | None]) -> None:
        """Each key's last state (None: removed), in two statements: what a fold's run of
        ``put`` and ``remove`` calls on a keyed view without indexes leaves (the keys are
        distinct, so the writes commute)."""
        assert self.keyed_fold
        self.db.executemany("DELETE FROM rows WHERE view = ? AND key = ?",
                            [(self.id, key) for key, row in final.items() if row is None])
        self.db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)",
                            [(self.id, key, _pack(row)) for key, row in final.items()
                             if row is not None])

    def apply(self, rows: Rows) -> None:
        names = [c.name for c in rows.layout.columns]
        images = [dict(zip(names, r, strict=True)) for r in rows.rows]
        if self.key and not self._indexes and self._apply_keyed(rows.kind, images):
            return
        if rows.kind == RowsKind.INSERT:
            for row in images:
                self.put(row)
        elif rows.kind == RowsKind.DELETE:
            for row in images:
                self.remove(row)
        else:
            for before, after in zip(images[::2], images[1::2], strict=True):
                self.remove(before)
                self.put(after)

    def _apply_keyed(self, kind: RowsKind, images: list[Row]) -> bool:
        """A keyed view without indexes, in one statement per event (a bulk change's
        rows are many): inserts and deletes, and updates that keep every row's key; False
        for an update that changes keys (applied row by row, in order)."""
        if kind == RowsKind.INSERT:
            self.db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)",
                                [(self.id, self.key_of(r), _pack(r)) for r in images])
            return True
        if kind == RowsKind.DELETE:
            self.db.executemany("DELETE FROM rows WHERE view = ? AND key = ?",
                                [(self.id, self.key_of(r)) for r in images])
            return True
        afters = []
        for before, after in zip(images[::2], images[1::2], strict=True):
            key = self.key_of(after)
            if key != self.key_of(before):
                return False
            afters.append((self.id, key, _pack(after)))
        self.db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)", afters)
        return True

    def put(self, row: Row) -> None:
        key = self.key_of(row)
        if self.key:
            self._drop_index_entries(key)
            self.db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)",
                            (self.id, key, _pack(row)))
        else:
            self.db.execute("INSERT INTO rows VALUES (?, ?, ?, 1) ON CONFLICT DO UPDATE "
                            "SET count = count + 1", (self.id, key, _pack(row)))
        for columns, number in self._indexes.items():
            self._index(number, columns, key, row)

    def remove(self, row: Row) -> None:
        key = self.key_of(row)
        if self.key:
            self.db.execute("DELETE FROM rows WHERE view = ? AND key = ?", (self.id, key))
            self._drop_index_entries(key)
            return
        self.db.execute("UPDATE rows SET count = count - 1 WHERE view = ? AND key = ?",
                        (self.id, key))
        gone = self.db.execute("DELETE FROM rows WHERE view = ? AND key = ? AND count <= 0",
                               (self.id, key)).rowcount
        if gone:
            self._drop_index_entries(key)

    def clear(self) -> None:
        self.db.execute("DELETE FROM rows WHERE view = ?", (self.id,))
        self.db.execute("DELETE FROM matches WHERE view = ?", (self.id,))

    # -- reading -----------------------------------------------------------------------

    def get(self, key: bytes) -> Row | None:
        found = self.db.execute("SELECT row FROM rows WHERE view = ? AND key = ?",
                                (self.id, key)).fetchone()
        return pickle.loads(found[0]) if found else None

    def rows(self) -> Iterator[tuple[Row, int]]:
        """Every row, with how many times it is there (1 with a primary key)."""
        for row, count in self.db.execute("SELECT row, count FROM rows WHERE view = ?",
                                          (self.id,)):
            yield pickle.loads(row), count

    def matching(self, columns: tuple[str, ...], values: Sequence[tuple[Any, ...]]
                 ) -> list[Row]:
        """The rows whose ``columns`` hold (loosely) one of ``values``."""
        number = self._indexes.get(columns)
        if number is None:
            number = self._indexes[columns] = len(self._indexes)
            for row, _ in list(self.rows()):
                self._index(number, columns, self.key_of(row), row)
        found: dict[bytes, Row] = {}
        for value in values:
            loose = _pack(tuple(_loose(v) for v in value))
            for key, in self.db.execute(
                    "SELECT key FROM matches WHERE view = ? AND number = ? AND value = ?",
                    (self.id, number, loose)).fetchall():
                stored = self.get(key)
                if stored is not None:
                    found[key] = stored
        return list(found.values())

    def _index(self, number: int, columns: tuple[str, ...], key: bytes, row: Row) -> None:
        values = tuple(row.get(c) for c in columns)
        if any(v is None for v in values):
            return  # NULL references nothing
        self.db.execute("INSERT INTO matches VALUES (?, ?, ?, ?)",
                        (self.id, number, _pack(tuple(_loose(v) for v in values)), key))

    def _drop_index_entries(self, key: bytes) -> None:
        if self._indexes:
            self.db.execute("DELETE FROM matches WHERE view = ? AND key = ?", (self.id, key))


class Views:
    """The views of the tables being watched, in one scratch SQLite file."""

    def __init__(self, path: str) -> None:
        remove_database(path)
        for left in glob.glob(glob.escape(path) + ".repair-*"):  # a killed service's repairs
            with contextlib.suppress(FileNotFoundError):
                os.unlink(left)
        self.path = path
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
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
            _fold_into(view, catalog, stored or table, self._closing)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return view

    def close(self) -> None:
        """Stop a fold under way, wait for the work holding the views, close them."""
        self._closing.set()
        with self._lock:
            self.db.close()


def remove_database(path: str) -> None:
    """A scratch SQLite file and its journal files, if there."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def key_names(layout: TableLayout) -> tuple[str, ...]:
    return tuple(layout.columns[i].name for i in layout.primary_key)


def _fold_into(view: TableView, catalog: Catalog, table: TableName,
               closing: threading.Event) -> None:
    """Apply ``table``'s versions from the last one that emptied it (what came before is gone
    from a consumer's table). When that version made the table by a rename, the renamed
    table's rows as they were then come first: its versions up to the rename, and so on down
    the chain (a table swapped back and forth thousands of times: walked, not recursed).
    A version whose ``ddl`` names ``renamed_columns`` renames the columns of the rows held, as
    a consumer does: every row is kept under the view's (the last version's) names."""
    segments = _lineage(catalog, table)
    view.clear()
    for versions, names in reversed(segments):
        for info, (own, _) in zip(versions, names, strict=True):
            _fold_version(view, info, closing, own)


def _lineage(catalog: Catalog, table: TableName
             ) -> list[tuple[list[VersionInfo], list[tuple[dict[str, str], dict[str, str]]]]]:
    """The versions to fold, newest table first: each table's from its last emptying version
    (up to the rename that gave its rows to the table before it in the list), with where
    each version's column names end up."""
    segments = []
    renamed_to: tuple[str, str] | None = None
    onward: dict[str, str] = {}
    seen: set[tuple[TableName, tuple[str, str] | None]] = set()
    while (table, renamed_to) not in seen:
        seen.add((table, renamed_to))
        entry = catalog.get(table)
        if entry is None:
            break
        versions = []
        for number in sorted(entry.versions):
            info = entry.versions[number]
            ddl = info.schema.avsc.get("ddl") or {}
            if renamed_to is not None and ddl.get("renamed_to") == renamed_to[0] and \
                    info.schema.gtid == renamed_to[1]:
                break
            versions.append(info)
        kinds = [(v.schema.avsc.get("ddl") or {}).get("kind") for v in versions]
        start = max((i for i, kind in enumerate(kinds) if kind in _EMPTYING), default=0)
        folded = versions[start:]
        names = _names_onward(folded, onward)
        segments.append((folded, names))
        first = (folded[0].schema.avsc.get("ddl") or {}) if folded else {}
        if first.get("kind") != "create" or not first.get("renamed_from"):
            break
        renamed_to = (str(table), folded[0].schema.gtid)
        onward = names[0][1]  # the names just before the rename's version, onward
        table = TableName.parse(first["renamed_from"])
    return segments


def _names_onward(versions: list[VersionInfo], last: dict[str, str]
                  ) -> list[tuple[dict[str, str], dict[str, str]]]:
    """For each version, where its column names end up (``last`` maps the last version's),
    and where the names just before it end up (its own ``renamed_columns`` undone: a swap
    is ``{a: b, b: a}``). A name missing from a map stays as it is."""
    result = []
    mapping = dict(last)
    for info in reversed(versions):
        own = mapping
        renamed: dict[str, str] = (info.schema.avsc.get("ddl") or {}).get(
            "renamed_columns") or {}
        if renamed:
            mapping = {c: own.get(renamed.get(c, c), renamed.get(c, c))
                       for c in {*own, *renamed}}
        result.append((own, mapping))
    return result[::-1]


FOLD_BATCH = 20_000  # records of a keyed fold collapsed to one state per key, then written


def _fold_version(view: TableView, info: VersionInfo, closing: threading.Event,
                  names: dict[str, str]) -> None:
    fields = info.schema.columns
    converters = [(f.name, names.get(f.column, f.column), from_avro(f)) for f in fields]
    if view.keyed_fold and set(view.key) <= {column for _, column, _ in converters}:
        _fold_keyed(view, info, closing, converters)
        return
    for block in _blocks(info, closing):
        for record in decode_records(info, block):
            row = {column: convert(record.get(name)) for name, column, convert in converters}
            if record["event_type"] in ("insert", "update_after"):
                view.put(row)
            else:
                view.remove(row)


def _fold_keyed(view: TableView, info: VersionInfo, closing: threading.Event,
                converters: list[tuple[str, str, Any]]) -> None:
    """A keyed view without indexes: a batch of records collapsed to each key's last
    record, only its key's columns converted, then the survivors converted and written
    (:meth:`TableView.settle`). What ``put`` and ``remove`` per record would leave, in a
    fraction of the statements and conversions (a stream updates the same rows again and
    again)."""
    by_column = {column: (name, convert) for name, column, convert in converters}
    key = [by_column[column] for column in view.key]
    last: dict[bytes, Record | None] = {}  # each key's last record (None: removed)
    for block in _blocks(info, closing):
        for record in decode_records(info, block):
            packed = _pack(tuple(convert(record.get(name)) for name, convert in key))
            last[packed] = record if record["event_type"] in ("insert", "update_after") \
                else None
        if len(last) >= FOLD_BATCH:
            view.settle(_rows(last, converters))
            last = {}
    view.settle(_rows(last, converters))


def _rows(last: dict[bytes, Record | None], converters: list[tuple[str, str, Any]]
          ) -> dict[bytes, Row | None]:
    return {key: None if record is None else
            {column: convert(record.get(name)) for name, column, convert in converters}
            for key, record in last.items()}


def _blocks(info: VersionInfo, closing: threading.Event) -> Iterator[Block]:
    for block in scan_blocks(info.path, info.header, info.header.size, info.committed):
        if closing.is_set():
            raise ViewsClosed("the views were closed during a fold")
        yield block


def _loose(value: Any) -> Any:
    """A value as a foreign key may match it under any collation: text without case or
    trailing spaces."""
    if isinstance(value, str):
        return value.rstrip(" ").casefold()
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def _pack(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)
