"""The open transaction of a replication stream: where it starts and ends, and what the binlog
cannot tell about its rows.

Transaction framing, MariaDB: a GTID event opens every transaction (it replaces BEGIN); XID or a
``COMMIT`` query closes it, and a GTID with ``FL_STANDALONE`` wraps one statement (DDL) with no
closing event. MySQL: GTID or ANONYMOUS_GTID, then ``BEGIN``, then XID or ``COMMIT``; DDL comes as
GTID + query. (``../shared/seeds`` 004; https://mariadb.com/kb/en/gtid_event/)

A rollback, a ``ROLLBACK TO SAVEPOINT`` and a data change logged as a statement leave tables
whose rows the binlog cannot tell: each becomes a
:class:`~cdcserver.core.changes.Rowless` marker, and the table is read again. XA prepare groups
are recorded (:mod:`cdcserver.replication.xa`) and decoded at their completion.

:class:`TransactionFraming` holds this state for
:class:`~cdcserver.replication.decoder.EventDecoder`, which reads the events.
"""

from __future__ import annotations

import logging

from cdcserver.core.capture import CaptureFilter
from cdcserver.core.changes import Abort, Begin, Change, Commit, Rowless, TableLayout
from cdcserver.core.errors import UndecodableEvent
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import CollationTable
from cdcserver.mariadb.constants import FL_GROUP_COMMIT_ID, FL_PREPARED_XA, FL_STANDALONE, EventKind
from cdcserver.replication.cursor import Cursor
from cdcserver.replication.eventkinds import HEADER_SIZE, PASSIVE, portable
from cdcserver.replication.mappedtable import MappedTable
from cdcserver.replication.queryevent import query_statement
from cdcserver.replication.rowless import (
    SAVEPOINT_ROLLBACK,
    STATEMENT_LOGGED,
    UNSURE_ROLLBACK,
    statement_dml_markers,
    statement_tables,
)
from cdcserver.replication.xa import PreparedXa, Recording, Xid
from cdcserver.schema.history import SchemaHistory

log = logging.getLogger("cdcserver.replication.decoder")  # as before: operators grep for it


class TransactionFraming:
    """The stream's position and its open transaction, and the changes that open, close,
    roll back or complete it."""

    def __init__(self, collations: CollationTable, start: GtidState, *,
                 history: SchemaHistory | None, capture: CaptureFilter,
                 xa: PreparedXa | None) -> None:
        self.collations = collations
        self.xa = xa if xa is not None else PreparedXa()  # prepared XA transactions' events
        self._recording: Recording | None = None  # of the open XA prepare group
        self.capture = capture  # the tables whose changes are captured (the others are not
        # decoded: their table maps are read, their rows skipped)
        self.history = history
        self.gtid_state = start
        self.file = ""
        self.pos = 4
        self._tables: dict[int, MappedTable] = {}
        self._gtid: Gtid | None = None  # the open transaction
        self._pending_mysql_gtid: Gtid | None = None
        self._standalone = False
        self._event_end = 0
        self._event_start = 0  # where the current event starts in its binlog file
        self._transaction_start = 0  # where the open (or pending MySQL) transaction's GTID is
        self._written: set[TableName] = set()  # tables with rows in the open transaction
        # After a ROLLBACK TO SAVEPOINT over non-transactional tables: the tables whose rows
        # the binlog cannot tell, read again at the commit (None: the transaction is sure).
        self._unsure: set[TableName] | None = None
        self.in_transaction = False

    def abort_open_transaction(self, out: list[Change], reason: str) -> None:
        if self._recording is not None:  # its group is read again whole
            self._recording.discard()
            self._recording = None
        if self.in_transaction:
            out.append(Abort(reason))
        self._reset_transaction()

    def position(self) -> BinlogPosition:
        return BinlogPosition(self.gtid_state, self.file, self.pos)

    def _event(self, buf: bytes, start: int, out: list[Change], *, checksummed: bool,
               enclosing_end: int = 0) -> None:
        """Decode one event and append its changes (the decoder's own)."""
        raise NotImplementedError

    # -- opening and closing -----------------------------------------------------------

    def _mariadb_gtid(self, body: Cursor, timestamp: int, server_id: int,
                      out: list[Change]) -> None:
        sequence, domain, flags = body.u64(), body.u32(), body.u8()
        commit_id = body.u64() if flags & FL_GROUP_COMMIT_ID else None
        gtid = Gtid(domain, server_id, sequence)
        self._open(gtid, timestamp, out, standalone=bool(flags & FL_STANDALONE),
                   commit_id=commit_id)
        if flags & FL_PREPARED_XA:  # its rows wait for XA COMMIT, in another group
            self._recording = self.xa.record(gtid)

    def _mysql_gtid(self, kind: EventKind, body: Cursor, server_id: int) -> None:
        body.u8()  # commit flag
        sid, gno = body.take(16), body.u64()
        if kind == EventKind.ANONYMOUS_GTID:
            # No GTID: number the transaction by its binlog position, which is monotonic
            # within the primary's binlog sequence (documented in protocol.md).
            self._pending_mysql_gtid = Gtid(0, server_id, self._anonymous_sequence())
            self._transaction_start = self._event_start
            return
        uuid = sid.hex()
        uuid = f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}"
        self._pending_mysql_gtid = Gtid(0, server_id, gno, uuid)
        self._transaction_start = self._event_start

    def _anonymous_sequence(self) -> int:
        number = int(self.file.rsplit(".", 1)[-1]) if "." in self.file else 0
        return (number << 32) | self.pos

    def _open(self, gtid: Gtid, timestamp: int, out: list[Change], *, standalone: bool,
              commit_id: int | None = None, again: bool = False) -> None:
        if self.in_transaction:
            raise UndecodableEvent(f"transaction {gtid} starts inside open transaction "
                                   f"{self._gtid}")
        self._gtid = gtid
        self._standalone = standalone
        self.in_transaction = True
        if self._pending_mysql_gtid is None and not again:  # MariaDB: this GTID event
            self._transaction_start = self._event_start
        out.append(Begin(gtid, timestamp, standalone, commit_id, self.file,
                         self._transaction_start))

    def _commit(self, timestamp: int, out: list[Change]) -> None:
        if not self.in_transaction or self._gtid is None:
            raise UndecodableEvent("commit outside a transaction")
        if self._unsure:
            out += self._read_again(self._unsure, SAVEPOINT_ROLLBACK)
        self.gtid_state = self.gtid_state.advanced(self._gtid)
        if self._event_end:
            self.pos = self._event_end
        out.append(Commit(self.position(), timestamp))
        self._reset_transaction()

    def _rollback(self, timestamp: int, out: list[Change]) -> None:
        """A logged group that ends in ROLLBACK: its rows of transactional tables were
        undone on the primary. Discard them and still advance the GTID state; rows of
        any other table may have survived, which the binlog cannot tell: those tables are
        read again (repaired, as a change without binlog rows is)."""
        unsure = {t for t in self._written if self.history is None or
                  not self.history.transactional(t)} | (self._unsure or set())
        if unsure and self.history is None:
            raise UndecodableEvent(
                f"transaction {self._gtid} was rolled back after writing rows of "
                f"{', '.join(map(str, sorted(unsure)))}, which are not known to be "
                "transactional; the binlog cannot tell which of its rows survived")
        if self._written or self._unsure is not None:
            self._start_again("rolled back on the primary", timestamp, out)
        out += self._read_again(unsure, UNSURE_ROLLBACK)
        self._unsure = None
        self._commit(timestamp, out)

    def _start_again(self, reason: str, timestamp: int, out: list[Change]) -> None:
        """Drop what the open transaction handed on so far (``Abort``) and open it again."""
        gtid, standalone, unsure = self._gtid, self._standalone, self._unsure
        out.append(Abort(reason, again=True))
        self._reset_transaction()
        assert gtid is not None
        self._open(gtid, timestamp, out, standalone=standalone, again=True)
        self._unsure = unsure

    def _rolled_back_to_savepoint(self, timestamp: int, out: list[Change]) -> None:
        """MariaDB logs ``ROLLBACK TO SAVEPOINT`` only when non-transactional tables changed
        after the savepoint, and then keeps every row in the group, the undone ones too:
        which rows stand cannot be told. The transaction's rows so far are dropped, its later
        ones are not handed on, and every table it writes is read again at its commit."""
        if self.history is None:
            raise UndecodableEvent(
                "a transaction rolled back to a savepoint after changing non-transactional "
                "tables; which of its logged rows survived cannot be told from the binlog")
        unsure = (self._unsure or set()) | self._written
        self._start_again("rolled back to a savepoint: its tables are read again", timestamp,
                          out)
        self._unsure = unsure

    def _read_again(self, tables: set[TableName], reason: str) -> list[Change]:
        """A marker per captured table: any of its rows may have changed without a row
        event the stream can trust; the repair stage reads it again at a later watermark."""
        layouts = self._mapped_layouts()
        return [Rowless(t.database, t.table, reason, layout=layouts.get(t))
                for t in sorted(tables, key=str) if self.capture.captures(t.database, t.table)]

    def _reset_transaction(self) -> None:
        self._written = set()
        self._unsure = None
        self._gtid = None
        self._standalone = False
        self.in_transaction = False

    # -- changes without trusted rows --------------------------------------------------

    def _statement_logged(self, sql: str, database: str, out: list[Change]) -> None:
        """A data change logged as the SQL statement: a session set ``binlog_format`` to
        ``STATEMENT`` or ``MIXED`` for itself (or MariaDB logs a table versioned by
        transaction ids so). No rows: every table it names is read again."""
        if self.history is None or not self.in_transaction:
            raise UndecodableEvent(
                "a data change was logged as an SQL statement (binlog_format is not ROW): "
                f"{sql[:120]!r}; run SET GLOBAL binlog_format=ROW on the source")
        markers = statement_dml_markers(sql, database, self.history)
        if markers is not None:
            out += markers
            return
        tables = statement_tables(sql, database, self.history)
        if not tables:  # a view, a name the history does not know: its database, whole
            log.warning("a statement-logged change names no table known here: every table "
                        "of %s is read again: %.120r", database, sql)
            tables = [t for t in self.history.tables if t.database == database]
        tables = self._with_cascades(tables)
        for table in tables:
            self._written.add(table)
        out += self._read_again(set(tables), STATEMENT_LOGGED)

    def _with_cascades(self, tables: list[TableName]) -> list[TableName]:
        """The tables and every table a foreign key's cascade reaches from them: a
        statement's cascades are not logged either (a replica runs them itself)."""
        assert self.history is not None
        found = dict.fromkeys(tables)
        queue = list(tables)
        while queue:
            for child, _ in self.history.children_of(queue.pop()):
                if child not in found:
                    found[child] = None
                    queue.append(child)
        return list(found)

    def _mapped_layouts(self) -> dict[TableName, TableLayout]:
        """The layouts of the tables mapped so far (this transaction's among them)."""
        return {TableName(e.layout.database, e.layout.table): e.layout
                for e in self._tables.values()}

    # -- XA transactions (cdcserver/replication/xa.py) ----------------------------------

    def _recorded(self, kind: EventKind, buf: bytes, start: int, end: int, timestamp: int,
                  out: list[Change]) -> bool:
        """An event of an XA prepare group: kept for the commit (True), or the group's end,
        which the decoder's dispatch handles (False)."""
        if kind in PASSIVE:
            return True
        if kind == EventKind.XA_PREPARE:
            return False
        if kind == EventKind.XID:  # MySQL's one phase: the group commits as it is
            self._replay(self._take_recording().events_back(), out)
            return False
        if kind in (EventKind.QUERY, EventKind.QUERY_COMPRESSED):
            sql, _ = query_statement(kind, Cursor(buf, start + HEADER_SIZE, end),
                                     self.collations)
            head = sql.lstrip()[:16].upper()
            if head.startswith("XA END"):
                return True
            if head.startswith(("COMMIT", "XA COMMIT")):  # MySQL's one phase: not prepared
                self._replay(self._take_recording().events_back(), out)
                return False
        assert self._recording is not None
        self._recording.add(portable(buf, start, end))
        return True

    def _take_recording(self) -> Recording:
        recording, self._recording = self._recording, None
        assert recording is not None
        return recording

    def _xa_prepare(self, body: Cursor, timestamp: int, out: list[Change]) -> None:
        """``XA PREPARE``: the group's rows are kept (durably) for its ``XA COMMIT``; the
        group itself commits empty, so that its GTID is passed. One phase: they go now."""
        one_phase, format_id = body.u8(), body.u32()
        gtrid_length, bqual_length = body.u32(), body.u32()
        data = body.take(gtrid_length + bqual_length)
        xid = Xid(format_id, bytes(data[:gtrid_length]), bytes(data[gtrid_length:]))
        if self._recording is None or self._gtid is None:
            raise UndecodableEvent(f"XA PREPARE of {xid} outside an XA transaction")
        recording = self._take_recording()
        if one_phase:
            self._replay(recording.events_back(), out)
        else:
            self.xa.prepared(recording, xid, self._gtid, timestamp)
        self._commit(timestamp, out)

    def _xa_complete(self, sql: str, timestamp: int, out: list[Change], *,
                     commit: bool) -> None:
        """``XA COMMIT xid``: the prepared rows, as this transaction's; ``XA ROLLBACK``:
        none. Either way this group's GTID is passed."""
        if self._pending_mysql_gtid is not None:
            self._open(self._pending_mysql_gtid, timestamp, out, standalone=True)
            self._pending_mysql_gtid = None
        xid = Xid.from_statement(sql)
        if not self.in_transaction or self._gtid is None or xid is None:
            raise UndecodableEvent(f"an XA completion outside its group: {sql[:120]!r}")
        events = self.xa.complete(xid, self._gtid, commit=commit)
        if events:
            self._replay(events, out)
        if self._standalone:
            self._commit(timestamp, out)

    def _replay(self, events: list[bytes], out: list[Change]) -> None:
        """Decode a prepare group's events as part of the open transaction, positioned at
        the current event (the rows became visible here, not at their prepare)."""
        tables, end = self._tables, self._event_end
        self._tables = {}
        try:
            for event in events:
                self._event(event, 0, out, checksummed=False, enclosing_end=end)
        finally:
            self._tables, self._event_end = tables, end
