"""Builds binlog events byte by byte, for decoder tests of what no server here produces (MySQL's
event flavor: no MySQL server package is reachable on these machines).

Layouts follow MySQL's ``libbinlogevents`` and MariaDB's ``sql/log_event.h``; the decoder is
also tested against real MariaDB servers, which keeps this builder honest for the shared parts.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from cdcserver.mariadb.constants import EventKind


def lenenc(n: int) -> bytes:
    if n < 0xFB:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")


def lenenc_str(s: bytes) -> bytes:
    return lenenc(len(s)) + s


class Builder:
    def __init__(self, *, mariadb: bool, checksums: bool = True, server_id: int = 1) -> None:
        self.mariadb = mariadb
        self.checksums = checksums
        self.server_id = server_id
        self.pos = 4
        self.timestamp = 1_700_000_000

    def event(self, kind: int, body: bytes, *, flags: int = 0, log_pos: int | None = None,
              inner: bool = False) -> bytes:
        """A replication packet (OK byte first), or a bare event for a transaction payload."""
        crc = 4 if self.checksums and not inner else 0
        size = 19 + len(body) + crc
        self.pos += size
        header = struct.pack("<IBIIIH", self.timestamp, kind, self.server_id, size,
                             self.pos if log_pos is None else log_pos, flags)
        event = header + body
        if crc:
            event += (zlib.crc32(event) & 0xFFFFFFFF).to_bytes(4, "little")
        return event if inner else b"\x00" + event

    def format_description(self) -> bytes:
        version = (b"10.11.19-MariaDB-log" if self.mariadb else b"8.0.36").ljust(50, b"\0")
        post_headers = bytearray(40)
        post_headers[EventKind.TABLE_MAP - 1] = 8
        post_headers[EventKind.QUERY - 1] = 13
        body = struct.pack("<H", 4) + version + struct.pack("<I", 0) + bytes([19]) + \
            bytes(post_headers) + bytes([1 if self.checksums else 0])
        return self.event(EventKind.FORMAT_DESCRIPTION, body)

    def rotate(self, file: str, position: int = 4) -> bytes:
        return self.event(EventKind.ROTATE, struct.pack("<Q", position) + file.encode(),
                          log_pos=0)

    def mysql_gtid(self, uuid: str, number: int, *, anonymous: bool = False) -> bytes:
        sid = bytes(16) if anonymous else bytes.fromhex(uuid.replace("-", ""))
        body = b"\x01" + sid + struct.pack("<Q", 0 if anonymous else number) + b"\x02" + \
            bytes(16)
        kind = EventKind.ANONYMOUS_GTID if anonymous else EventKind.GTID
        return self.event(kind, body)

    def mariadb_gtid(self, domain: int, sequence: int, flags: int = 0x0C) -> bytes:
        body = struct.pack("<QIB", sequence, domain, flags) + bytes(6)
        return self.event(EventKind.MARIADB_GTID, body)

    def query(self, sql: str, database: str = "db", **kw: object) -> bytes:
        status = b""
        body = struct.pack("<IIBHH", 1, 0, len(database), 0, len(status)) + status + \
            database.encode() + b"\0" + sql.encode()
        return self.event(EventKind.QUERY, body, **kw)  # type: ignore[arg-type]

    def xid(self, xid: int = 1, **kw: object) -> bytes:
        return self.event(EventKind.XID, struct.pack("<Q", xid), **kw)  # type: ignore[arg-type]

    def table_map(self, table_id: int, database: str, table: str,
                  columns: Sequence[tuple[int, bytes, str]], *, unsigned: Sequence[bool] = (),
                  numeric: int = 0, **kw: object) -> bytes:
        """``columns``: (type, metadata bytes, name). ``unsigned``: one flag per numeric
        column, in order (the SIGNEDNESS optional field)."""
        types = bytes(c[0] for c in columns)
        meta = b"".join(c[1] for c in columns)
        nullable = bytes([0xFF] * ((len(columns) + 7) // 8))
        body = table_id.to_bytes(6, "little") + struct.pack("<H", 1)
        body += bytes([len(database)]) + database.encode() + b"\0"
        body += bytes([len(table)]) + table.encode() + b"\0"
        body += lenenc(len(columns)) + types + lenenc_str(meta) + nullable
        if unsigned:
            bits = bytearray((len(unsigned) + 7) // 8)
            for i, flag in enumerate(unsigned):
                if flag:
                    bits[i // 8] |= 0x80 >> (i % 8)
            body += b"\x01" + lenenc_str(bytes(bits))
        names = b"".join(lenenc_str(c[2].encode()) for c in columns)
        body += b"\x04" + lenenc_str(names)
        return self.event(EventKind.TABLE_MAP, body, **kw)  # type: ignore[arg-type]

    def write_rows(self, table_id: int, count: int, rows: Sequence[bytes], *, v2: bool,
                   **kw: object) -> bytes:
        """``rows``: each a row image (NULL bitmap + values)."""
        body = table_id.to_bytes(6, "little") + struct.pack("<H", 1)
        if v2:
            body += struct.pack("<H", 2)
        body += lenenc(count) + bytes([0xFF] * ((count + 7) // 8)) + b"".join(rows)
        kind = EventKind.WRITE_ROWS_V2 if v2 else EventKind.WRITE_ROWS_V1
        return self.event(kind, body, **kw)  # type: ignore[arg-type]

    def transaction_payload(self, events: Sequence[bytes], *, zstd: bool) -> bytes:
        payload = b"".join(events)
        compression = 0 if zstd else 255
        data = payload
        if zstd:
            import cramjam

            data = bytes(cramjam.zstd.compress(payload))
        header = b""
        for field, value in ((1, len(data)), (2, compression), (3, len(payload))):
            header += lenenc(field) + lenenc_str(lenenc(value))
        body = header + lenenc(0) + data
        return self.event(EventKind.TRANSACTION_PAYLOAD, body)
