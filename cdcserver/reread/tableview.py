"""One table's rows as the stream has them, kept in SQLite: a :class:`TableView`.

Rows are kept under their primary key, as dictionaries of column name to the replication's
Python values; a table without a primary key is a multiset of whole rows. For foreign-key
cascades a view can find the rows whose columns hold given values (:meth:`TableView.matching`);
the match is loose (case and trailing spaces are ignored in text) because the source's
collation decides equality and the repair re-reads every candidate anyway. The views of all
watched tables share one file (:class:`cdcserver.reread.view.Views`).
"""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

from cdcserver.core.changes import Rows, RowsKind
from cdcserver.core.names import TableName

Row = dict[str, Any]


class ViewsClosed(Exception):
    """The views were closed (the pipeline stops) while work on them was under way."""


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
            return pack(tuple(row.get(c) for c in self.key))
        return pack(tuple(sorted(row.items())))

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
                            [(self.id, key, pack(row)) for key, row in final.items()
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
                                [(self.id, self.key_of(r), pack(r)) for r in images])
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
            afters.append((self.id, key, pack(after)))
        self.db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)", afters)
        return True

    def put(self, row: Row) -> None:
        key = self.key_of(row)
        if self.key:
            self._drop_index_entries(key)
            self.db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, 1)",
                            (self.id, key, pack(row)))
        else:
            self.db.execute("INSERT INTO rows VALUES (?, ?, ?, 1) ON CONFLICT DO UPDATE "
                            "SET count = count + 1", (self.id, key, pack(row)))
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
            loose = pack(tuple(_loose(v) for v in value))
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
                        (self.id, number, pack(tuple(_loose(v) for v in values)), key))

    def _drop_index_entries(self, key: bytes) -> None:
        if self._indexes:
            self.db.execute("DELETE FROM matches WHERE view = ? AND key = ?", (self.id, key))



def _loose(value: Any) -> Any:
    """A value as a foreign key may match it under any collation: text without case or
    trailing spaces."""
    if isinstance(value, str):
        return value.rstrip(" ").casefold()
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def pack(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)
