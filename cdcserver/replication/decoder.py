"""Binlog events in, plain changes out.

``EventDecoder.feed()`` takes one replication packet (as the server sends it: an OK byte, the
19-byte event header, the body, and a CRC32 when checksums are on) and appends the resulting
:mod:`cdcserver.core.changes` records to a list. It keeps the state a replica needs between events:
the checksum setting, the current binlog file, the table-id map and the open transaction (whose
framing, by GTID, XID, ``COMMIT`` and XA groups, is :mod:`cdcserver.replication.transactions`).

Nothing is skipped silently: an event type the decoder does not know stops replication unless
the server flagged it ignorable (``LOG_EVENT_IGNORABLE_F``). The exception is raised before
the transaction's ``Commit`` is emitted, so the checkpoint never passes an event that was not
decoded. Row data of one table that does not decode stops that table's stream only (a
:class:`~cdcserver.core.changes.Quarantine` in its place): the others go on.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import replace
from typing import Any

from cdcserver.core.capture import EVERY_USER_TABLE, RULED_REWRITES, CaptureFilter
from cdcserver.core.changes import (
    Change,
    Ddl,
    Quarantine,
    RowImages,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.errors import CdcError, SchemaError, StoreError, UndecodableEvent
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import CollationTable
from cdcserver.mariadb.checksum import crc32
from cdcserver.mariadb.constants import LOG_EVENT_IGNORABLE_F, NO_FOREIGN_KEY_CHECKS_F, EventKind
from cdcserver.replication import compression
from cdcserver.replication.cursor import Cursor
from cdcserver.replication.eventkinds import (
    COMPRESSED_ROWS,
    HEADER,
    HEADER_SIZE,
    PASSIVE,
    ROWS_KINDS,
    V2_ROWS,
    describe_format,
)
from cdcserver.replication.mappedtable import DeferDecoding, MappedTable, changed_pairs, full_image
from cdcserver.replication.queryevent import STATEMENT_DML, TRANSACTION_CONTROL, query_statement
from cdcserver.replication.rowcodec import DeferredRows
from cdcserver.replication.rowless import CascadeFinder, sequence_markers, statement_markers
from cdcserver.replication.tablemap import parse_table_map
from cdcserver.replication.transactions import TransactionFraming
from cdcserver.replication.xa import PreparedXa
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.masking import project_layout

log = logging.getLogger(__name__)


class EventDecoder(TransactionFraming):
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
        super().__init__(collations, start, history=history, capture=capture, xa=xa)
        self.columns = capture.columns  # what becomes of their columns, before any sink
        self.defer_decoding = defer_decoding
        self.cascades = CascadeFinder(history) if history is not None else None
        self.verify_checksums = verify_checksums
        self.checksum_size = 4 if checksums else 0
        self.mariadb = True  # until the FORMAT_DESCRIPTION event says otherwise
        self.table_id_size = 6
        # Table maps by their bytes (after the table id): a layout is decoded, checked
        # against the schema history and compiled once, not once per transaction.
        self._layouts: dict[bytes, MappedTable] = {}

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
        except StoreError:
            raise  # the data directory's (the schema history's disk), not the event's
        except CdcError as exc:
            raise self._error(f"{kind.name} event: {exc}") from exc
        except (ValueError, struct.error, UnicodeDecodeError, IndexError, zlib.error) as exc:
            raise self._error(f"{kind.name} event could not be decoded: {exc}") from exc
        self._advance(log_pos)

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, kind: EventKind, buf: bytes, pos: int, end: int, timestamp: int,
                  server_id: int, out: list[Change]) -> None:
        if kind in ROWS_KINDS:
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
        elif kind not in PASSIVE:
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
            entry = MappedTable(layout, self.defer_decoding, captured,
                                project_layout(layout, self.columns) if captured else None)
            self._layouts[key] = entry
        self._tables[table_id] = entry

    def _advance(self, log_pos: int) -> None:
        if log_pos:
            self.pos = log_pos

    # -- queries -----------------------------------------------------------------------

    def _query(self, kind: EventKind, body: Cursor, timestamp: int, out: list[Change]) -> None:
        sql, database = query_statement(kind, body, self.collations)
        self._statement(sql, database, timestamp, out)

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
        if head.startswith("ROLLBACK") and not TRANSACTION_CONTROL.match(sql):
            self._rollback(timestamp, out)
            return
        if head.startswith("ROLLBACK"):  # ROLLBACK TO SAVEPOINT
            self._rolled_back_to_savepoint(timestamp, out)
            return
        if TRANSACTION_CONTROL.match(sql):
            return
        if STATEMENT_DML.match(sql):
            self._statement_logged(sql, database, out)
            return
        self._schema_statement(sql, database, timestamp, out)

    def _schema_statement(self, sql: str, database: str, timestamp: int,
                          out: list[Change]) -> None:
        """A statement that is neither transaction control nor a data change: DDL (or
        another statement the schema history reads), with the markers its changes need."""
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

    # -- rows --------------------------------------------------------------------------

    def _rows(self, kind: EventKind, buf: bytes, pos: int, end: int, timestamp: int,
              out: list[Change]) -> None:
        head = Cursor(buf, pos, end)
        table_id = head.uint(self.table_id_size)
        flags = head.u16()
        if kind in V2_ROWS:
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
        bitmaps = 2 if ROWS_KINDS[kind] == RowsKind.UPDATE else 1
        full = [full_image(head.take((count + 7) // 8), count) for _ in range(bitmaps)]
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
        if kind in COMPRESSED_ROWS:
            data = compression.mariadb_uncompress(buf[start:stop])
            start, stop = 0, len(data)
        values = self._row_values(entry, ROWS_KINDS[kind], data, start, stop, out)
        if values is None:
            return
        rows, images = values
        change = Rows(entry.layout, ROWS_KINDS[kind], timestamp, rows, self.file,
                      self._event_end, images, start=self._event_start)
        self._hand_on(change, entry.layout, cascades=not flags & NO_FOREIGN_KEY_CHECKS_F,
                      out=out)

    def _row_values(self, entry: MappedTable, kind: RowsKind, data: bytes, start: int,
                    stop: int, out: list[Change],
                    ) -> tuple[list[tuple[Any, ...]] | DeferredRows, RowImages | None] | None:
        """A rows event's rows, decoded here or deferred with their images; None when
        there is nothing to stream (the table quarantined, or hidden columns changed only)."""
        hiding = entry.ruled and kind == RowsKind.UPDATE
        if entry.deferred and not hiding:
            images = RowImages(data, start, stop)
            return DeferredRows(entry.decode, images, entry.layout.qualified_name, self.file,
                                self.pos), images
        try:
            rows = entry.decode(data, start, stop)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
            self._quarantine(entry.layout, f"rows that do not match its table map: {exc}", out)
            return None
        if hiding:
            rows = changed_pairs(rows)
            if not rows:  # it changed hidden columns only: nothing to stream
                self._written.add(TableName(entry.layout.database, entry.layout.table))
                return None
        return rows, None

    def _hand_on(self, change: Rows, layout: TableLayout, *, cascades: bool,
                 out: list[Change]) -> None:
        """The rows change, with the markers it brings: tables to read again because the
        schema history missed a change, and the tables a foreign key's cascade reaches."""
        table = TableName(layout.database, layout.table)
        if self.history is not None:  # tables whose history missed a change: re-read them
            out += [Rowless(t.database, t.table, "the schema history missed a change of the "
                            "table (its table map disagreed): its rows are read again",
                            layout=layout if table == t else None)
                    for t in self.history.take_relearned()]
        if self._unsure is None:
            out.append(change)
        else:  # after a ROLLBACK TO SAVEPOINT the rows are not trusted: read again
            self._unsure.add(table)
        self._written.add(table)
        if self.cascades is not None and cascades:
            out += self.cascades.markers(layout, change.kind, change.rows,
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
        described = describe_format(buf, pos, end)
        self.mariadb = described.mariadb
        self.checksum_size, self.table_id_size = described.checksum_size, described.table_id_size

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
