"""Compressed binlog events, decoded rather than skipped.

MariaDB (``log_bin_compress=ON``, https://mariadb.com/kb/en/compressing-events-to-reduce-size-of-the-binary-log/):
QUERY_COMPRESSED and the *_ROWS_COMPRESSED events carry their statement or row data as
``header byte`` (0x80 | algorithm << 4 | size of the length field), the uncompressed length
(big-endian, that many bytes), then a zlib stream (sql/log_event.cc, binlog_buf_uncompress).

MySQL 8.0.20+ (``binlog_transaction_compression=ON``): a TRANSACTION_PAYLOAD event holds a whole
transaction's events, zstd-compressed, after a small type-length-value header
(libbinlogevents/src/compression/payload_event*, Transaction_payload_event).
"""

from __future__ import annotations

import zlib

from cdcserver.core.errors import UndecodableEvent
from cdcserver.replication.cursor import Cursor

_ZLIB = 0


def mariadb_uncompress(data: bytes) -> bytes:
    if not data or not data[0] & 0x80:
        raise UndecodableEvent("compressed event without its compression header")
    algorithm = (data[0] & 0x70) >> 4
    if algorithm != _ZLIB:
        raise UndecodableEvent(f"compressed event uses unknown algorithm {algorithm}")
    length_size = data[0] & 0x07
    expected = int.from_bytes(data[1 : 1 + length_size], "big")
    raw = zlib.decompress(data[1 + length_size :])
    if len(raw) != expected:
        raise UndecodableEvent(f"compressed event inflated to {len(raw)} bytes, header says "
                               f"{expected}")
    return raw


# Transaction_payload_event header fields
_END_MARK = 0
_PAYLOAD_SIZE = 1
_COMPRESSION_TYPE = 2
_UNCOMPRESSED_SIZE = 3
_ZSTD = 0
_NONE = 255


def mysql_transaction_payload(body: Cursor) -> bytes:
    """The concatenated inner events of a TRANSACTION_PAYLOAD event."""
    compression, size = _NONE, None
    while True:
        field = body.lenenc()
        if field == _END_MARK:
            break
        number = Cursor(body.lenenc_bytes()).lenenc()  # values are net_field_length coded
        if field == _COMPRESSION_TYPE:
            compression = number
        elif field == _UNCOMPRESSED_SIZE:
            size = number
    payload = body.rest()
    if compression == _NONE:
        return payload
    if compression != _ZSTD:
        raise UndecodableEvent(f"transaction payload uses unknown compression {compression}")
    try:
        import cramjam
    except ImportError:
        raise UndecodableEvent("a zstd-compressed MySQL transaction needs the 'cramjam' "
                               "package (pip install cramjam)") from None
    raw = bytes(cramjam.zstd.decompress(payload))
    if size is not None and len(raw) != size:
        raise UndecodableEvent(f"transaction payload inflated to {len(raw)} bytes, header "
                               f"says {size}")
    return raw
