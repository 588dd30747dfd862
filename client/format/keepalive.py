"""Noticing a peer that is gone without a word: a host that crashed, a network partitioned,
a connection half-open (the other side's packets dropped silently). TCP alone reports none
of these until it gives up retransmitting (about 15 minutes on Linux), and a connection that
carries nothing (a stream waiting for the next commit) never: keepalive probes ask the peer
while the connection is idle, and ``TCP_USER_TIMEOUT`` bounds how long data sent may stay
unacknowledged. A peer that acknowledges nothing for about ``seconds`` then ends the
connection with ``ETIMEDOUT``, while one that is merely slow to read (it acknowledges, with
a window of zero) is left alone."""

from __future__ import annotations

import socket

KEEPALIVE_PROBES = 3
# A client ends its connection (and the library reconnects, resuming after the last record
# it delivered) once the server's host has acknowledged nothing for this long.
DEAD_SERVER_TIMEOUT = 60.0


def end_silent_peers(sock: socket.socket, seconds: float) -> None:
    """End ``sock``'s connection once its peer has acknowledged nothing for ``seconds``
    (give or take a second): probes start after half of it idle, three of them in the other
    half. Options the platform lacks are skipped (keepalive with the system's timing)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(seconds / 2))
    interval = max(1, int((seconds - idle) / KEEPALIVE_PROBES))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
                        ("TCP_USER_TIMEOUT", int(seconds * 1000))):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
