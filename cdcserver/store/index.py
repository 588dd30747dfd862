"""The GTID index and the transaction log, in ``state/index.sqlite``.

``blocks`` is sparse: for each table version and replication domain it records a block's offset
and the GTID sequence of its first transaction, at most once per ``spacing`` bytes of that
domain's data. Where a domain's sequence numbers grow with the file, a seek for ``D-S-N`` is
the largest indexed offset of domain D whose sequence is below N, plus a short scan of at most
``spacing`` bytes (``seek_offset``).

``notes`` marks the blocks that hold a repair's records (records the binlog did not carry, see
``cdcserver/reread``) with why they are there; the JSON stream shows it on each such record.

``transactions`` is every transaction the store applied, numbered in the order it applied them
(``id``, its *ordinal*): it answers ``QUERY-TRANSACTION`` and ``QUERY-RANGE``, and it is what
"before" and "after" mean in a domain whose sequence numbers did not grow. With
``gtid_strict_mode=OFF`` (MariaDB's default) a session may set a lower ``gtid_seq_no``, even one
already used, and servers sharing a domain count on their own; such a domain is recorded in
``unordered`` the first time its number does not grow, and from then on positions in it are
compared by ordinal, never by sequence number (``covers``).

New entries are kept in memory and written in one SQLite transaction by ``persist()``, which the
store calls from its flush, before the checkpoint. A crash can leave entries for data past the
checkpoint; ``truncate()`` drops them on start. Readers combine SQLite with the pending entries,
so a seek never misses recent data.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.gtid import Gtid, GtidState, binlog_ordinal
from cdcserver.core.names import TableName

log = logging.getLogger(__name__)

_SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS blocks (
    db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL, offset INTEGER NOT NULL,
    domain INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (db, tbl, version, domain, offset));
CREATE TABLE IF NOT EXISTS transactions (
    id INTEGER PRIMARY KEY,
    domain INTEGER NOT NULL, source TEXT NOT NULL, seq INTEGER NOT NULL, server_id INTEGER NOT NULL,
    timestamp INTEGER NOT NULL, events INTEGER NOT NULL, tables TEXT NOT NULL,
    file TEXT NOT NULL, pos INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS transactions_gtid ON transactions (domain, source, seq);
CREATE TABLE IF NOT EXISTS unordered (
    domain INTEGER NOT NULL, source TEXT NOT NULL, PRIMARY KEY (domain, source));
CREATE TABLE IF NOT EXISTS notes (
    db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL, offset INTEGER NOT NULL,
    note TEXT NOT NULL, PRIMARY KEY (db, tbl, version, offset));
CREATE TABLE IF NOT EXISTS touched (
    db TEXT NOT NULL, tbl TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (db, tbl, id));
"""
# PRAGMA user_version: 1 keyed transactions by (domain, source, seq); 2 stored sequence
# numbers as they are, which SQLite's signed 64-bit INTEGER cannot hold past 2^63-1; 3 named
# tables as "db.table" text, which two tables can share (`a.b`.c and a.`b.c`)
_VERSION = 4
# Sequence numbers are MariaDB's unsigned 64-bit ones (SET gtid_seq_no takes up to 2^64-1):
# they are stored shifted by -2^63 (stored_sequence), which keeps their order in SQLite's
# signed INTEGER, and shifted back when read (sequence_of). Every reader of the file, in any
# process, goes through these two.
_SHIFT = 1 << 63
_DB_MIN = -_SHIFT  # every sequence number is at or above it


def stored_sequence(sequence: int) -> int:
    return sequence - _SHIFT


def sequence_of(value: int) -> int:
    return value + _SHIFT
_COLUMNS = "id, domain, source, seq, server_id, timestamp, events, tables, file, pos"


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    gtid: Gtid
    timestamp: int
    events: int  # records over every table
    tables: tuple[TableName, ...]
    file: str
    pos: int
    ordinal: int = 0  # its place in the order the store applied transactions (from 1)
    # for each table (in order): its records, and the highest event number among them;
    # empty for a transaction logged before index version 4 (not known then)
    counts: tuple[tuple[int, int], ...] = ()

    def records_of(self, table: TableName) -> int | None:
        """The table's records in the transaction (None: not known)."""
        if not self.counts or table not in self.tables:
            return None
        return self.counts[self.tables.index(table)][0]

    def last_event_of(self, tables: set[TableName]) -> int | None:
        """The highest event number among the records of ``tables`` (None: not known)."""
        if not self.counts:
            return None
        return max((c[1] for t, c in zip(self.tables, self.counts, strict=True)
                    if t in tables), default=0)


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
        # An index of version 3 names tables as text until name_tables() converts it
        self._named = _migrate(self._db)
        self._db.executescript(_SCHEMA)
        if self._named:
            self._db.execute(f"PRAGMA user_version={_VERSION}")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # Guards the pending lists and the connection; reentrant, as ``covers`` is used
        # while transactions are walked.
        self._lock = threading.RLock()
        self._pending_blocks: list[_BlockEntry] = []
        self._pending_txns: list[TransactionInfo] = []
        self._pending_unordered: set[tuple[int, str]] = set()
        self._pending_notes: list[tuple[TableName, int, int, str]] = []
        self._last_indexed: dict[tuple[TableName, int, int], int] = {}
        self._load_transaction_state()

    def _load_transaction_state(self) -> None:
        self.last_transaction: TransactionInfo | None = self._newest_transaction()
        self.last_id = self.last_transaction.ordinal if self.last_transaction else 0
        self._sources: set[tuple[int, str]] = {
            (d, s) for d, s in self._db.execute("SELECT DISTINCT domain, source FROM transactions")}
        self._unordered: set[tuple[int, str]] = {
            (d, s) for d, s in self._db.execute("SELECT domain, source FROM unordered")}
        self._last_seq: dict[tuple[int, str], int] = {
            (d, s): sequence_of(q) for d, s, q in self._db.execute(
                "SELECT t.domain, t.source, t.seq FROM transactions t JOIN (SELECT MAX(id) AS id "
                "FROM transactions GROUP BY domain, source) m ON t.id = m.id")}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def name_tables(self, split: Callable[[str], TableName]) -> None:
        """Convert an older index's "db.table" texts (``split`` tells the table: the store
        splits at the dot that names a table it holds); nothing if it is converted."""
        with self._lock:
            if not self._named:
                _name_tables(self._db, split)
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

    def note_transaction(self, info: TransactionInfo) -> TransactionInfo:
        """Log a transaction the store applied; returns it with its ordinal."""
        with self._lock:
            self.last_id += 1
            info = replace(info, ordinal=self.last_id)
            self.last_transaction = info
            key = (info.gtid.domain, info.gtid.source_uuid or "")
            last = self._last_seq.get(key)
            if last is not None and info.gtid.sequence <= last and key not in self._unordered:
                log.info("GTID domain %s: %s follows sequence number %d; from now on its "
                         "transactions are ordered by the order they were stored in",
                         key[1] or key[0], info.gtid, last)
                self._unordered.add(key)
                self._pending_unordered.add(key)
            self._last_seq[key] = info.gtid.sequence
            self._pending_txns.append(info)
            self._sources.add(key)
            return info

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
                    f"INSERT OR REPLACE INTO transactions ({_COLUMNS}) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [(t.ordinal, t.gtid.domain, t.gtid.source_uuid or "",
                      stored_sequence(t.gtid.sequence), t.gtid.server_id, t.timestamp, t.events,
                      _tables_json(t), t.file, t.pos) for t in txns])
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

    def drop_transactions_after(self, covered: GtidState, last_id: int | None) -> None:
        """Forget transactions the checkpoint does not cover (they will be replayed):
        those logged after ``last_id``, the checkpoint's last ordinal. (A checkpoint written
        before ordinals were kept has none: then by sequence number.)"""
        with self._lock:
            if last_id is not None:
                self._db.execute("DELETE FROM transactions WHERE id>?", (last_id,))
                self._db.execute("DELETE FROM touched WHERE id>?", (last_id,))
            else:
                for domain, source in sorted(self._sources):
                    last = covered.get(source or domain)
                    self._db.execute(
                        "DELETE FROM transactions WHERE domain=? AND source=? AND seq>=?",
                        (domain, source, stored_sequence(last.sequence + 1) if last else _DB_MIN))
                self._db.execute("DELETE FROM touched WHERE id NOT IN (SELECT id FROM "
                                 "transactions)")
            self._load_transaction_state()

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

    # -- order -------------------------------------------------------------------------

    def ordered(self, domain: int, source: str = "") -> bool:
        """Whether the domain's sequence numbers have grown with every transaction stored."""
        return (domain, source) not in self._unordered

    def ordinal(self, gtid: Gtid, at_least: int | None = None) -> int | None:
        """The ordinal of the newest stored transaction with this GTID, or with
        ``at_least``, of the first one from that ordinal on (a GTID used twice, which MariaDB
        allows without strict mode, names two transactions). None: not stored."""
        source = gtid.source_uuid or ""
        with self._lock:
            pending = [i.ordinal for i in self._pending_txns if _same(i.gtid, gtid) and
                       (at_least is None or i.ordinal >= at_least)]
            if pending and at_least is None:
                return pending[-1]
            where = "domain=? AND source=? AND seq=?"
            args: tuple[object, ...] = (gtid.domain, source, stored_sequence(gtid.sequence))
            if gtid.source_uuid is None:
                where, args = where + " AND server_id=?", (*args, gtid.server_id)
            if at_least is not None:
                where, args = where + " AND id>=?", (*args, at_least)
            row = self._db.execute(
                f"SELECT {'MIN' if at_least is not None else 'MAX'}(id) FROM transactions "
                f"WHERE {where}", args).fetchone()
        stored = row[0] if row and row[0] is not None else None
        if stored is None and pending:
            return pending[0]
        return stored

    def covers(self, state: GtidState, gtid: Gtid) -> bool:
        """Whether the transaction ``gtid`` is at or before ``state`` in its domain: by
        sequence number where the domain's numbers grew, else by the order the store applied
        them (by number if either transaction is not in the log)."""
        last = state.get(gtid.key)
        if last is None:
            return False
        if self.ordered(gtid.domain, gtid.source_uuid or ""):
            return last.sequence >= gtid.sequence
        mine, theirs = self.ordinal(gtid), self.ordinal(last)
        if mine is None or theirs is None:
            return last.sequence >= gtid.sequence
        return mine <= theirs

    def earliest(self, a: GtidState, b: GtidState) -> GtidState:
        """Per domain named by both, the earlier of the two (a domain missing on either side
        is dropped, as in :meth:`GtidState.minimum`)."""
        keys = {g.key for g in a} & {g.key for g in b}
        chosen = []
        for key in keys:
            x, y = a.get(key), b.get(key)
            assert x is not None and y is not None
            chosen.append(x if self.covers(b, x) else y)
        return GtidState(chosen)

    def reached(self, state: GtidState, gtid: Gtid) -> bool:
        """Like :meth:`covers`, for waiting: in a domain whose numbers did not grow, a
        transaction not stored yet is not reached, whatever its number."""
        if not self.ordered(gtid.domain, gtid.source_uuid or "") and \
                self.ordinal(gtid) is None:
            return False
        return self.covers(state, gtid)

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
            f"SELECT {_COLUMNS} FROM transactions ORDER BY id DESC LIMIT 1").fetchone()
        return _transaction(row) if row else None

    def transaction(self, gtid: Gtid) -> TransactionInfo | None:
        """The newest stored transaction with this GTID (with this domain and sequence
        number, if none has its server_id)."""
        ordinal = self.ordinal(gtid)
        with self._lock:
            for info in reversed(self._pending_txns):
                if info.ordinal == ordinal if ordinal is not None else (
                        info.gtid.key == gtid.key and info.gtid.sequence == gtid.sequence):
                    return info
            if ordinal is not None:
                row = self._db.execute(f"SELECT {_COLUMNS} FROM transactions WHERE id=?",
                                       (ordinal,)).fetchone()
            else:
                row = self._db.execute(
                    f"SELECT {_COLUMNS} FROM transactions WHERE domain=? AND source=? AND "
                    "seq=? ORDER BY id DESC LIMIT 1",
                    (gtid.domain, gtid.source_uuid or "", stored_sequence(gtid.sequence))
                ).fetchone()
        return _transaction(row) if row else None

    def last_transaction_of(self, tables: set[TableName]) -> TransactionInfo | None:
        """The newest stored transaction that changed one of ``tables``."""
        with self._lock:
            for info in reversed(self._pending_txns):
                if not tables.isdisjoint(info.tables):
                    return info
            row = self._db.execute(
                f"SELECT MAX(id) FROM touched WHERE (db, tbl) IN ({_EACH})",
                (_names_json(tables),)).fetchone()
            if row is None or row[0] is None:
                return None
            found = self._db.execute(f"SELECT {_COLUMNS} FROM transactions WHERE id=?",
                                     (row[0],)).fetchone()
        return _transaction(found) if found else None

    def state_of(self, tables: set[TableName], stored: GtidState) -> GtidState:
        """The GTID state of the newest transactions, within ``stored``, that changed one of
        ``tables``: in each domain (and MySQL source), the last of them. A read of those
        tables up to it holds everything stored of them up to ``stored``."""
        found: list[Gtid] = []
        names = _names_json(tables)
        with self._lock:
            for domain, source in sorted(self._sources):
                pending = (i for i in reversed(self._pending_txns)
                           if (i.gtid.domain, i.gtid.source_uuid or "") == (domain, source)
                           and not tables.isdisjoint(i.tables))
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM transactions WHERE domain=? AND source=? AND id "
                    f"IN (SELECT id FROM touched WHERE (db, tbl) IN ({_EACH})) "
                    "ORDER BY id DESC", (domain, source, names))
                for info in itertools.chain(pending, map(_transaction, rows)):
                    if self.covers(stored, info.gtid):
                        found.append(info.gtid)
                        break
        return GtidState(found)

    def plan_range(self, table: TableName, after: GtidState, stored: GtidState, limit: int
                   ) -> RangePlan:
        """The furthest end state, within ``stored``, such that the transactions after
        ``after`` up to it that touch ``table`` hold at most ``limit`` of its records (a
        transaction logged before they were counted per table counts all its events)."""
        events, end = 0, after
        with self._lock:
            for info in self._transactions_after(after):
                if not self.covers(stored, info.gtid):
                    continue  # not applied by every sink yet, nor is the rest of its domain
                if table in info.tables:
                    records = info.records_of(table)
                    size = info.events if records is None else records
                    if events + size > limit:
                        return RangePlan(end, events, info)
                    events += size
                end = end.advanced(info.gtid)
            for gtid in stored:  # up to everything stored, however it was recorded
                if not self.covers(end, gtid):
                    end = end.advanced(gtid)
        return RangePlan(end, events, None)

    def _transactions_after(self, after: GtidState) -> Iterator[TransactionInfo]:
        """The transactions ``after`` does not cover, in the order they were stored; the
        caller holds the lock."""
        cursors = []
        for domain, source in sorted(self._sources):
            last = after.get(source or domain)
            start = self.ordinal(last) if last is not None and \
                not self.ordered(domain, source) else None
            if start is not None:
                where, value = "id>?", start
            elif last is not None:
                where, value = "seq>?", stored_sequence(last.sequence)
            else:
                where, value = "seq>=?", _DB_MIN
            cursors.append(self._db.execute(
                f"SELECT {_COLUMNS} FROM transactions WHERE domain=? AND source=? AND {where} "
                "ORDER BY id", (domain, source, value)))
        for row in heapq.merge(*cursors, key=lambda r: r[0]):
            yield _transaction(row)
        for info in list(self._pending_txns):
            if not self.covers(after, info.gtid):
                yield info


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
        for row in db.execute(f"SELECT {_COLUMNS} FROM transactions ORDER BY id DESC"):
            info = _transaction(row)
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
                f"SELECT {_COLUMNS} FROM transactions WHERE domain=? AND source=? AND id<? "
                "ORDER BY id DESC LIMIT 1", (*key, first)).fetchone()
            if row is not None:
                before[key] = _transaction(row).gtid
        return Window(found, before)
    finally:
        db.close()


def _same(a: Gtid, b: Gtid) -> bool:
    """One transaction's GTID (a MySQL one is its source UUID and number)."""
    if a.source_uuid is not None or b.source_uuid is not None:
        return a.key == b.key and a.sequence == b.sequence
    return a == b


# The (database, table) pairs of a JSON array of [database, table], for ``(db, tbl) IN``
_EACH = "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?)"


def _names_json(tables: set[TableName]) -> str:
    return json.dumps([[t.database, t.table] for t in tables])


def _tables_json(info: TransactionInfo) -> str:
    """``[[database, table, records, last event number], ...]``; the counts are null where
    they are not known."""
    counts = info.counts or ((None, None),) * len(info.tables)
    return json.dumps([[t.database, t.table, *c] for t, c in zip(info.tables, counts,
                                                                  strict=True)])


def _transaction(row: Any) -> TransactionInfo:
    ordinal, domain, source, seq, server_id, timestamp, events, tables, file, pos = row
    items = [i if isinstance(i, list) else _text_item(i) for i in json.loads(tables)]
    counts = tuple((int(i[2]), int(i[3])) for i in items) \
        if items and all(i[2] is not None for i in items) else ()
    return TransactionInfo(Gtid(domain, server_id, sequence_of(seq), source or None), timestamp,
                           events, tuple(TableName(i[0], i[1]) for i in items), file, pos,
                           ordinal, counts)


def _text_item(text: str) -> list[Any]:
    """A table as an index of version 3 named it, until converted (``name_tables``)."""
    name = TableName.parse(text)
    return [name.database, name.table, None, None]


def _migrate(db: sqlite3.Connection) -> bool:
    """Bring an index written by an older version to this layout: the transaction log of
    version 1 had no ordinals (its insertion order is kept as theirs); versions 1 and 2
    stored sequence numbers unshifted (all below 2^63, so the shift cannot overflow). False
    while tables are named as "db.table" text (versions 1 to 3: see ``name_tables``)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    columns = [r[1] for r in db.execute("PRAGMA table_info(transactions)")]
    if version >= _VERSION or not columns:
        return True
    if "id" not in columns:
        _add_ordinals(db)
    if version < 3:
        db.executescript("""
            BEGIN;
            UPDATE blocks SET seq = seq + (-9223372036854775807 - 1);
            UPDATE transactions SET seq = seq + (-9223372036854775807 - 1);
            PRAGMA user_version = 3;
            COMMIT;
        """)
    return False


def _name_tables(db: sqlite3.Connection, split: Callable[[str], TableName]) -> None:
    """Version 3 to 4: each transaction's tables as [database, table, null, null], and the
    ``touched`` table that finds a table's transactions."""
    log.info("the store's index names tables by (database, table) from now on: converting "
             "its transaction log (once)")
    db.executescript(_SCHEMA.replace("PRAGMA journal_mode=WAL;", ""))
    db.execute("BEGIN")
    try:
        rows = db.execute("SELECT id, tables FROM transactions").fetchall()
        for ordinal, text in rows:
            names = [split(t) for t in json.loads(text)]
            db.execute("UPDATE transactions SET tables=? WHERE id=?",
                       (json.dumps([[n.database, n.table, None, None] for n in names]),
                        ordinal))
            db.executemany("INSERT OR IGNORE INTO touched VALUES (?,?,?)",
                           [(n.database, n.table, ordinal) for n in names])
        db.execute("PRAGMA user_version = 4")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _add_ordinals(db: sqlite3.Connection) -> None:
    db.executescript(f"""
        BEGIN;
        ALTER TABLE transactions RENAME TO transactions_v1;
        {_SCHEMA.replace("PRAGMA journal_mode=WAL;", "")}
        INSERT INTO transactions (domain, source, seq, server_id, timestamp, events, tables,
                                  file, pos)
            SELECT domain, source, seq, server_id, timestamp, events, tables, file, pos
            FROM transactions_v1 ORDER BY rowid;
        DROP TABLE transactions_v1;
        INSERT OR IGNORE INTO unordered
            SELECT DISTINCT domain, source FROM (
                SELECT domain, source, seq, LAG(seq) OVER (PARTITION BY domain, source
                                                           ORDER BY id) AS previous
                FROM transactions) WHERE previous >= seq;
        COMMIT;
    """)
