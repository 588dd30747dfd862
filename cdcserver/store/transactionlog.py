"""The transaction log of the store's index: every transaction the store applied, in the order
it applied them, and what "before" and "after" mean among them.

Each transaction is numbered in the order the store applied it (``id``, its *ordinal*): the log
answers ``QUERY-TRANSACTION`` and ``QUERY-RANGE``, and it is what "before" and "after" mean in
a domain whose sequence numbers did not grow. With ``gtid_strict_mode=OFF`` (MariaDB's default)
a session may set a lower ``gtid_seq_no``, even one already used, and servers sharing a domain
count on their own; such a domain is recorded in ``unordered`` the first time its number does
not grow, and from then on positions in it are compared by ordinal, never by sequence number
(:meth:`TransactionLog.covers`). ``touched`` finds the transactions that changed a table.

:class:`TransactionLog` is the part of :class:`~cdcserver.store.index.StoreIndex` that keeps
and reads it; new entries wait in memory until the index persists them.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.store.indexschema import DB_MIN, sequence_of, stored_sequence

log = logging.getLogger("cdcserver.store.index")  # as before: operators grep for it

COLUMNS = "id, domain, source, seq, server_id, timestamp, events, tables, file, pos"


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


class TransactionLog:
    """The transaction log of an index open on ``db``, with its entries not persisted yet."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        # Guards the pending lists and the connection; reentrant, as ``covers`` is used
        # while transactions are walked.
        self._lock = threading.RLock()
        self._pending_txns: list[TransactionInfo] = []
        self._pending_unordered: set[tuple[int, str]] = set()
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
                        (domain, source, stored_sequence(last.sequence + 1) if last else DB_MIN))
                self._db.execute("DELETE FROM touched WHERE id NOT IN (SELECT id FROM "
                                 "transactions)")
            self._load_transaction_state()

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

    # -- queries -----------------------------------------------------------------------

    def _newest_transaction(self) -> TransactionInfo | None:
        row = self._db.execute(
            f"SELECT {COLUMNS} FROM transactions ORDER BY id DESC LIMIT 1").fetchone()
        return transaction_of(row) if row else None

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
                row = self._db.execute(f"SELECT {COLUMNS} FROM transactions WHERE id=?",
                                       (ordinal,)).fetchone()
            else:
                row = self._db.execute(
                    f"SELECT {COLUMNS} FROM transactions WHERE domain=? AND source=? AND "
                    "seq=? ORDER BY id DESC LIMIT 1",
                    (gtid.domain, gtid.source_uuid or "", stored_sequence(gtid.sequence))
                ).fetchone()
        return transaction_of(row) if row else None

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
            found = self._db.execute(f"SELECT {COLUMNS} FROM transactions WHERE id=?",
                                     (row[0],)).fetchone()
        return transaction_of(found) if found else None

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
                    f"SELECT {COLUMNS} FROM transactions WHERE domain=? AND source=? AND id "
                    f"IN (SELECT id FROM touched WHERE (db, tbl) IN ({_EACH})) "
                    "ORDER BY id DESC", (domain, source, names))
                for info in itertools.chain(pending, map(transaction_of, rows)):
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
                where, value = "seq>=?", DB_MIN
            cursors.append(self._db.execute(
                f"SELECT {COLUMNS} FROM transactions WHERE domain=? AND source=? AND {where} "
                "ORDER BY id", (domain, source, value)))
        for row in heapq.merge(*cursors, key=lambda r: r[0]):
            yield transaction_of(row)
        for info in list(self._pending_txns):
            if not self.covers(after, info.gtid):
                yield info


def _same(a: Gtid, b: Gtid) -> bool:
    """One transaction's GTID (a MySQL one is its source UUID and number)."""
    if a.source_uuid is not None or b.source_uuid is not None:
        return a.key == b.key and a.sequence == b.sequence
    return a == b


# The (database, table) pairs of a JSON array of [database, table], for ``(db, tbl) IN``
_EACH = "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?)"


def _names_json(tables: set[TableName]) -> str:
    return json.dumps([[t.database, t.table] for t in tables])


def tables_json(info: TransactionInfo) -> str:
    """``[[database, table, records, last event number], ...]``; the counts are null where
    they are not known."""
    counts = info.counts or ((None, None),) * len(info.tables)
    return json.dumps([[t.database, t.table, *c] for t, c in zip(info.tables, counts,
                                                                  strict=True)])


def transaction_of(row: Any) -> TransactionInfo:
    """A transaction as its row of ``transactions`` (the columns :data:`COLUMNS`) holds it."""
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
