"""The GTID index and the transaction log, in ``state/index.sqlite``.

``blocks`` is sparse: for each table version and replication domain it records a block's offset
and the GTID sequence of its first transaction, at most once per ``spacing`` bytes of that
domain's data. Within a domain sequence numbers grow with the file, so a seek for ``D-S-N`` is
the largest indexed offset of domain D whose sequence is below N, plus a short scan of at most
``spacing`` bytes (``seek_offset``). ``transactions`` answers ``QUERY-TRANSACTION``.

New entries are kept in memory and written in one SQLite transaction by ``persist()``, which the
store calls from its flush, before the checkpoint. A crash can leave entries for data past the
checkpoint; ``truncate()`` drops them on start. Readers combine SQLite with the pending entries,
so a seek never misses recent data.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cdcserver.gtid import Gtid, GtidState
from cdcserver.store.naming import TableName

_SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS blocks (
    db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL, offset INTEGER NOT NULL,
    domain INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (db, tbl, version, domain, offset));
CREATE TABLE IF NOT EXISTS transactions (
    domain INTEGER NOT NULL, source TEXT NOT NULL, seq INTEGER NOT NULL, server_id INTEGER NOT NULL,
    timestamp INTEGER NOT NULL, events INTEGER NOT NULL, tables TEXT NOT NULL,
    file TEXT NOT NULL, pos INTEGER NOT NULL,
    PRIMARY KEY (domain, source, seq));
"""


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    gtid: Gtid
    timestamp: int
    events: int
    tables: tuple[str, ...]
    file: str
    pos: int


@dataclass(frozen=True, slots=True)
class RangePlan:
    """Where a bounded read of one table can end: the transactions after the start and up to
    ``end`` that touch the table have ``events`` events in all; ``next`` is the first one
    past ``end`` that does, when the limit stopped the plan before it."""

    end: GtidState
    events: int
    next: TransactionInfo | None


@dataclass(frozen=True, slots=True)
class _BlockEntry:
    table: TableName
    version: int
    offset: int
    domain: int
    seq: int


class StoreIndex:
    def __init__(self, path: str, spacing: int = 64 * 1024) -> None:
        self.path = path
        self.spacing = spacing
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()  # guards the pending lists and the connection
        self._pending_blocks: list[_BlockEntry] = []
        self._pending_txns: list[TransactionInfo] = []
        self._last_indexed: dict[tuple[TableName, int, int], int] = {}
        self.last_transaction: TransactionInfo | None = self._newest_transaction()
        self._sources: set[tuple[int, str]] = {
            (d, s) for d, s in self._db.execute("SELECT DISTINCT domain, source FROM transactions")}

    def close(self) -> None:
        with self._lock:
            self._db.close()

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

    def note_transaction(self, info: TransactionInfo) -> None:
        self.last_transaction = info
        with self._lock:
            self._pending_txns.append(info)
            self._sources.add((info.gtid.domain, info.gtid.source_uuid or ""))

    def persist(self) -> None:
        """Write pending entries (called from the flush thread, before the checkpoint)."""
        with self._lock:
            blocks, self._pending_blocks = self._pending_blocks, []
            txns, self._pending_txns = self._pending_txns, []
            if not blocks and not txns:
                return
            try:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?,?,?,?,?,?)",
                    [(b.table.database, b.table.table, b.version, b.offset, b.domain, b.seq)
                     for b in blocks])
                self._db.executemany(
                    "INSERT OR REPLACE INTO transactions VALUES (?,?,?,?,?,?,?,?,?)",
                    [(t.gtid.domain, t.gtid.source_uuid or "", t.gtid.sequence, t.gtid.server_id,
                      t.timestamp, t.events, json.dumps(t.tables), t.file, t.pos) for t in txns])
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                self._pending_blocks[:0] = blocks
                self._pending_txns[:0] = txns
                raise

    def truncate(self, table: TableName, version: int, size: int) -> None:
        """Forget entries at or past ``size`` of a version (recovery)."""
        with self._lock:
            self._db.execute("DELETE FROM blocks WHERE db=? AND tbl=? AND version=? AND offset>=?",
                             (table.database, table.table, version, size))

    def drop_version(self, table: TableName, version: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM blocks WHERE db=? AND tbl=? AND version=?",
                             (table.database, table.table, version))

    def drop_transactions_after(self, covered: GtidState) -> None:
        """Forget transactions the checkpoint does not cover (they will be replayed)."""
        with self._lock:
            for domain, source in sorted(self._sources):
                last = covered.get(source or domain)
                self._db.execute("DELETE FROM transactions WHERE domain=? AND source=? AND seq>?",
                                 (domain, source, last.sequence if last else -1))
            self.last_transaction = self._newest_transaction()

    # -- reading -----------------------------------------------------------------------

    def seek_offset(self, table: TableName, version: int, domain: int, seq: int) -> int | None:
        """The offset to scan from for the first record of ``domain`` with sequence >= seq:
        no record of that domain with a sequence >= seq lies before it. None means from the
        start of the version."""
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(offset) FROM blocks WHERE db=? AND tbl=? AND version=? AND domain=? "
                "AND seq<?", (table.database, table.table, version, domain, seq)).fetchone()
            pending = [b.offset for b in self._pending_blocks
                       if b.table == table and b.version == version and b.domain == domain
                       and b.seq < seq]
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

    def _newest_transaction(self) -> TransactionInfo | None:
        row = self._db.execute(
            "SELECT domain, source, seq, server_id, timestamp, events, tables, file, pos "
            "FROM transactions ORDER BY rowid DESC LIMIT 1").fetchone()
        return _transaction(row) if row else None

    def transaction(self, gtid: Gtid) -> TransactionInfo | None:
        with self._lock:
            for info in reversed(self._pending_txns):
                if info.gtid.key == gtid.key and info.gtid.sequence == gtid.sequence:
                    return info
            row = self._db.execute(
                "SELECT domain, source, seq, server_id, timestamp, events, tables, file, pos "
                "FROM transactions WHERE domain=? AND source=? AND seq=?",
                (gtid.domain, gtid.source_uuid or "", gtid.sequence)).fetchone()
        return _transaction(row) if row else None

    def plan_range(self, table: str, after: GtidState, stored: GtidState, limit: int
                   ) -> RangePlan:
        """The furthest end state, within ``stored``, such that the transactions after
        ``after`` up to it that touch ``table`` ("db.table") hold at most ``limit`` events
        (a transaction's events over all its tables: never fewer than its records of one)."""
        events, end = 0, after
        with self._lock:
            for info in self._transactions_after(after):
                if not stored.covers(info.gtid):
                    continue  # not applied by every sink yet, nor is the rest of its domain
                if table in info.tables:
                    if events + info.events > limit:
                        return RangePlan(end, events, info)
                    events += info.events
                end = end.advanced(info.gtid)
        for gtid in stored:  # up to everything stored, however it was recorded
            if not end.covers(gtid):
                end = end.advanced(gtid)
        return RangePlan(end, events, None)

    def _transactions_after(self, after: GtidState) -> Iterator[TransactionInfo]:
        """The transactions ``after`` does not cover, in the order they were stored (each
        domain's by sequence, merged by insertion order); the caller holds the lock."""
        cursors = []
        for domain, source in sorted(self._sources):
            last = after.get(source or domain)
            cursors.append(self._db.execute(
                "SELECT rowid, domain, source, seq, server_id, timestamp, events, tables, file, "
                "pos FROM transactions WHERE domain=? AND source=? AND seq>? ORDER BY seq",
                (domain, source, last.sequence if last else -1)))
        for row in heapq.merge(*cursors, key=lambda r: r[0]):
            yield _transaction(row[1:])
        for info in list(self._pending_txns):
            if not after.covers(info.gtid):
                yield info


def _transaction(row: Any) -> TransactionInfo:
    domain, source, seq, server_id, timestamp, events, tables, file, pos = row
    return TransactionInfo(Gtid(domain, server_id, seq, source or None), timestamp, events,
                           tuple(json.loads(tables)), file, pos)
