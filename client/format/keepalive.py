"""Noticing a peer that is gone without a word: a host that crashed, a network partitioned,
a connection half-open (the other side's packets dropped silently). TCP alone reports none
of these until it gives up retransmitting (about 15 minutes on Linux), and a connection that
carries nothing (a stream waiting for the next commit) never: keepalive probes ask the peer
while the connection is idle, and ``TCP_USER_TIMEOUT`` bounds how long data sent may stay
unacknowledged. A peer that acknowledges nothing for about ``seconds`` then ends the
connection with ``ETIMEDOUT``.

``TCP_USER_TIMEOUT`` also ends, on Linux, a connection whose peer has advertised a zero
window for that long, however promptly it acknowledges the window probes: a reader that is
merely slow (a client applying a large batch before it reads on). Where the peer may do
that, as the service's clients may, the option is left off (``data_timeout=False``) and the
owner asks a :class:`SilenceWatch` every second instead, which tells the two apart."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

KEEPALIVE_PROBES = 3
# A client ends its connection (and the library reconnects, resuming after the last record
# it delivered) once the server's host has acknowledged nothing for this long.
DEAD_SERVER_TIMEOUT = 60.0


def end_silent_peers(sock: socket.socket, seconds: float, *, data_timeout: bool = True
                     ) -> None:
    """End ``sock``'s connection once its peer has acknowledged nothing for ``seconds``
    (give or take a second): probes start after half of it idle, three of them in the other
    half. Options the platform lacks are skipped (keepalive with the system's timing).
    Without ``data_timeout``, only an idle connection is ended so (``TCP_USER_TIMEOUT`` is
    not set: see the module's description); data sent and left unacknowledged is then
    :func:`unacknowledged_for`'s to notice."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(seconds / 2))
    interval = max(1, int((seconds - idle) / KEEPALIVE_PROBES))
    options = [("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
               ("TCP_KEEPCNT", KEEPALIVE_PROBES)]
    if data_timeout or not hasattr(socket, "TCP_INFO"):  # (without TCP_INFO: the bound)
        options.append(("TCP_USER_TIMEOUT", int(seconds * 1000)))
    for name, value in options:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


# struct tcp_info (linux/tcp.h): tcpi_probes is byte 3; tcpi_unacked the 5th of the 32-bit
# fields after the first 8 bytes; tcpi_last_ack_recv the 13th (milliseconds)
_TCP_INFO_SIZE = 60
_PROBES = 3
_UNACKED = 8 + 4 * 4
_LAST_ACK_RECEIVED = 8 + 4 * 12


def awaiting_acknowledgement(sock: socket.socket) -> float | None:
    """Seconds since ``sock``'s peer last acknowledged anything, if something sent to it
    is unacknowledged now (data, or a window probe); None if nothing is, or where the
    platform has no ``TCP_INFO``."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_SIZE)
    if len(info) < _TCP_INFO_SIZE:
        return None
    (unacked,) = struct.unpack_from("I", info, _UNACKED)
    if unacked == 0 and info[_PROBES] == 0:
        return None
    (last_ack_ms,) = struct.unpack_from("I", info, _LAST_ACK_RECEIVED)
    return last_ack_ms / 1000


class SilenceWatch:
    """How long one connection's peer has left something sent to it unacknowledged, for an
    owner that asks about once a second. The time counts from the earlier of the peer's
    last acknowledgement and the first time this watch saw something outstanding: a reader
    with a full window is probed at intervals Linux doubles up to two minutes, and while
    one probe is on its way the last acknowledgement is that long ago, although the peer
    answers each probe (0 is returned then, as for a connection carrying nothing). A peer
    gone while its window was closed is seen from the next probe it leaves unanswered."""

    def __init__(self, read: Callable[[socket.socket], float | None] = awaiting_acknowledgement
                 ) -> None:
        self._read = read
        self._since: float | None = None  # when something outstanding was first seen

    def silent_for(self, sock: socket.socket, now: float) -> float:
        """Seconds ``sock``'s peer has been silent with something outstanding, at ``now``
        (a monotonic clock's)."""
        since_ack = self._read(sock)
        if since_ack is None:
            self._since = None
            return 0.0
        if self._since is None:
            self._since = now
        return min(since_ack, now - self._since)
