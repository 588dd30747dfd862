"""The replication connection: the only module that imports python-mysql-replication.

python-mysql-replication is used for what it does well, the replication protocol: connecting,
``SET @master_binlog_checksum``/heartbeat/capability, ``COM_REGISTER_SLAVE`` (so the service
shows in the primary's ``SHOW SLAVE HOSTS``) and ``COM_BINLOG_DUMP`` with MariaDB GTID
positioning. Its event loop (``fetchone``) is not used: it reconnects silently and replays from
its start position, and decodes one value per method call. This adapter reads raw event packets
instead and raises :class:`SourceUnavailable` on any connection error, so the replicator owns
the reconnect and resume policy (python-mysql-replication 1.0.17, ``binlogstream.py``).

Two private members are used and the dependency is pinned for that reason:
``_BinLogStreamReader__connect_to_stream`` and ``_BinLogStreamReader__set_mariadb_settings``.
The latter is overridden to fix a framing bug: it declares a 14-byte COM_BINLOG_DUMP payload but
sends 15 bytes, and the stray byte makes a non-blocking dump end in a connection reset that
loses the last events (``../shared/reference/environment.md`` §3).
``tests/server/test_replication.py`` reads a whole binlog in non-blocking GTID mode, which fails
without the fix.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import BinlogPurged, SourceRefused, SourceUnavailable
from cdcserver.core.gtid import GtidState
from cdcserver.mariadb.receive import receive_into
from cdcserver.replication import source

log = logging.getLogger(__name__)

# ER_MASTER_FATAL_ERROR_READING_BINLOG (position/GTID not in the binlogs, e.g. purged),
# access denied, replica server_id clash: retrying cannot help.
_FATAL_SERVER_ERRORS = frozenset({1236, 1045, 1227})
_CONNECTION_ERRORS = (pymysql.err.OperationalError, pymysql.err.InterfaceError, OSError,
                      struct.error)




# What MariaDB and MySQL answer (1236) when the binlog a replica asks for was purged
_PURGED = ("purged", "could not find gtid state requested by slave in any binlog",
           "could not find first log file name in binary log index file")


def _refusal(code: int, message: str) -> type[SourceUnavailable] | type[SourceRefused]:
    """The error class for a server error: retriable, refused, or refused for a purge."""
    if code not in _FATAL_SERVER_ERRORS:
        return SourceUnavailable
    if code == 1236 and any(p in message.lower() for p in _PURGED):
        return BinlogPurged
    return SourceRefused


class _ReplicaStream(BinLogStreamReader):
    """BinLogStreamReader reduced to the replication protocol."""

    fix_dump_framing = True

    def _BinLogStreamReader__set_mariadb_settings(self) -> bytes:
        packet: bytes = BinLogStreamReader._BinLogStreamReader__set_mariadb_settings(self)
        if self.fix_dump_framing:
            packet = struct.pack("<i", len(packet) - 4) + packet[4:]
        return packet

    def open(self) -> None:
        self._BinLogStreamReader__connect_to_stream()

    @property
    def checksums(self) -> bool:
        return bool(self._BinLogStreamReader__use_checksum)


_BUFFER = 1 << 20  # bytes read from the socket at a time
_MAX_PACKET = 0xFFFFFF  # a payload this long continues in the next packet


class _Packets:
    """The dump's packets (MySQL framing: 3-byte length, sequence number, payload), read
    from the socket in pieces of up to 1 MiB into one buffer. pymysql reads each packet
    with two calls, each releasing the GIL and then waiting to get it back from the event
    loop (up to the 5 ms switch interval): most of the replicator's time in the profile of
    a catch-up. The server sends nothing but the dump on this connection, so nothing is
    left unread for pymysql."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.buffer = bytearray(_BUFFER)
        self.pos = 0
        self.end = 0
        self.first = True  # pymysql's reader may hold the first bytes

    def __iter__(self) -> Iterator[bytes]:
        while True:
            payload = self._next()
            if payload[0] == 0xFE and len(payload) < 9:  # EOF: a non-blocking dump's end
                return
            if payload[0] == 0xFF:  # an error packet: the server refused or ended the dump
                errno = int.from_bytes(payload[1:3], "little")
                message = payload[9:].decode("utf-8", "replace") if payload[3:4] == b"#" \
                    else payload[3:].decode("utf-8", "replace")
                error = _refusal(errno, message)
                raise error(f"the source ended replication: ({errno}) {message}")
            yield payload

    def _next(self) -> bytes:
        """The next payload (packets of 16 MiB continued in the next one, joined)."""
        parts: list[bytes] = []
        while True:
            while self.end - self.pos < 4:
                self._refill()
            buf, pos = self.buffer, self.pos
            length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
            while self.end - self.pos - 4 < length:
                self._refill(length + 4)
            buf, pos = self.buffer, self.pos
            payload = bytes(buf[pos + 4 : pos + 4 + length])
            self.pos = pos + 4 + length
            if length < _MAX_PACKET and not parts:
                return payload
            parts.append(payload)
            if length < _MAX_PACKET:
                return b"".join(parts)

    def _refill(self, need: int = 0) -> None:
        """Keep what is not parsed yet at the front and read more after it (the buffer
        grown to ``need`` bytes if a packet does not fit)."""
        buf = self.buffer
        left = self.end - self.pos
        if self.pos:
            buf[:left] = buf[self.pos : self.end]
            self.pos, self.end = 0, left
        if need > len(buf):
            buf.extend(bytes(need - len(buf)))
        try:
            got = receive_into(self.conn, buf, left, self.first)
        except TimeoutError:
            raise SourceUnavailable(
                f"replication connection lost: nothing from the source, not even a "
                f"heartbeat, for {self.conn._read_timeout:g} s") from None
        self.first = False
        if not got:
            raise SourceUnavailable("replication connection lost: the source closed it")
        self.end = left + got


class BinlogConnection:
    """One replication connection. Iterate :meth:`packets`.

    MariaDB is positioned by ``file``/``pos`` when ``by_position`` (the replicator checked that
    the source's binlog is at the start state there), else by GTID state
    (``@slave_connect_state``); either way it sends its GTID events (``@mariadb_slave_capability
    =4``). MySQL is positioned by its GTID set (COM_BINLOG_DUMP_GTID) when it has GTIDs, else by
    ``file``/``pos``.
    """

    def __init__(self, address: SourceAddress, server_id: int, start: GtidState, *,
                 blocking: bool = True, heartbeat: float = 5.0, report_host: str = "cdcserver",
                 report_port: int = 0, fix_dump_framing: bool = True, mariadb: bool = True,
                 file: str = "", pos: int = 4, by_position: bool = False) -> None:
        settings = address.pymysql_kwargs()
        # A dead connection shows as a missing heartbeat: read_timeout ends the wait.
        if blocking:
            settings["read_timeout"] = heartbeat * 3
        settings.pop("charset")
        by_gtid = not (by_position and file) and (mariadb or bool(start) or not file)
        # python-mysql-replication sends MariaDB's GTID-positioned dump whenever is_mariadb
        # is set; the plain COM_BINLOG_DUMP with file and position works on both servers.
        self._stream = _ReplicaStream(
            connection_settings=settings, server_id=server_id, blocking=blocking,
            is_mariadb=mariadb and by_gtid, auto_position=str(start) if by_gtid else None,
            log_file=None if by_gtid else file, log_pos=None if by_gtid else pos,
            resume_stream=not by_gtid, slave_heartbeat=heartbeat,
            report_slave=(report_host, "", "", report_port), enable_logging=False,
            pymysql_wrapper=source.Connection)  # one TLS context for every connection
        self._stream.fix_dump_framing = fix_dump_framing
        self.address = address
        self.start = start

    def open(self) -> None:
        try:
            self._stream.open()
        except pymysql.err.OperationalError as exc:
            self.close()
            code = exc.args[0] if exc.args else 0
            error = _refusal(code, str(exc))
            raise error(f"cannot start replication from {self.address.describe()}: "
                        f"{exc}") from exc
        except _CONNECTION_ERRORS as exc:
            self.close()
            raise SourceUnavailable(f"cannot start replication from {self.address.describe()}: "
                                    f"{exc}") from exc

    @property
    def checksums(self) -> bool:
        return self._stream.checksums

    @property
    def server_thread(self) -> int | None:
        """The id of the server's thread serving this dump (``KILL`` ends it)."""
        conn = getattr(self._stream, "_stream_connection", None)
        return conn.thread_id() if conn is not None else None

    def packets(self) -> Iterator[bytes]:
        """Raw event packets (OK byte first) until the server ends a non-blocking dump."""
        try:
            yield from _Packets(self._stream._stream_connection)
        except pymysql.err.OperationalError as exc:  # the first read, through pymysql
            raise SourceUnavailable(f"replication connection lost: {exc}") from exc
        except _CONNECTION_ERRORS as exc:
            raise SourceUnavailable(f"replication connection lost: {exc}") from exc

    def interrupt(self) -> None:
        """Unblock a thread waiting in :meth:`packets` (called from another thread)."""
        conn = getattr(self._stream, "_stream_connection", None)
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self._stream.close()
        except _CONNECTION_ERRORS as exc:
            log.debug("closing the replication connection: %s", exc)
