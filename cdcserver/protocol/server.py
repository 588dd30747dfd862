"""The listener: an asyncio TCP server speaking the CDC protocol.

Each connection is one task that owns the socket (``connection.py``): it frames messages (a
line, or for MaxScale's clients one write without a newline), enforces the limits (line
length, authentication and idle timeouts) and executes what the :class:`Session` decides.
While a stream runs, the task keeps reading so that ``CLOSE`` or a hang-up ends the stream at
once. The listener accepts them within a cap on connections, ends those whose access the
users file took away, and stops them all in order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdcserver.core.config import ListenerConfig
from cdcserver.protocol.connection import Connection
from cdcserver.protocol.outbox import Outbox, Traffic
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.tail import Delivered, Tails, read_range
from mariadb_cdc_client.format.keepalive import end_silent_peers
from mariadb_cdc_client.format.wire import Code, error_line

log = logging.getLogger(__name__)
HOUSEKEEPING_INTERVAL = 1.0  # seconds: the users file checked, the failed logins summed up


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
    connections_refused: int = 0  # too many connections (ERR TOO-MANY-CONNECTIONS)


DEFAULT_LIMITS = ListenerConfig()  # the listener's bounds: the configuration's [listener]


class CdcServer:
    def __init__(self, context: SessionContext, limits: ListenerConfig = DEFAULT_LIMITS,
                 zone: dt.tzinfo = dt.UTC, databus_labels: bool = False,
                 dump_released: Callable[[], None] | None = None,
                 delivered: Delivered | None = None) -> None:
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
        self.connections_refused = 0
        self.traffic = Traffic()  # bytes and records sent, counted as they are written
        self.dumps_sent = 0
        self.dump_released = dump_released  # wakes the cleaner
        # one reader per table end; a quarantined table's stream stops
        self.tails = Tails(read_range, self.traffic,
                           stopped=lambda table: table in context.catalog.quarantined,
                           delivered=delivered)

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
                             self.context.throttle.delayed, self.context.throttle.refused,
                             self.connections_refused)

    async def start(self, host: str, port: int, *, ssl: object = None) -> tuple[str, int]:
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=ssl, limit=self.limits.max_line + 1, backlog=1024,
            ssl_handshake_timeout=self.limits.auth_timeout if ssl is not None else None)
        sockname = self._server.sockets[0].getsockname()
        log.info("listening on %s:%d", sockname[0], sockname[1])
        self._housekeeping = asyncio.create_task(self._housekeep())
        return sockname[0], sockname[1]

    async def _housekeep(self) -> None:
        """Every second: the failed logins' summary when its interval ends, the end of each
        connection whose client acknowledges nothing sent, and when the users file changed,
        the end of each session whose user was removed or that is being sent a table its
        user may no longer read."""
        users = self.context.users
        seen = await asyncio.to_thread(users.refresh)
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            self.context.failures.tick()
            self.end_unacknowledging_clients()
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

    def end_unacknowledging_clients(self) -> None:
        """End each connection whose client has acknowledged nothing sent to it for
        ``dead_client_timeout`` seconds (a crashed host, a partition, a half-open link):
        its socket is reset at once, so that the data it held is not flushed for ever. A
        client that is merely slow to read (a zero window, its probes acknowledged) is left
        alone; an idle one keepalive looks after (``keepalive.py``)."""
        limit = self.limits.dead_client_timeout
        now = time.monotonic()
        for connection in list(self._sessions.values()):
            sock = connection.out.writer.get_extra_info("socket")
            if sock is None:
                continue
            try:
                silent = connection.silence.silent_for(sock, now)
            except OSError:  # closed meanwhile
                continue
            if silent >= limit:
                log.warning("%s: the client acknowledged nothing for %.0f s: connection "
                            "ended", connection.peer, silent)
                connection.out.writer.transport.abort()

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
            self.connections_refused += 1
            Outbox(writer, self.traffic).last_words(error_line(Code.TOO_MANY_CONNECTIONS,
                                                               refusal))
            await _close(writer)
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # a connection already reset
                end_silent_peers(sock, self.limits.dead_client_timeout, data_timeout=False)
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
            connection.out.last_words(last)
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
