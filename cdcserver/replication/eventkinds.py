"""Binlog event framing: the common event header, and the event types grouped as the decoder
(:mod:`cdcserver.replication.decoder`) treats them.

Every event starts with the same 19-byte header
(https://mariadb.com/kb/en/2-binlog-event-header/); rows events come in three generations (v1,
v2 with extra data, MariaDB's compressed ones), which decode the same once their head is read.
"""

from __future__ import annotations

import struct

from cdcserver.core.changes import RowsKind
from cdcserver.mariadb.constants import EventKind

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
