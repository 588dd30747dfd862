"""Binlog event framing: the common event header, the event types grouped as the decoder
(:mod:`cdcserver.replication.decoder`) treats them, and what the ``FORMAT_DESCRIPTION`` event
says of the events after it.

Every event starts with the same 19-byte header
(https://mariadb.com/kb/en/2-binlog-event-header/); rows events come in three generations (v1,
v2 with extra data, MariaDB's compressed ones), which decode the same once their head is read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdcserver.core.changes import RowsKind
from cdcserver.core.errors import UndecodableEvent
from cdcserver.mariadb.constants import EventKind
from cdcserver.replication.cursor import Cursor

HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
HEADER_SIZE = 19

ROWS_KINDS = {
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
V2_ROWS = frozenset({EventKind.WRITE_ROWS_V2, EventKind.UPDATE_ROWS_V2,
                      EventKind.DELETE_ROWS_V2, EventKind.WRITE_ROWS_COMPRESSED,
                      EventKind.UPDATE_ROWS_COMPRESSED, EventKind.DELETE_ROWS_COMPRESSED})
COMPRESSED_ROWS = frozenset({EventKind.WRITE_ROWS_COMPRESSED_V1,
                              EventKind.UPDATE_ROWS_COMPRESSED_V1,
                              EventKind.DELETE_ROWS_COMPRESSED_V1,
                              EventKind.WRITE_ROWS_COMPRESSED,
                              EventKind.UPDATE_ROWS_COMPRESSED,
                              EventKind.DELETE_ROWS_COMPRESSED})
# Events that carry nothing a row-based change stream needs.
PASSIVE = frozenset({EventKind.BINLOG_CHECKPOINT, EventKind.ANNOTATE_ROWS,
                      EventKind.START_ENCRYPTION, EventKind.INTVAR, EventKind.RAND,
                      EventKind.USER_VAR, EventKind.ROWS_QUERY, EventKind.PREVIOUS_GTIDS,
                      EventKind.STOP, EventKind.HEARTBEAT, EventKind.HEARTBEAT_V2,
                      EventKind.GTID_LIST, EventKind.IGNORABLE})


def portable(buf: bytes, start: int, end: int) -> bytes:
    """An event without its checksum and binlog position, to decode again later as part of
    another transaction (like the events of a MySQL transaction payload)."""
    event = bytearray(buf[start:end])
    struct.pack_into("<II", event, 9, end - start, 0)  # event size, log_pos
    return bytes(event)


@dataclass(frozen=True)
class Format:
    """What a ``FORMAT_DESCRIPTION`` event says of the events after it."""

    mariadb: bool  # the server is MariaDB (else MySQL)
    checksum_size: int  # of the CRC32 each event ends with: 4, or 0 without checksums
    table_id_size: int  # bytes of a table id in TABLE_MAP and rows events


def describe_format(buf: bytes, pos: int, end: int) -> Format:
    """The ``FORMAT_DESCRIPTION`` event whose body is ``buf[pos:end]``."""
    body = Cursor(buf, pos, end)
    body.u16()  # binlog version
    mariadb = b"mariadb" in body.take(50).lower()
    body.u32()  # created
    header_len = body.u8()
    if header_len != HEADER_SIZE:
        raise UndecodableEvent(f"unsupported event header length {header_len}")
    # The checksum algorithm byte sits just before the event's own CRC (if any). The
    # event-size arithmetic in feed() already excluded a CRC we knew about; the FDE tells
    # us whether one is coming from now on.
    event_end = pos - HEADER_SIZE + int.from_bytes(buf[pos - 10 : pos - 6], "little")
    algorithm = buf[event_end - 5]
    post_headers = buf[body.pos : event_end - 5]
    table_map_post_header = post_headers[EventKind.TABLE_MAP - 1]
    return Format(mariadb, 4 if algorithm == 1 else 0,
                  6 if table_map_post_header == 8 else 4)
