"""The listener: an asyncio TCP server speaking the CDC protocol.

Each connection is one task that owns the socket: it frames messages (a line, or for MaxScale's
clients one write without a newline), enforces the limits (line length, authentication and idle
timeouts, a cap on connections) and executes what the :class:`Session` decides. While a stream
runs, the task keeps reading so that ``CLOSE`` or a hang-up ends the stream at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from cdcserver.core.config import ListenerConfig
from cdcserver.core.names import TableName
from cdcserver.dump.databus import NoDefinition, write_databus
from cdcserver.protocol.dialect import JsonStyle
from cdcserver.protocol.openfiles import dump_in_use
from cdcserver.protocol.outbox import Outbox, Traffic
from cdcserver.protocol.outcomes import Delay, Phase, Reply, SendDump, StartStream
from cdcserver.protocol.queries import QUERIES, SessionContext
from cdcserver.protocol.session import Session
from cdcserver.protocol.stream import Streamer
from cdcserver.protocol.tail import Tails, read_range
from mariadb_cdc_client.format.wire import Code, ProtocolError, error_line

log = logging.getLogger(__name__)
HOUSEKEEPING_INTERVAL = 1.0  # seconds: the users file checked, the failed logins summed up


class LayoutFailed(Exception):
    """The databus layout of a dump could not be written (a full disk...)."""


@dataclass(frozen=True)
class ListenerStats:
    """What the listener has done, for /metrics and /health."""

    clients: int = 0  # connections open
    connections: int = 0  # accepted since start
    records_sent: int = 0
    bytes_sent: int = 0
    login_failures: int = 0
    dumps_sent: int = 0
    logins_delayed: int = 0
    logins_throttled: int = 0


_READ_SIZE = 65536


class MessageReader:
    """Frames messages: ``\\n``-terminated lines (``\\r\\n`` accepted), or the bytes of one
    write when they carry no newline at all (MaxScale's cdc.py and connector never send one).
    With ``incomplete``, such bytes are joined with the next write while it says they are only
    the start of a message (a login sent in two writes, as bborbe's Go client does)."""

    def __init__(self, reader: asyncio.StreamReader, max_line: int) -> None:
        self._reader = reader
        self._max_line = max_line
        self._buffer = bytearray()
        self._ready: list[bytes] = []

    async def next(self, incomplete: Callable[[bytes], bool] | None = None) -> bytes | None:
        """The next message, or None at end of input."""
        while not self._ready:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                if self._buffer:
                    rest, self._buffer = bytes(self._buffer), bytearray()
                    return rest
                return None
            self._buffer += data
            *lines, tail = self._buffer.split(b"\n")
            self._ready.extend(bytes(line.rstrip(b"\r")) for line in lines)
            self._buffer = bytearray(tail)
            if tail and b"\n" not in data and len(data) < _READ_SIZE and not (
                    incomplete is not None and not lines and incomplete(bytes(tail))):
                # One write without a newline: a whole MaxScale-style command. (A read that
                # filled the buffer is part of something longer: keep reading.)
                self._ready.append(bytes(tail))
                self._buffer.clear()
            if len(self._buffer) > self._max_line or any(
                    len(m) > self._max_line for m in self._ready):
                raise ProtocolError(Code.LINE_TOO_LONG,
                                    f"a command may be at most {self._max_line} bytes", fatal=True)
        return self._ready.pop(0)


DEFAULT_LIMITS = ListenerConfig()  # the listener's bounds: the configuration's [listener]


class CdcServer:
    def __init__(self, context: SessionContext, limits: ListenerConfig = DEFAULT_LIMITS,
                 zone: dt.tzinfo = dt.UTC, databus_labels: bool = False) -> None:
        self.context = context
        self.limits = limits
        self.zone = zone
        self.databus_labels = databus_labels  # a dump's databus layout as the Kafka sink's
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._sessions: dict[asyncio.Task[None], Connection] = {}  # the connections' own
        self._housekeeping: asyncio.Task[None] | None = None
        self._unauthenticated: collections.Counter[str] = collections.Counter()  # by address
        self.connections_total = 0
        self.traffic = Traffic()  # bytes and records sent, counted as they are written
        self.dumps_sent = 0
        self.dump_released: Callable[[], None] | None = None  # wakes the cleaner
        self.tails = Tails(read_range, self.traffic)  # one reader per table end
        self.tails.stopped = lambda table: table in context.catalog.quarantined

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def login_failures(self) -> int:
        return self.context.login_failures

    def stats(self) -> ListenerStats:
        return ListenerStats(self.connections, self.connections_total,
                             self.traffic.records_sent, self.traffic.bytes_sent,
                             self.login_failures, self.dumps_sent,
                             self.context.throttle.delayed, self.context.throttle.refused)

    async def start(self, host: str, port: int, *, ssl: object = None) -> tuple[str, int]:
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=ssl, limit=self.limits.max_line + 1, backlog=1024,
            ssl_handshake_timeout=self.limits.auth_timeout if ssl is not None else None)
        sockname = self._server.sockets[0].getsockname()
        log.info("listening on %s:%d", sockname[0], sockname[1])
        self._housekeeping = asyncio.create_task(self._housekeep())
        return sockname[0], sockname[1]

    async def _housekeep(self) -> None:
        """Every second: the failed logins' summary when its interval ends, and when the
        users file changed, the end of each session whose user was removed or that is being
        sent a table its user may no longer read."""
        users = self.context.users
        seen = await asyncio.to_thread(users.refresh)
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            self.context.failures.tick()
            generation = await asyncio.to_thread(users.refresh)
            if generation != seen:
                seen = generation
                self.revoke_lost_access()

    def sessions(self) -> list[Connection]:
        """Every connection open now, in the order they arrived (the admin API)."""
        return sorted(self._sessions.values(), key=lambda c: c.id)

    def disconnect(self, connection_id: int, why: str) -> bool:
        """End a connection: its client is told ``why`` (``ERR FORBIDDEN``); False if no
        connection has that id."""
        for task, connection in self._sessions.items():
            if connection.id == connection_id:
                log.warning("%s: closing the session: %s", connection.peer, why)
                if connection.revoked is None:
                    connection.revoked = why
                task.cancel()
                return True
        return False

    def revoke_lost_access(self) -> None:
        """End each session whose user was removed or may no longer read its table."""
        for task, connection in list(self._sessions.items()):
            reason = connection.session.lost_access(connection.reading)
            if reason is not None and connection.revoked is None:
                log.warning("%s: closing the session: %s", connection.peer, reason)
                connection.revoked = reason
                task.cancel()

    async def stop(self) -> None:
        """Stop accepting, give streams a grace period, then cancel what is left."""
        if self._server is None:
            return
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        self._server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.limits.shutdown_grace)
        await self.tails.stop()
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = _peer_name(writer)
        address = _address(writer)
        refusal = self._refusal(address)
        if refusal is not None:
            log.warning("%s: refused: %s", peer, refusal)
            Outbox(writer, self.traffic).last_words(error_line(Code.TOO_MANY_CONNECTIONS,
                                                               refusal))
            await _close(writer)
            return
        self._connections.add(task)
        self._unauthenticated[address] += 1
        self.connections_total += 1
        connection = Connection(self, reader, writer, peer, self.connections_total)
        connection.left_login = lambda: self._left_login(address)
        self._sessions[task] = connection
        try:
            await connection.run()
            await _linger(reader, writer)
        except asyncio.CancelledError:
            # stop() cancels connections, and so does a change of the users file that ends
            # the session. The task ends normally: asyncio 3.11's start_server callback
            # would log a cancelled handler task as an error.
            last = error_line(Code.FORBIDDEN, connection.revoked) if connection.revoked \
                else error_line(Code.SHUTTING_DOWN, "the server is stopping")
            Outbox(writer, self.traffic).last_words(last)
        finally:
            self._connections.discard(task)
            self._sessions.pop(task, None)
            if connection.left_login is not None:  # it closed during the login
                self._left_login(address)
            await _close(writer)

    def _refusal(self, address: str) -> str | None:
        """Why a new connection is refused, if it is: the connections the server allows (a
        budget of the file descriptor limit), or, while more than half of them are in use,
        one more of an address that has ``max_unauthenticated`` not logged in yet (so that
        one address cannot take every slot; many clients of one host, logging in at once
        on a server with room, are all served)."""
        if len(self._connections) >= self.limits.max_connections:
            return (f"the server allows {self.limits.max_connections} connections, all in "
                    "use")
        if self._unauthenticated[address] >= self.limits.max_unauthenticated and \
                len(self._connections) >= self.limits.max_connections // 2:
            return (f"{self.limits.max_unauthenticated} connections from {address} have not "
                    "logged in yet")
        return None

    def _left_login(self, address: str) -> None:
        self._unauthenticated[address] -= 1
        if self._unauthenticated[address] <= 0:
            del self._unauthenticated[address]


class Connection:
    def __init__(self, server: CdcServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str, connection_id: int = 0) -> None:
        self.server = server
        self.id = connection_id  # unique while the listener runs (the admin API's)
        self.connected_at = time.time()
        self.out = Outbox(writer, server.traffic)
        self.peer = peer
        self.messages = MessageReader(reader, server.limits.max_line)
        self.session = Session(server.context, peer, server.limits.bad_command_limit)
        loop = asyncio.get_running_loop()
        # One deadline for the whole authentication phase; after it, the idle deadline moves
        # only with real commands (empty lines do not keep a connection alive).
        self._auth_deadline = loop.time() + server.limits.auth_timeout
        self._last_command = loop.time()
        self._pending: bytes | None = None  # a command that arrived during a dump transfer
        # told once, when the session leaves the login phase (the per-address count)
        self.left_login: Callable[[], None] | None = None
        self.reading: TableName | None = None  # the table being streamed or dumped
        self.streamer: Streamer | None = None  # the stream being sent
        self.sending: str | None = None  # the dump file being sent (its name)
        self.request: str | None = None  # the command that started them
        self.revoked: str | None = None  # why the server ended the session (users file)

    async def run(self) -> None:
        log.debug("%s: connected", self.peer)
        try:
            while self.session.phase != Phase.CLOSED:
                message = await self._next_message()
                if message is None:
                    break
                if message.strip():
                    self._last_command = asyncio.get_running_loop().time()
                outcome = self.session.receive(message)
                if self.left_login is not None and self.session.phase != Phase.AUTH:
                    self.left_login()
                    self.left_login = None
                if isinstance(outcome, Delay):
                    await asyncio.sleep(outcome.seconds)
                    outcome = outcome.then()
                while isinstance(outcome, QUERIES):  # read off the loop, answered on it
                    result = await asyncio.to_thread(outcome.fetch, self.session.context)
                    outcome = self.session.answered(outcome, result)
                if isinstance(outcome, Reply):
                    if outcome.data:
                        await self.out.reply(outcome.data)
                    if outcome.close:
                        break
                elif isinstance(outcome, StartStream):
                    await self._stream(outcome)
                    break
                elif isinstance(outcome, SendDump):
                    sent = await self._send_dump(outcome)
                    if not sent or outcome.follow is None or \
                            self.session.phase == Phase.CLOSED:
                        continue
                    await self._stream(StartStream(outcome.follow, outcome.format, outcome.dialect))
                    break
        except ProtocolError as exc:
            await self.out.reply(exc.reply())
        except TimeoutError:
            phase = "authentication" if self.session.phase == Phase.AUTH else "idle"
            await self.out.reply(error_line(Code.TIMEOUT, f"{phase} timeout"))
        except ConnectionError as exc:
            log.debug("%s: connection lost: %s", self.peer, exc)
        except Exception:
            log.exception("%s: internal error", self.peer)
            await self.out.reply(error_line(Code.INTERNAL, "internal error; see the server's log"))
        log.debug("%s: closed", self.peer)

    async def _next_message(self) -> bytes | None:
        if self._pending is not None:
            message, self._pending = self._pending, None
            return message
        if self.session.phase == Phase.AUTH:
            async with asyncio.timeout_at(self._auth_deadline):
                return await self.messages.next(self.session.incomplete)
        async with asyncio.timeout_at(self._last_command + self.server.limits.idle_timeout):
            return await self.messages.next()

    async def _stream(self, start: StartStream) -> None:
        context = self.server.context
        streamer = Streamer(context.catalog, context.index(), start.request, start.format,
                            self.out, JsonStyle(start.dialect, self.server.zone),
                            context.caught_up, self.server.tails)
        log.info("%s: %s (%s)", self.peer, start.request.line, start.format.value)
        self.reading = start.request.table
        self.streamer, self.request = streamer, start.request.line
        stream_task = asyncio.create_task(streamer.run())
        input_task = asyncio.create_task(self._watch_input())
        try:
            done, _ = await asyncio.wait({stream_task, input_task},
                                         return_when=asyncio.FIRST_COMPLETED)
            if stream_task in done:
                stream_task.result()
            else:
                reply = input_task.result()
                stream_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream_task
                if reply:
                    await self.out.reply(reply)
        except ConnectionError:
            pass
        finally:
            for task in (stream_task, input_task):
                task.cancel()
            log.info("%s: stream ended: %d records, %d bytes", self.peer,
                     streamer.records_sent, streamer.bytes_sent)

    async def _send_dump(self, outcome: SendDump) -> bool:
        """``OK <bytes> <name>``, then the file, marked in use throughout. True if it was
        sent whole; False after an error reply (or a CLOSE, which also ends the session)."""
        dump = outcome.dump
        started = time.monotonic()
        self.reading, self.sending = dump.table, dump.name
        try:
            with dump_in_use(dump.path, outcome.databus) as on_disk, \
                    contextlib.ExitStack() as stack:
                f = on_disk
                if outcome.databus:
                    f = stack.enter_context(await self._databus_layout(
                        on_disk, dump.path, self.server.databus_labels))
                size = os.fstat(f.fileno()).st_size
                await self.out.reply(f"OK {size} {dump.name}\n".encode())
                transfer = asyncio.create_task(self.out.send_file(
                    f.fileno(), 0, size, stall_timeout=self.server.limits.idle_timeout))
                input_task = asyncio.create_task(self.messages.next())
                try:
                    await asyncio.wait({transfer, input_task},
                                       return_when=asyncio.FIRST_COMPLETED)
                    if input_task.done() and not transfer.done() and \
                            not self._hold(input_task.result()):
                        log.info("%s: %s: transfer abandoned by the client", self.peer,
                                 dump.name)
                        return False
                    sent = await transfer
                    if not input_task.done():
                        input_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        # A command that arrived as the transfer ended must not be lost.
                        message = await input_task
                        if not self._pending:
                            self._hold(message)
                finally:
                    for task in (transfer, input_task):
                        task.cancel()
                    for task in (transfer, input_task):
                        with contextlib.suppress(asyncio.CancelledError, ConnectionError,
                                                 OSError):
                            await task
        except FileNotFoundError:
            await self.out.reply(error_line(Code.NO_FILE, f"{dump.name} was deleted meanwhile"))
            return False
        except NoDefinition as exc:
            await self.out.reply(error_line(Code.NO_FILE, f"{dump.name}: {exc}"))
            return False
        except LayoutFailed as exc:
            log.warning("%s: %s: %s", self.peer, dump.name, exc)
            await self.out.reply(error_line(Code.INTERNAL, f"{dump.name}: {exc}"))
            return False
        finally:
            self.reading = self.sending = None
            if self.server.dump_released is not None:
                self.server.dump_released()
        self._last_command = asyncio.get_running_loop().time()  # the transfer was not idle
        self.server.dumps_sent += 1
        log.info("%s: sent %s (%d bytes in %.2fs)", self.peer, dump.name, sent,
                 time.monotonic() - started)
        return True

    @staticmethod
    async def _databus_layout(f: BinaryIO, path: str, labels: bool) -> BinaryIO:
        """The dump in mysql-databus's layout, in a file without a name beside it (it
        vanishes when closed, or with the process), its size known before the reply."""
        try:
            out = tempfile.TemporaryFile(dir=os.path.dirname(path))  # noqa: SIM115 - returned
        except OSError as exc:
            raise LayoutFailed(f"cannot make the databus layout: {exc.strerror or exc}") \
                from exc
        try:
            await asyncio.to_thread(write_databus, f, out, labels)
            out.seek(0)
        except OSError as exc:  # a full disk
            out.close()
            raise LayoutFailed(f"cannot make the databus layout: {exc.strerror or exc}") \
                from exc
        except BaseException:
            out.close()
            raise
        return out

    def _hold(self, message: bytes | None) -> bool:
        """A message read during a transfer: kept to be answered after it. CLOSE stops the
        transfer (False); the end of the client's input lets it finish (the client may
        have only shut down its sending side), and then the session ends."""
        if message is None:
            self.session.phase = Phase.CLOSED
            return True
        if message.strip().upper() == b"CLOSE":
            self.session.phase = Phase.CLOSED
            return False
        self._pending = message
        return True

    async def _watch_input(self) -> bytes:
        """While streaming, only CLOSE (or a hang-up) is expected; returns the reply to send
        after stopping the stream (empty for none)."""
        while True:
            message: bytes | None
            if self._pending is not None:  # sent during a REQUEST-DUMP ... FOLLOW transfer
                message, self._pending = self._pending, None
            else:
                message = await self.messages.next()
            if message is None:
                return b""
            command = message.strip().upper()
            if not command:
                continue
            if command == b"CLOSE":
                return b""
            return error_line(Code.STREAMING, "only CLOSE is accepted while streaming; "
                                              "closing the stream")


def _address(writer: asyncio.StreamWriter) -> str:
    """The client's address without its port."""
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "?")


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "?")


LINGER = 1.0


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close our side first and let the client's last bytes arrive before the socket is
    closed: closing a socket with unread input sends a reset, which can destroy our final
    reply (``ERR TIMEOUT …``) before the client reads it. Bounded by LINGER seconds."""
    with contextlib.suppress(ConnectionError, OSError, RuntimeError, TimeoutError):
        if writer.is_closing() or not writer.can_write_eof():
            return
        writer.write_eof()
        async with asyncio.timeout(LINGER):
            while await reader.read(65536):
                pass


async def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        writer.close()
        await writer.wait_closed()
