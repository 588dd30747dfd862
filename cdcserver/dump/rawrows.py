"""Result rows read straight off the MySQL text protocol, as base64 JSON arrays.

A dump stores each value as the base64 of its text form, which is exactly what the text
protocol carries: a length-encoded string per column, 0xFB for NULL. Converting every value to
a Python object and back (what a cursor does) would cost more than the rest of the dump, so
after pymysql has sent the query and read the column definitions, this reads the row packets
from the socket in large pieces and turns each row into ``["b64", null, ...]`` bytes directly
(MySQL client/server protocol: Text Resultset, ProtocolText::ResultsetRow). A chunked dump's
readers go further (:func:`query_into`): the compiled path receives and encodes in one call
without the GIL, into memory the dump gives (the body's staging area, a reader's buffer), and
hands Python a piece every ``_WANT`` bytes.
"""

from __future__ import annotations

import binascii
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import pymysql
from pymysql.constants import COMMAND

from cdcserver.core.errors import ER_TABLE_DEF_CHANGED, DefinitionChanged, SourceError
from cdcserver.mariadb.receive import receive_into
from mariadb_cdc_client.format.compiled import compiled_module

# the row path in C (cdcserver/dump/_rawrows.pyx); the same bytes as _row below
compiled = compiled_module("cdcserver.dump._rawrows")

T = TypeVar("T")

_NULL = 0xFB
_EOF = 0xFE
_ERROR = 0xFF
_MAX_PACKET = 0xFFFFFF
_BUFFER = 1 << 20  # bytes read from the socket at a time (more for a longer packet)
_WANT = 256 << 10  # query_into: bytes encoded between two pieces handed to Python


def query_rows(conn: Any, sql: str, batch: int = 500) -> Iterator[list[bytes]]:
    """Run ``sql`` and yield batches of rows, each row the bytes of a JSON array of base64
    strings and nulls."""
    yield from _query(conn, sql, batch, iter)


def _query(conn: Any, sql: str, batch: int, read: Callable[[_Rows], Iterator[T]]
           ) -> Iterator[T]:
    """Run ``sql`` and yield what ``read`` makes of its rows; a result left unread closes
    the connection (rows are still arriving: it cannot be reused)."""
    conn._execute_command(COMMAND.COM_QUERY, sql)
    result = pymysql.connections.MySQLResult(conn)
    conn._result = result
    result.init_unbuffered_query()  # the column count and definitions, through pymysql
    if not result.unbuffered_active:
        return  # not a result set
    complete = False
    rows = _Rows(conn, result.field_count, batch)
    try:
        yield from read(rows)
        complete = True
    finally:
        result.unbuffered_active = False
        conn._result = None
        if not complete:
            conn.close()
        elif len(rows.buffer) == _BUFFER:  # the connection's next query reads into it
            conn._cdc_receive_buffer = rows.buffer


INSERT_PREFIX = b'{"action":"insert","rows":['

Line = tuple[bytes, int, bytes]  # insert lines of a dump, their rows, their last row


def query_lines(conn: Any, sql: str, batch: int = 500) -> Iterator[Line]:
    """Run ``sql`` and yield its rows as a dump's insert lines (``{"action":"insert",
    "rows":[...]}`` and a newline, at most ``batch`` rows each), one or more at a time, with
    their row count and their last row. The compiled path encodes all the rows received at
    once without holding the GIL, so readers in threads encode at once and hand over few,
    large pieces."""
    if compiled is None:
        for rows in query_rows(conn, sql, batch):
            yield (INSERT_PREFIX + b",".join(rows) + b"]}\n", len(rows), rows[-1])
        return
    yield from _query(conn, sql, batch, _Rows.lines)


class Sink(Protocol):
    """Where :func:`query_into` encodes rows: room in a buffer of its own, or bytes."""

    def space(self, need: int = 0) -> tuple[Any, int, int] | None:
        """(A writable buffer, where the room starts, where it ends): at least ``need``
        bytes; None if it never has that much."""

    def wrote(self, end: int) -> None:
        """The room given holds bytes up to ``end`` now."""

    def write(self, data: bytes) -> None:
        """Bytes after what it holds."""


def query_into(conn: Any, sql: str, batch: int, out: Sink) -> Iterator[tuple[int, bytes]]:
    """Run ``sql`` and encode its rows as a dump's insert lines straight into ``out``'s room
    (the compiled path: no bytes object in between); yields the rows and the last row of
    each piece written (``out`` may be another one on the next piece)."""
    if compiled is None:
        for data, count, last in query_lines(conn, sql, batch):
            out.write(data)
            yield count, last
        return
    yield from _query(conn, sql, batch, lambda rows: rows.into(out))


class _Rows:
    """Row packets parsed where they lie in the receive buffer (MySQL packets: 3-byte
    length, sequence number, payload; a payload of 16 MiB or more continues in the next).
    The buffer is allocated once and read into in place (``buffer[:end]`` holds data): the
    socket's bytes are copied once, with the GIL released."""

    def __init__(self, conn: Any, columns: int, batch: int) -> None:
        self.conn = conn
        self.columns = columns
        self.batch = batch
        # one buffer per connection, kept between its queries (a new one's pages would be
        # faulted in for every query)
        self.buffer: bytearray = getattr(conn, "_cdc_receive_buffer", None) or bytearray(_BUFFER)
        conn._cdc_receive_buffer = None  # while this query reads into it
        self.end = 0
        self.first = True  # pymysql's reader may hold the first rows

    def __iter__(self) -> Iterator[list[bytes]]:
        if compiled is not None:
            return self._compiled()
        return self._python()

    def _compiled(self) -> Iterator[list[bytes]]:
        assert compiled is not None
        rows: list[bytes] = []
        pos = 0
        while True:
            try:
                state, pos = compiled.parse_rows(self.buffer, pos, self.end, self.columns,
                                                 self.batch, rows)
            except ValueError as exc:
                raise SourceError(str(exc)) from exc
            if state == compiled.FULL:
                yield rows
                rows = []
            elif state == compiled.LONG:
                pos = self._long_packet(pos, rows)
            elif state in (compiled.END, compiled.ERROR):
                self._ended(pos, state == compiled.ERROR)
                if rows:
                    yield rows
                return
            else:  # NEED_MORE
                pos = self._refill(pos)

    def _ended(self, pos: int, error: bool) -> None:
        """The result's last packet (EOF or an error) at ``pos``: the connection's packet
        sequence goes on after it; an error raises."""
        buf = self.buffer
        length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
        self.conn._next_seq_id = (buf[pos + 3] + 1) % 256
        if error:
            payload = bytes(buf[pos + 4:pos + 4 + length])
            failure = DefinitionChanged \
                if int.from_bytes(payload[1:3], "little") == ER_TABLE_DEF_CHANGED else SourceError
            raise failure(f"the source stopped the dump query: {_error(payload)}")
        if pos + 4 + length != self.end:
            raise SourceError("unexpected data after the dump query's result")

    def _refill(self, pos: int) -> int:
        """Move what is not parsed yet (from ``pos``) to the front and read more after it
        (the buffer doubled when a packet does not fit); the new position (0). The first
        read takes what pymysql's reader holds (or reads once), the others go straight from
        the socket into the buffer."""
        buf = self.buffer
        left = self.end - pos
        if pos:
            buf[:left] = buf[pos:self.end]
        if left == len(buf):
            buf.extend(bytes(len(buf)))
        got = receive_into(self.conn, buf, left, self.first)
        self.first = False
        if not got:
            raise SourceError("the source closed the connection during the dump")
        self.end = left + got
        return 0

    def lines(self) -> Iterator[Line]:
        """The rows as insert lines, every whole packet received encoded in one call to the
        compiled path."""
        assert compiled is not None
        pos = 0
        while True:
            try:
                state, pos, lines, count, last = compiled.parse_lines(
                    self.buffer, pos, self.end, self.columns, self.batch)
            except ValueError as exc:
                raise SourceError(str(exc)) from exc
            if lines is not None:
                yield lines, count, lines[last:-3]
            if state == compiled.LONG:
                rows: list[bytes] = []
                pos = self._long_packet(pos, rows)
                yield INSERT_PREFIX + rows[0] + b"]}\n", 1, rows[0]
            elif state in (compiled.END, compiled.ERROR):
                self._ended(pos, state == compiled.ERROR)
                return
            else:  # NEED_MORE
                pos = self._refill(pos)

    def into(self, out: Sink) -> Iterator[tuple[int, bytes]]:
        """The rows encoded into ``out`` (see :func:`query_into`). On a plain socket the
        compiled path receives and encodes in one call without the GIL until ``_WANT``
        bytes are written (few, large pieces for Python to handle); otherwise (TLS, a read
        timeout) each receive goes through Python."""
        assert compiled is not None
        pos = 0
        columns, batch = self.columns, self.batch
        sock = self.conn._sock
        fd = sock.fileno() if type(sock) is socket.socket and sock.gettimeout() is None \
            else -1
        if fd >= 0:
            pos = self._refill(pos)  # first, what pymysql's reader holds
        room = out.space()
        while True:
            assert room is not None
            area, at, limit = room
            try:
                if fd >= 0:
                    state, pos, self.end, end, count, last, err = compiled.receive_lines(
                        fd, self.buffer, pos, self.end, columns, batch, area, at, limit,
                        _WANT)
                else:
                    state, pos, end, count, last = compiled.encode_lines(
                        self.buffer, pos, self.end, columns, batch, area, at, limit)
            except ValueError as exc:
                raise SourceError(str(exc)) from exc
            if count:
                row = bytes(area[last:end - 3])
                out.wrote(end)
                yield count, row
                room = out.space()
            if state == compiled.OUT_FULL:
                buf = self.buffer
                length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                room = out.space(compiled.row_room(length, columns))
                if room is None:  # a row larger than any room: as bytes
                    _, pos, data, count, last = compiled.parse_lines(
                        buf, pos, pos + 4 + length, columns, batch)
                    out.write(data)
                    yield count, data[last:-3]
                    room = out.space()
            elif state == compiled.LONG:
                rows: list[bytes] = []
                pos = self._long_packet(pos, rows)
                out.write(INSERT_PREFIX + rows[0] + b"]}\n")
                yield 1, rows[0]
                room = out.space()
            elif state in (compiled.END, compiled.ERROR):
                self._ended(pos, state == compiled.ERROR)
                return
            elif state == compiled.CLOSED:
                raise SourceError("the source closed the connection during the dump")
            elif state == compiled.RECV_FAILED:
                raise SourceError(f"reading from the source failed: {os.strerror(err)}")
            elif fd < 0 or self.end - pos == len(self.buffer):  # NEED_MORE
                pos = self._refill(pos)  # (through Python, the buffer grown if full)

    def _python(self) -> Iterator[list[bytes]]:
        rows: list[bytes] = []
        pos = 0
        while True:
            buf = self.buffer
            view = memoryview(buf)
            end = self.end
            while end - pos >= 4:
                length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                if end - pos - 4 < length:
                    break
                if length == _MAX_PACKET:
                    view.release()
                    pos = self._long_packet(pos, rows)
                    buf, view, end = self.buffer, memoryview(self.buffer), self.end
                    continue
                payload = view[pos + 4 : pos + 4 + length]
                first = payload[0]
                if (first == _EOF and length < 9) or first == _ERROR:
                    payload.release()
                    view.release()
                    self._ended(pos, first == _ERROR)
                    if rows:
                        yield rows
                    return
                rows.append(_row(payload, self.columns))
                payload.release()
                pos += 4 + length
                if len(rows) >= self.batch:
                    view.release()
                    yield rows
                    rows = []
                    view = memoryview(buf)
            view.release()
            pos = self._refill(pos)

    def _long_packet(self, pos: int, rows: list[bytes]) -> int:
        """A row of 16 MiB or more: join its packets, then parse it; the position after it."""
        payload = bytearray()
        while True:
            while self.end - pos < 4:
                pos = self._refill(pos)
            buf = self.buffer
            length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
            while self.end - pos - 4 < length:
                pos = self._refill(pos)
                buf = self.buffer
            payload += buf[pos + 4 : pos + 4 + length]
            pos += 4 + length
            if length < _MAX_PACKET:
                rows.append(_row(memoryview(payload), self.columns) if compiled is None
                            else compiled.encode_row(payload, self.columns))
                return pos


def _row(payload: memoryview, columns: int) -> bytes:
    parts: list[bytes | None] = []
    pos = 0
    b64 = binascii.b2a_base64
    nulls = False
    for _ in range(columns):
        first = payload[pos]
        if first < 0xFB:
            end = pos + 1 + first
            parts.append(b64(payload[pos + 1 : end], newline=False))
            pos = end
        elif first == _NULL:
            parts.append(None)
            nulls = True
            pos += 1
        else:
            width = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
            length = int.from_bytes(payload[pos + 1 : pos + 1 + width], "little")
            start = pos + 1 + width
            parts.append(b64(payload[start : start + length], newline=False))
            pos = start + length
    if pos != len(payload):
        raise SourceError(f"a result row has {len(payload) - pos} bytes after its {columns} "
                          "columns")
    if not nulls:
        return b'["' + b'","'.join(parts) + b'"]'  # type: ignore[arg-type]  # no None here
    return b"[" + b",".join(b"null" if p is None else b'"' + p + b'"' for p in parts) + b"]"


def _error(payload: bytes) -> str:
    code = int.from_bytes(payload[1:3], "little")
    message = payload[9:] if payload[3:4] == b"#" else payload[3:]
    return f"({code}) {message.decode('utf-8', 'replace')}"
