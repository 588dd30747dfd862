"""The bounds of the HTTP listeners (the admin API and console, the monitoring endpoint), as
the CDC listener has its own: how many connections each holds, in all and from one address,
and how long a connection may take to send its first request.

An idle connection costs a file descriptor, and descriptors are shared out at start
(``app/descriptors.py``): a thousand idle connections to an unbounded port once took the
last one from the replication thread, which died with EMFILE. Each HTTP listener holds at
most :data:`CONNECTIONS` connections, :data:`PER_ADDRESS` of them from one address (an IPv6
client's /64), and a connection that has not sent a whole request head within
:data:`FIRST_REQUEST` seconds is closed. When the listener is full, a new connection closes
the one that has waited longest without sending a request (from the same address, when that
address is at its bound), if there is one, so that idle connections cannot keep an operator
or a probe out; else the oldest connection of the address that holds the most, when that is
more than the newcomer's address would hold, so that connections kept busy (a request every
few seconds) from two addresses cannot either; else it is closed itself. What was turned
away is logged once a minute, summed up.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CONNECTIONS = 64  # each HTTP listener's, in all
PER_ADDRESS = 32  # ... from one address (a browser opens six; ctl, probes and scrapers more)
FIRST_REQUEST = 10.0  # seconds to send the first request head
SUMMARY_INTERVAL = 60.0


def client_host(peer: Any) -> str:
    """The address a budget is kept for: an IPv4 address, or an IPv6 client's /64."""
    host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return host


class ConnectionGate:
    """One listener's connections: admitted within the bounds, the longest waiting one
    closed for a new one when full."""

    def __init__(self, name: str, total: int = CONNECTIONS, per_address: int = PER_ADDRESS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.total = total
        self.per_address = per_address
        self.clock = clock
        self.open: dict[Any, str] = {}  # connection -> its host, oldest first
        self.waiting: dict[Any, None] = {}  # no request yet, oldest first
        self.hosts: Counter[str] = Counter()
        self.refused = 0  # since the last summary
        self.closed_waiting = 0
        self._since = clock()

    def admit(self, connection: Any, host: str, close: Callable[[Any], None]) -> bool:
        """Whether ``connection`` may stay; ``close`` closes another one to make room."""
        self._summarise()
        if self.hosts[host] >= self.per_address:
            oldest = next((c for c in self.waiting if self.open[c] == host), None)
            if oldest is None:
                self.refused += 1
                return False
            self._make_room(oldest, close)
        elif len(self.open) >= self.total:
            oldest = next(iter(self.waiting), None)
            if oldest is None:
                oldest = self._biggest_holders_oldest(host)
            if oldest is None:
                self.refused += 1
                return False
            self._make_room(oldest, close)
        self.open[connection] = host
        self.waiting[connection] = None
        self.hosts[host] += 1
        return True

    def _biggest_holders_oldest(self, host: str) -> Any:
        """The oldest connection of the address holding the most, when it holds more than
        ``host`` would with one more (None: the connections are shared out evenly)."""
        biggest, held = self.hosts.most_common(1)[0]
        if held <= self.hosts[host] + 1:
            return None
        return next(c for c, h in self.open.items() if h == biggest)

    def _make_room(self, oldest: Any, close: Callable[[Any], None]) -> None:
        self.closed_waiting += 1
        self.release(oldest)
        close(oldest)

    def requested(self, connection: Any) -> None:
        """It sent a request: no longer the first to close for a newcomer."""
        self.waiting.pop(connection, None)

    def release(self, connection: Any) -> None:
        host = self.open.pop(connection, None)
        self.waiting.pop(connection, None)
        if host is not None:
            self.hosts[host] -= 1
            if not self.hosts[host]:
                del self.hosts[host]

    def _summarise(self) -> None:
        now = self.clock()
        if now - self._since < SUMMARY_INTERVAL:
            return
        if self.refused or self.closed_waiting:
            log.warning("%s: %d connections turned away past its bounds (%d in all, %d from "
                        "one address) and %d idle ones closed for newer ones in the last "
                        "%.0f s", self.name, self.refused, self.total, self.per_address,
                        self.closed_waiting, now - self._since)
        self.refused = self.closed_waiting = 0
        self._since = now


class GatedProtocol(asyncio.Protocol):
    """An HTTP server's protocol (aiohttp's) behind a :class:`ConnectionGate`, with a
    deadline for the first request head."""

    def __init__(self, inner: asyncio.Protocol, gate: ConnectionGate,
                 first_request: float = FIRST_REQUEST) -> None:
        self.inner = inner
        self.gate = gate
        self.first_request = first_request
        self.transport: asyncio.BaseTransport | None = None
        self.admitted = False
        self.head = b""  # the first request head so far (its last bytes)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        host = client_host(transport.get_extra_info("peername"))
        if not self.gate.admit(self, host, _close):
            transport.close()
            return
        self.admitted = True
        self.timer = asyncio.get_running_loop().call_later(self.first_request, self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.timer is not None:
            self.head = self.head[-3:] + data
            if b"\r\n\r\n" in self.head or b"\n\n" in self.head:
                self.timer.cancel()
                self.timer = None
                self.gate.requested(self)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.gate.release(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _too_slow(self) -> None:
        self.timer = None
        _close(self)


def _close(connection: Any) -> None:
    """Drop a connection that sent no request (nothing of ours is waiting to be sent)."""
    transport = getattr(connection, "transport", None)
    if transport is not None:
        transport.abort()
