"""The GTID index and the transaction log, in ``state/index.sqlite``.

``blocks`` is sparse: for each table version and replication domain it records a block's offset
and the GTID sequence of its first transaction, at most once per ``spacing`` bytes of that
domain's data. Where a domain's sequence numbers grow with the file, a seek for ``D-S-N`` is
the largest indexed offset of domain D whose sequence is below N, plus a short scan of at most
``spacing`` bytes (``seek_offset``).

``notes`` marks the blocks that hold a repair's records (records the binlog did not carry, see
``cdcserver/reread``) with why they are there; the JSON stream shows it on each such record.

``transactions`` is every transaction the store applied, numbered in the order it applied them
(``id``, its *ordinal*), with ``unordered`` and ``touched``: the transaction log
(:mod:`cdcserver.store.transactionlog`, the base of :class:`StoreIndex`). The tables' layout and
its migrations are :mod:`cdcserver.store.indexschema`.

New entries are kept in memory and written in one SQLite transaction by ``persist()``, which the
store calls from its flush, before the checkpoint. A crash can leave entries for data past the
checkpoint; ``truncate()`` drops them on start. Readers combine SQLite with the pending entries,
so a seek never misses recent data.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from cdcserver.core.gtid import Gtid, GtidState, binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.store.indexschema import SCHEMA, VERSION, migrate, name_tables, stored_sequence
from cdcserver.store.transactionlog import (
    COLUMNS,
    TransactionInfo,
    TransactionLog,
    tables_json,
    transaction_of,
)


@dataclass(frozen=True, slots=True)
class _BlockEntry:
    table: TableName
    version: int
    offset: int
    domain: int
    seq: int


class StoreIndex(TransactionLog):
    def __init__(self, path: str, spacing: int = 64 * 1024) -> None:
        self.path = path
        self.spacing = spacing
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # An index of version 3 names tables as text until name_tables() converts it
        self._named = migrate(db)
        db.executescript(SCHEMA)
        if self._named:
            db.execute(f"PRAGMA user_version={VERSION}")
        # FULL: a commit returns once the WAL is synced. The flush writes the checkpoint
        # after the index's commit, and promises the checkpoint covers nothing a crash
        # could take back (with NORMAL the WAL was synced only at SQLite's own checkpoint:
        # a power loss could drop index rows a checkpoint covers, found in review). One
        # fdatasync more per flush.
        db.execute("PRAGMA synchronous=FULL")
        super().__init__(db)
        self._pending_blocks: list[_BlockEntry] = []
        self._pending_notes: list[tuple[TableName, int, int, str]] = []
        self._last_indexed: dict[tuple[TableName, int, int], int] = {}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def name_tables(self, split: Callable[[str], TableName]) -> None:
        """Convert an older index's "db.table" texts (``split`` tells the table: the store
        splits at the dot that names a table it holds); nothing if it is converted."""
        with self._lock:
            if not self._named:
                name_tables(self._db, split)
                self._named = True
                self._load_transaction_state()

    # -- writing -----------------------------------------------------------------------

    def note_block(self, table: TableName, version: int, offset: int, gtid: Gtid) -> None:
        """A transaction's data for ``table`` starts at ``offset``; index it if the last
        entry for this domain is far enough behind."""
        key = (table, version, gtid.domain)
        last = self._last_indexed.get(key)
        if last is not None and offset - last < self.spacing:
            return
        self._last_indexed[key] = offset
        with self._lock:
            self._pending_blocks.append(_BlockEntry(table, version, offset, gtid.domain,
                                                    gtid.sequence))

    def note_repair(self, table: TableName, version: int, offset: int, note: str) -> None:
        """The block at ``offset`` holds a repair's records."""
        with self._lock:
            self._pending_notes.append((table, version, offset, note))

    def notes(self, table: TableName, version: int) -> dict[int, str]:
        """The repair notes of a version's blocks, by offset."""
        with self._lock:
            found = {offset: note for offset, note in self._db.execute(
                "SELECT offset, note FROM notes WHERE db=? AND tbl=? AND version=?",
                (table.database, table.table, version))}
            found.update({o: n for t, v, o, n in self._pending_notes
                          if t == table and v == version})
        return found

    def persist(self) -> None:
        """Write pending entries (called from the flush thread, before the checkpoint)."""
        with self._lock:
            blocks, self._pending_blocks = self._pending_blocks, []
            txns, self._pending_txns = self._pending_txns, []
            unordered, self._pending_unordered = self._pending_unordered, set()
            notes, self._pending_notes = self._pending_notes, []
            if not blocks and not txns and not unordered and not notes:
                return
            try:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?,?,?,?,?,?)",
                    [(b.table.database, b.table.table, b.version, b.offset, b.domain,
                      stored_sequence(b.seq)) for b in blocks])
                self._db.executemany(
                    f"INSERT OR REPLACE INTO transactions ({COLUMNS}) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [(t.ordinal, t.gtid.domain, t.gtid.source_uuid or "",
                      stored_sequence(t.gtid.sequence), t.gtid.server_id, t.timestamp, t.events,
                      tables_json(t), t.file, t.pos) for t in txns])
                self._db.executemany("INSERT OR IGNORE INTO touched VALUES (?,?,?)",
                                     [(n.database, n.table, t.ordinal)
                                      for t in txns for n in t.tables])
                self._db.executemany("INSERT OR IGNORE INTO unordered VALUES (?,?)",
                                     sorted(unordered))
                self._db.executemany("INSERT OR REPLACE INTO notes VALUES (?,?,?,?,?)",
                                     [(t.database, t.table, v, o, n) for t, v, o, n in notes])
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                self._pending_blocks[:0] = blocks
                self._pending_txns[:0] = txns
                self._pending_unordered |= unordered
                self._pending_notes[:0] = notes
                raise

    def truncate(self, table: TableName, version: int, size: int) -> None:
        """Forget entries at or past ``size`` of a version (recovery)."""
        with self._lock:
            for kind in ("blocks", "notes"):
                self._db.execute(f"DELETE FROM {kind} WHERE db=? AND tbl=? AND version=? AND "
                                 "offset>=?", (table.database, table.table, version, size))

    def drop_version(self, table: TableName, version: int) -> None:
        with self._lock:
            for kind in ("blocks", "notes"):
                self._db.execute(f"DELETE FROM {kind} WHERE db=? AND tbl=? AND version=?",
                                 (table.database, table.table, version))

    # -- reading -----------------------------------------------------------------------

    def seek_offset(self, table: TableName, version: int, domain: int, seq: int) -> int | None:
        """The offset to scan from for the first record of ``domain`` with sequence >= seq:
        no record of that domain with a sequence >= seq lies before it. None means from the
        start of the version (always, in a domain whose numbers did not grow)."""
        if not self.ordered(domain):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(offset) FROM blocks WHERE db=? AND tbl=? AND version=? AND domain=? "
                "AND seq<?", (table.database, table.table, version, domain,
                              stored_sequence(seq))).fetchone()
            pending = [b.offset for b in self._pending_blocks
                       if b.table == table and b.version == version and b.domain == domain
                       and b.seq < seq]
        candidates = [o for o in (row[0], *pending) if o is not None]
        return max(candidates) if candidates else None

    def block_before(self, table: TableName, version: int, offset: int) -> int | None:
        """The offset of the last indexed block (of any domain) before ``offset`` in the
        version: a place to scan forward from to find the block that ends there."""
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(offset) FROM blocks WHERE db=? AND tbl=? AND version=? AND "
                "offset<?", (table.database, table.table, version, offset)).fetchone()
            pending = [b.offset for b in self._pending_blocks
                       if b.table == table and b.version == version and b.offset < offset]
        candidates = [o for o in (row[0], *pending) if o is not None]
        return max(candidates) if candidates else None

    def domains(self, table: TableName, version: int) -> set[int]:
        """The replication domains with records in a version (each domain's first block is
        always indexed)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT domain FROM blocks WHERE db=? AND tbl=? AND version=?",
                (table.database, table.table, version)).fetchall()
            pending = {b.domain for b in self._pending_blocks
                       if b.table == table and b.version == version}
        return {r[0] for r in rows} | pending


@dataclass(frozen=True)
class Window:
    """The stored transactions that end between two binlog positions, in the order stored,
    and for each (domain, source) among them the last stored transaction before them."""

    transactions: list[TransactionInfo]
    before: dict[tuple[int, str], Gtid]


def window(path: str, after: tuple[str, int], upto: tuple[str, int], floor: GtidState
           ) -> Window:
    """The transactions of the index at ``path`` that end after binlog position ``after``
    and at or before ``upto``, on the server whose GTID state was ``floor`` before
    ``after``. The log is read back from its newest entry to the first that ``floor``
    covers or that ends at or before ``after``: the cost is the window's, not the
    history's (the store applies one server's transactions in binlog order; those it
    applied from a server read before, whose positions are not comparable, are covered by
    ``floor``)."""
    low, high = binlog_ordinal(*after), binlog_ordinal(*upto)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        found: list[TransactionInfo] = []
        first = None
        for row in db.execute(f"SELECT {COLUMNS} FROM transactions ORDER BY id DESC"):
            info = transaction_of(row)
            at = binlog_ordinal(info.file, info.pos)
            if at <= low or floor.covers(info.gtid):
                break
            first = info.ordinal
            if at <= high:
                found.append(info)
        found.reverse()
        before: dict[tuple[int, str], Gtid] = {}
        for key in dict.fromkeys((t.gtid.domain, t.gtid.source_uuid or "") for t in found):
            row = db.execute(
                f"SELECT {COLUMNS} FROM transactions WHERE domain=? AND source=? AND id<? "
                "ORDER BY id DESC LIMIT 1", (*key, first)).fetchone()
            if row is not None:
                before[key] = transaction_of(row).gtid
        return Window(found, before)
    finally:
        db.close()
