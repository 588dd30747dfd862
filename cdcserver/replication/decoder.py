"""Binlog events in, plain changes out.

``EventDecoder.feed()`` takes one replication packet (as the server sends it: an OK byte, the
19-byte event header, the body, and a CRC32 when checksums are on) and appends the resulting
:mod:`cdcserver.core.changes` records to a list. It keeps the state a replica needs between events:
the checksum setting, the current binlog file, the table-id map and the open transaction.

Transaction framing, MariaDB: a GTID event opens every transaction (it replaces BEGIN); XID or a
``COMMIT`` query closes it, and a GTID with ``FL_STANDALONE`` wraps one statement (DDL) with no
closing event. MySQL: GTID or ANONYMOUS_GTID, then ``BEGIN``, then XID or ``COMMIT``; DDL comes as
GTID + query. (``../shared/seeds`` 004; https://mariadb.com/kb/en/gtid_event/)

Nothing is skipped silently: an event type the decoder does not know stops replication unless
the server flagged it ignorable (``LOG_EVENT_IGNORABLE_F``). The exception is raised before
the transaction's ``Commit`` is emitted, so the checkpoint never passes an event that was not
decoded. Row data of one table that does not decode stops that table's stream only (a
:class:`~cdcserver.core.changes.Quarantine` in its place): the others go on.
"""

from __future__ import annotations

import logging
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cdcserver.core.capture import EVERY_USER_TABLE, RULED_REWRITES, CaptureFilter
from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    ColumnDef,
    Commit,
    Ddl,
    Quarantine,
    RowImages,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.errors import CdcError, SchemaError, UndecodableEvent
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import CollationTable, codec_for
from cdcserver.mariadb.checksum import crc32
from cdcserver.mariadb.constants import (
    FL_GROUP_COMMIT_ID,
    FL_PREPARED_XA,
    FL_STANDALONE,
    LOG_EVENT_IGNORABLE_F,
    NO_FOREIGN_KEY_CHECKS_F,
    EventKind,
)
from cdcserver.replication import compression
from cdcserver.replication.cursor import Cursor
from cdcserver.replication.rowcodec import DeferredRows, RowsDecoder, compile_rows_decoder
from cdcserver.replication.rowless import (
    SAVEPOINT_ROLLBACK,
    STATEMENT_LOGGED,
    UNSURE_ROLLBACK,
    CascadeFinder,
    sequence_markers,
    statement_dml_markers,
    statement_markers,
    statement_tables,
)
from cdcserver.replication.tablemap import parse_table_map
from cdcserver.replication.xa import PreparedXa, Recording, Xid
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.masking import Projection, RowFunction, project_layout

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
HEADER_SIZE = 19

_ROWS_KINDS = {
    EventKind.WRITE_ROWS_V1: RowsKind.INSERT, EventKind.WRITE_ROWS_V2: RowsKind.INSERT,
    EventKind.WRITE_ROWS_COMPRESSED_V1: RowsKind.INSERT,
    EventKind.WRITE_ROWS_COMPRESSED: RowsKind.INSERT,
    EventKind.UPDATE_ROWS_V1: RowsKind.UPDATE, EventKind.UPDATE_ROWS_V2: RowsKind.UPDATE,
    EventKind.UPDATE_ROWS_COMPRESSED_V1: RowsKind.UPDATE,
    EventKind.UPDATE_ROWS_COMPRESSED: RowsKind.UPDATE,
    EventKind.DELETE_ROWS_V1: RowsKind.DELETE, EventKind.DELETE_ROWS_V2: RowsKind.DELETE,
    EventKind.DELETE_ROWS_COMPRESSED_V1: RowsKind.DELETE,
    EventKind.DELETE_ROWS_COMPRESSED: RowsKind.DELETE,
}
_V2_ROWS = frozenset({EventKind.WRITE_ROWS_V2, EventKind.UPDATE_ROWS_V2,
                      EventKind.DELETE_ROWS_V2, EventKind.WRITE_ROWS_COMPRESSED,
                      EventKind.UPDATE_ROWS_COMPRESSED, EventKind.DELETE_ROWS_COMPRESSED})
_COMPRESSED_ROWS = frozenset({EventKind.WRITE_ROWS_COMPRESSED_V1,
                              EventKind.UPDATE_ROWS_COMPRESSED_V1,
                              EventKind.DELETE_ROWS_COMPRESSED_V1,
                              EventKind.WRITE_ROWS_COMPRESSED,
                              EventKind.UPDATE_ROWS_COMPRESSED,
                              EventKind.DELETE_ROWS_COMPRESSED})
# Events that carry nothing a row-based change stream needs.
_PASSIVE = frozenset({EventKind.BINLOG_CHECKPOINT, EventKind.ANNOTATE_ROWS,
                      EventKind.START_ENCRYPTION, EventKind.INTVAR, EventKind.RAND,
                      EventKind.USER_VAR, EventKind.ROWS_QUERY, EventKind.PREVIOUS_GTIDS,
                      EventKind.STOP, EventKind.HEARTBEAT, EventKind.HEARTBEAT_V2,
                      EventKind.GTID_LIST, EventKind.IGNORABLE})
_STATEMENT_DML = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA)\b", re.I | re.S)
_TRANSACTION_CONTROL = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT)\b", re.I)
_Q_CHARSET_CODE = 4
# Query status variable sizes, for walking to Q_CHARSET_CODE (MySQL log_event.cc).
_STATUS_SIZES = {0: 4, 1: 8, 3: 4, 4: 6, 7: 2, 8: 2, 9: 8, 10: 4, 13: 3, 16: 1, 17: 8, 18: 2,
                 19: 1, 20: 1, 128: 3, 129: 8, 130: 1}


DeferDecoding = Callable[[tuple[ColumnDef, ...]], bool]


class _TableMapEntry:
    """A mapped table: the layout its rows are stored in (the ``[capture]`` column rules
    applied), how its row images decode to those rows, and whether they are handed over
    undecoded."""

    __slots__ = ("captured", "decode", "deferred", "layout", "ruled", "width")

    def __init__(self, layout: TableLayout, defer: DeferDecoding | None,
                 captured: bool = True, projection: Projection | None = None) -> None:
        self.width = len(layout.columns)  # of the row image
        self.captured = captured
        # column rules apply: an update's images may be the same once they are applied
        self.ruled = projection is not None
        decode = compile_rows_decoder(layout.columns)
        if projection is not None:
            layout = projection.layout
            decode = _projected(decode, projection.row)
        self.layout = layout
        self.decode: RowsDecoder = decode
        self.deferred = defer is not None and defer(layout.image_columns)


def _changed_pairs(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """An update's before/after pairs without those the column rules made the same: an
    update of excluded or masked columns only would otherwise tell that, and when, they
    changed (a hashed column's change shows: its hash changes)."""
    if all(rows[i] != rows[i + 1] for i in range(0, len(rows), 2)):
        return rows
    return [row for i in range(0, len(rows), 2) if rows[i] != rows[i + 1]
            for row in rows[i:i + 2]]


def _projected(decode: RowsDecoder, project: RowFunction) -> RowsDecoder:
    def decode_projected(buf: bytes, pos: int, end: int) -> list[tuple[Any, ...]]:
        return [project(row) for row in decode(buf, pos, end)]
    return decode_projected


class EventDecoder:
    """Stateful decoder for one replication connection's event stream.

    ``defer_decoding`` says which layouts' row images are handed over undecoded (a sink
    writes them directly; see :class:`~cdcserver.core.changes.Rows`); the others' are decoded
    here, so that images which do not decode stop replication at this event."""

    def __init__(self, collations: CollationTable, start: GtidState, *,
                 checksums: bool, verify_checksums: bool = True,
                 history: SchemaHistory | None = None,
                 defer_decoding: DeferDecoding | None = None,
                 capture: CaptureFilter = EVERY_USER_TABLE,
                 xa: PreparedXa | None = None) -> None:
        self.collations = collations
        self.xa = xa if xa is not None else PreparedXa()  # prepared XA transactions' events
        self._recording: Recording | None = None  # of the open XA prepare group
        self.capture = capture  # the tables whose changes are captured (the others are not
        # decoded: their table maps are read, their rows skipped)
        self.columns = capture.columns  # what becomes of their columns, before any sink
        self.defer_decoding = defer_decoding
        self.history = history
        self.cascades = CascadeFinder(history) if history is not None else None
        self.gtid_state = start
        self.verify_checksums = verify_checksums
        self.file = ""
        self.pos = 4
        self.checksum_size = 4 if checksums else 0
        self.mariadb = True  # until the FORMAT_DESCRIPTION event says otherwise
        self.table_id_size = 6
        self._tables: dict[int, _TableMapEntry] = {}
        # Table maps by their bytes (after the table id): a layout is decoded, checked
        # against the schema history and compiled once, not once per transaction.
        self._layouts: dict[bytes, _TableMapEntry] = {}
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

    # -- entry point -------------------------------------------------------------------

    def feed(self, packet: bytes, out: list[Change]) -> None:
        """Decode one packet (starting with the OK byte) and append its changes to ``out``."""
        self._event(packet, 1, out, checksummed=True)

    def _event(self, buf: bytes, start: int, out: list[Change], *, checksummed: bool,
               enclosing_end: int = 0) -> None:
        timestamp, kind_raw, server_id, size, log_pos, flags = HEADER.unpack_from(buf, start)
        log_pos = log_pos or enclosing_end  # events in a transaction payload have none
        crc = self.checksum_size if checksummed else 0
        end = start + size - crc
        if crc and self.verify_checksums:
            self._verify_checksum(buf, start, end, kind_raw)
        try:
            kind = EventKind(kind_raw)
        except ValueError:
            if flags & LOG_EVENT_IGNORABLE_F:
                self._advance(log_pos)
                return
            raise self._error(f"unknown binlog event type 0x{kind_raw:02x}") from None
        self._event_end = log_pos
        if not enclosing_end:  # an event inside a transaction payload starts where it does
            self._event_start = log_pos - size if log_pos >= size else 0
        try:
            if self._recording is None or \
                    not self._recorded(kind, buf, start, end, timestamp, out):
                self._dispatch(kind, buf, start + HEADER_SIZE, end, timestamp, server_id, out)
        except UndecodableEvent as exc:
            raise exc if exc.file else self._error(f"{kind.name} event: {exc}") from exc
        except CdcError as exc:
            raise self._error(f"{kind.name} event: {exc}") from exc
        except (ValueError, struct.error, UnicodeDecodeError, IndexError, zlib.error) as exc:
            raise self._error(f"{kind.name} event could not be decoded: {exc}") from exc
        self._advance(log_pos)

    def abort_open_transaction(self, out: list[Change], reason: str) -> None:
        if self._recording is not None:  # its group is read again whole
            self._recording.discard()
            self._recording = None
        if self.in_transaction:
            out.append(Abort(reason))
        self._reset_transaction()

    def position(self) -> BinlogPosition:
        return BinlogPosition(self.gtid_state, self.file, self.pos)

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, kind: EventKind, buf: bytes, pos: int, end: int, timestamp: int,
                  server_id: int, out: list[Change]) -> None:
        if kind in _ROWS_KINDS:
            self._rows(kind, buf, pos, end, timestamp, out)
        elif kind == EventKind.TABLE_MAP:
            self._table_map(buf, pos, end)
        elif kind == EventKind.MARIADB_GTID:
            self._mariadb_gtid(Cursor(buf, pos, end), timestamp, server_id, out)
        elif kind == EventKind.XID:
            self._commit(timestamp, out)
        elif kind in (EventKind.QUERY, EventKind.QUERY_COMPRESSED):
            self._query(kind, Cursor(buf, pos, end), timestamp, out)
        elif kind in (EventKind.GTID, EventKind.ANONYMOUS_GTID):
            self._mysql_gtid(kind, Cursor(buf, pos, end), server_id)
        elif kind == EventKind.ROTATE:
            self._rotate(Cursor(buf, pos, end))
        elif kind == EventKind.FORMAT_DESCRIPTION:
            self._format_description(buf, pos, end)
        elif kind == EventKind.TRANSACTION_PAYLOAD:
            self._transaction_payload(Cursor(buf, pos, end), out)
        elif kind == EventKind.XA_PREPARE:
            self._xa_prepare(Cursor(buf, pos, end), timestamp, out)
        elif kind not in _PASSIVE:
            raise UndecodableEvent(f"binlog event {kind.name} is not supported")

    def _table_map(self, buf: bytes, pos: int, end: int) -> None:
        table_id = int.from_bytes(buf[pos : pos + self.table_id_size], "little")
        key = bytes(buf[pos + self.table_id_size : end])
        entry = self._layouts.get(key)
        if entry is None:
            _, layout = parse_table_map(Cursor(buf, pos, end), self.table_id_size,
                                        self.collations, mariadb=self.mariadb)
            if self.history is not None:
                layout = self.history.reconcile(layout, self._gtid)
                if self.history.is_sequence(TableName(layout.database, layout.table)):
                    layout = replace(layout, sequence=True)
            elif layout.metadata != "full":
                raise SchemaError(f"the binlog has no column names for {layout.qualified_name}:"
                                  " set binlog_row_metadata=FULL on the source")
            captured = self.capture.captures(layout.database, layout.table)
            entry = _TableMapEntry(layout, self.defer_decoding, captured,
                                   project_layout(layout, self.columns) if captured else None)
            self._layouts[key] = entry
        self._tables[table_id] = entry

    # -- transactions ------------------------------------------------------------------

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
        out.append(Abort(reason))
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

    def _advance(self, log_pos: int) -> None:
        if log_pos:
            self.pos = log_pos

    # -- queries -----------------------------------------------------------------------

    def _query(self, kind: EventKind, body: Cursor, timestamp: int, out: list[Change]) -> None:
        sql, database = self._query_sql(kind, body)
        self._statement(sql, database, timestamp, out)

    def _query_sql(self, kind: EventKind, body: Cursor) -> tuple[str, str]:
        body.u32()  # thread id
        body.u32()  # execution time
        db_len = body.u8()
        body.u16()  # error code
        status = body.take(body.u16())
        database = body.take(db_len).decode("utf-8")
        body.u8()
        raw = body.rest()
        if kind == EventKind.QUERY_COMPRESSED:
            raw = compression.mariadb_uncompress(raw)
        return raw.decode(self._query_codec(status), errors="surrogateescape"), database

    def _statement(self, sql: str, database: str, timestamp: int, out: list[Change]) -> None:
        head = sql.lstrip()[:16].upper()
        if head.startswith("BEGIN") or head.startswith("XA START"):
            if self._pending_mysql_gtid is not None:
                self._open(self._pending_mysql_gtid, timestamp, out, standalone=False)
                self._pending_mysql_gtid = None
                if head.startswith("XA START"):  # MySQL: the XA group starts here
                    assert self._gtid is not None
                    self._recording = self.xa.record(self._gtid)
            elif not self.in_transaction:
                raise UndecodableEvent("BEGIN without a GTID event")
            return
        if head.startswith("XA END"):
            return
        if head.startswith(("XA COMMIT", "XA ROLLBACK")):
            self._xa_complete(sql, timestamp, out, commit=head.startswith("XA COMMIT"))
            return
        if head.startswith("COMMIT"):
            self._commit(timestamp, out)
            return
        if head.startswith("ROLLBACK") and not _TRANSACTION_CONTROL.match(sql):
            self._rollback(timestamp, out)
            return
        if head.startswith("ROLLBACK"):  # ROLLBACK TO SAVEPOINT
            self._rolled_back_to_savepoint(timestamp, out)
            return
        if _TRANSACTION_CONTROL.match(sql):
            return
        if _STATEMENT_DML.match(sql):
            self._statement_logged(sql, database, out)
            return
        if self._pending_mysql_gtid is not None:  # MySQL DDL: GTID, then the statement
            self._open(self._pending_mysql_gtid, timestamp, out, standalone=True)
            self._pending_mysql_gtid = None
        if not self.in_transaction:
            raise UndecodableEvent(f"statement outside a transaction: {sql[:120]!r}")
        kind: str = "query"
        changes: tuple[TableChange, ...] = ()
        if self.history is not None:
            kind, changes = self.history.apply(sql, database, self._gtid)
            if changes:
                self._layouts.clear()  # layouts were checked against the old definitions
        changes = tuple(self._stored(c) for c in changes
                        if self.capture.captures(c.database, c.table))
        out.append(Ddl(database, sql, timestamp, kind, changes, self.file, self._event_end,
                       self._event_start))
        out += statement_markers(changes, sql, self._ruled)
        if self.history is not None:
            out += sequence_markers(changes, self.history)
        if self._standalone:
            self._commit(timestamp, out)

    # -- XA transactions (cdcserver/replication/xa.py) ----------------------------------

    def _recorded(self, kind: EventKind, buf: bytes, start: int, end: int, timestamp: int,
                  out: list[Change]) -> bool:
        """An event of an XA prepare group: kept for the commit (True), or the group's end,
        which :meth:`_dispatch` handles (False)."""
        if kind in _PASSIVE:
            return True
        if kind == EventKind.XA_PREPARE:
            return False
        if kind == EventKind.XID:  # MySQL's one phase: the group commits as it is
            self._replay(self._take_recording().events_back(), out)
            return False
        if kind in (EventKind.QUERY, EventKind.QUERY_COMPRESSED):
            head = self._query_sql(kind, Cursor(buf, start + HEADER_SIZE, end))[0] \
                .lstrip()[:16].upper()
            if head.startswith("XA END"):
                return True
            if head.startswith(("COMMIT", "XA COMMIT")):  # MySQL's one phase: not prepared
                self._replay(self._take_recording().events_back(), out)
                return False
        assert self._recording is not None
        self._recording.add(_portable(buf, start, end))
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

    def _stored(self, change: TableChange) -> TableChange:
        """The change with its layout as the column rules store it; under column rules,
        without the reasons its values were rewritten, which name columns and their types
        (an excluded one's too): a generic one says a repair follows."""
        projection = None if change.layout is None else \
            project_layout(change.layout, self.columns)
        if projection is not None:
            change = replace(change, layout=projection.layout)
        previous = None if change.previous is None else \
            project_layout(change.previous, self.columns)
        if previous is not None:
            change = replace(change, previous=previous.layout)
        if change.rewrites and self._ruled(change):
            change = replace(change, rewrites=RULED_REWRITES)
        return change

    def _ruled(self, change: TableChange) -> bool:
        """Whether column rules apply to the table a schema change is about."""
        return bool(self.columns) and self.columns.touches(
            TableName(change.database, change.table))

    def _query_codec(self, status: bytes) -> str:
        """The statement's character set, from the Q_CHARSET_CODE status variable."""
        cur = Cursor(status)
        while cur.remaining() > 0:
            code = cur.u8()
            if code == _Q_CHARSET_CODE:
                client_collation = cur.u16()
                try:
                    return codec_for(self.collations.charset(client_collation)) or "utf-8"
                except LookupError:
                    return "utf-8"
            if code in (2, 5, 6):  # catalog, time zone, catalog (length-prefixed strings)
                cur.take(cur.u8() + (1 if code == 2 else 0))
            elif code == 11:  # invoker: user, host
                cur.take(cur.u8())
                cur.take(cur.u8())
            elif code in _STATUS_SIZES:
                cur.take(_STATUS_SIZES[code])
            else:
                break
        return "utf-8"

    # -- rows --------------------------------------------------------------------------

    def _rows(self, kind: EventKind, buf: bytes, pos: int, end: int, timestamp: int,
              out: list[Change]) -> None:
        head = Cursor(buf, pos, end)
        table_id = head.uint(self.table_id_size)
        flags = head.u16()
        if kind in _V2_ROWS:
            head.take(head.u16() - 2)  # extra data
        count = head.lenenc()
        entry = self._tables.get(table_id)
        if entry is None:
            raise UndecodableEvent(f"rows event for table id {table_id} without a table map")
        if not entry.captured:
            return
        if count != entry.width:
            self._quarantine(entry.layout, f"a rows event of {count} columns, its table map "
                                           f"{entry.width}", out)
            return
        bitmaps = 2 if _ROWS_KINDS[kind] == RowsKind.UPDATE else 1
        full = [_full_image(head.take((count + 7) // 8), count) for _ in range(bitmaps)]
        if not self.in_transaction:
            raise UndecodableEvent("row event outside a transaction")
        if not all(full):
            # One session's choice (SET SESSION binlog_row_image = MINIMAL or NOBLOB): its
            # rows miss columns, so the table is read again by its resync; the others go on.
            self._quarantine(entry.layout, "a row event with a partial image (a session set "
                             "binlog_row_image to MINIMAL or NOBLOB): the rows it changed "
                             "are read again by the table's resync", out)
            return
        data, start, stop = buf, head.pos, end
        if kind in _COMPRESSED_ROWS:
            data = compression.mariadb_uncompress(buf[start:stop])
            start, stop = 0, len(data)
        images: RowImages | None = None
        rows: list[tuple[Any, ...]] | DeferredRows
        hiding = entry.ruled and _ROWS_KINDS[kind] == RowsKind.UPDATE
        if entry.deferred and not hiding:
            images = RowImages(data, start, stop)
            rows = DeferredRows(entry.decode, images, entry.layout.qualified_name, self.file,
                                self.pos)
        else:
            try:
                rows = entry.decode(data, start, stop)
            except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
                self._quarantine(entry.layout, f"rows that do not match its table map: {exc}",
                                 out)
                return
            if hiding:
                rows = _changed_pairs(rows)
                if not rows:  # it changed hidden columns only: nothing to stream
                    self._written.add(TableName(entry.layout.database, entry.layout.table))
                    return
        change = Rows(entry.layout, _ROWS_KINDS[kind], timestamp, rows, self.file,
                      self._event_end, images, start=self._event_start)
        if self.history is not None:  # tables whose history missed a change: re-read them
            out += [Rowless(t.database, t.table, "the schema history missed a change of the "
                            "table (its table map disagreed): its rows are read again",
                            layout=entry.layout if TableName(entry.layout.database,
                                                             entry.layout.table) == t else None)
                    for t in self.history.take_relearned()]
        if self._unsure is None:
            out.append(change)
        else:  # after a ROLLBACK TO SAVEPOINT the rows are not trusted: read again
            self._unsure.add(TableName(entry.layout.database, entry.layout.table))
        self._written.add(TableName(entry.layout.database, entry.layout.table))
        if self.cascades is not None and not flags & NO_FOREIGN_KEY_CHECKS_F:
            out += self.cascades.markers(entry.layout, change.kind, change.rows,
                                         self._mapped_layouts)

    def _quarantine(self, layout: TableLayout, cause: str, out: list[Change]) -> None:
        """Rows of one table that cannot be decoded: that table's stream stops here (the
        store quarantines it), every other table goes on."""
        log.error("%s: %s at %s:%d", layout.qualified_name, cause, self.file, self.pos)
        out.append(Quarantine(layout.database, layout.table,
                              f"{cause} (binlog {self.file}:{self.pos})"))

    def _mapped_layouts(self) -> dict[TableName, TableLayout]:
        """The layouts of the tables mapped so far (this transaction's among them)."""
        return {TableName(e.layout.database, e.layout.table): e.layout
                for e in self._tables.values()}

    # -- stream bookkeeping ------------------------------------------------------------

    def _rotate(self, body: Cursor) -> None:
        self.pos = body.u64()
        self.file = body.rest().decode("utf-8")
        # Table ids are only valid within one server run; a rotate may mean a restart.
        self._tables.clear()

    def _format_description(self, buf: bytes, pos: int, end: int) -> None:
        body = Cursor(buf, pos, end)
        body.u16()  # binlog version
        self.mariadb = b"mariadb" in body.take(50).lower()
        body.u32()  # created
        header_len = body.u8()
        if header_len != HEADER_SIZE:
            raise UndecodableEvent(f"unsupported event header length {header_len}")
        # The checksum algorithm byte sits just before the event's own CRC (if any). The
        # event-size arithmetic in feed() already excluded a CRC we knew about; the FDE tells
        # us whether one is coming from now on.
        event_end = pos - HEADER_SIZE + int.from_bytes(buf[pos - 10 : pos - 6], "little")
        algorithm = buf[event_end - 5]
        self.checksum_size = 4 if algorithm == 1 else 0
        post_headers = buf[body.pos : event_end - 5]
        table_map_post_header = post_headers[EventKind.TABLE_MAP - 1]
        self.table_id_size = 6 if table_map_post_header == 8 else 4

    def _transaction_payload(self, body: Cursor, out: list[Change]) -> None:
        """MySQL 8.0.20+ binlog_transaction_compression: the events of one transaction,
        compressed together. They carry no checksums of their own."""
        payload = compression.mysql_transaction_payload(body)
        enclosing_end = self._event_end
        offset = 0
        while offset < len(payload):
            size = int.from_bytes(payload[offset + 9 : offset + 13], "little")
            self._event(payload, offset, out, checksummed=False, enclosing_end=enclosing_end)
            offset += size
        self._event_end = enclosing_end

    def _verify_checksum(self, buf: bytes, start: int, end: int, kind: int) -> None:
        expected = int.from_bytes(buf[end : end + 4], "little")
        if crc32(memoryview(buf)[start:end]) != expected:
            raise self._error(f"checksum mismatch in event type 0x{kind:02x}")

    def _error(self, message: str) -> UndecodableEvent:
        return UndecodableEvent(message, file=self.file, pos=self.pos)


def _portable(buf: bytes, start: int, end: int) -> bytes:
    """An event without its checksum and binlog position, to decode again later as part of
    another transaction (like the events of a MySQL transaction payload)."""
    event = bytearray(buf[start:end])
    struct.pack_into("<II", event, 9, end - start, 0)  # event size, log_pos
    return bytes(event)


def _full_image(bitmap: bytes, count: int) -> bool:
    """Whether a row event's column bitmap names every one of its ``count`` columns."""
    full = (1 << count) - 1
    return int.from_bytes(bitmap, "little") & full == full
