"""Dead-peer detection on every TCP connection the project opens: the listener's accepted
sockets, the client library's and the source connections' (the behaviour itself, a peer gone
silent and dropped, is tests/integration/test_network_faults.py's)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from mariadb_cdc_client.format.keepalive import (
    KEEPALIVE_PROBES,
    SilenceWatch,
    awaiting_acknowledgement,
    end_silent_peers,
)


def _options(sock: socket.socket) -> dict[str, int]:
    return {"keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)}


@pytest.mark.parametrize("seconds", [3.0, 60.0, 600.0])
def test_a_silent_peer_is_given_up_after_about_the_time_asked(seconds: float):
    with socket.socket() as sock:
        end_silent_peers(sock, seconds)
        got = _options(sock)
    assert got["keepalive"] == 1
    assert got["user_timeout_ms"] == seconds * 1000
    assert got["probes"] == KEEPALIVE_PROBES
    # the probes start after about half the time idle and end within it (give or take 1 s)
    given_up = got["idle"] + got["interval"] * got["probes"]
    assert seconds / 2 <= given_up <= seconds + 1, got


def test_a_unix_socket_is_left_alone():
    with socket.socket(socket.AF_UNIX) as sock:
        end_silent_peers(sock, 10.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0


def test_the_client_librarys_connections_give_up_a_silent_server():
    from mariadb_cdc_client.format.keepalive import DEAD_SERVER_TIMEOUT
    from mariadb_cdc_client.format.wire import Format
    from mariadb_cdc_client.sync import SyncCdcConnection

    with socket.create_server(("127.0.0.1", 0)) as server:
        conn = SyncCdcConnection._connected("127.0.0.1", server.getsockname()[1],
                                            Format.JSON, None, 5.0)
        try:
            got = _options(conn.sock)
        finally:
            conn.sock.close()
    assert got["keepalive"] == 1
    assert got["user_timeout_ms"] == DEAD_SERVER_TIMEOUT * 1000


def test_a_source_connection_is_bounded_before_the_server_greets(monkeypatch):
    """The bound must hold during pymysql's handshake too: a source that vanished while it
    greeted held the lag monitor's thread for ever (its network namespace removed). The
    order is recorded in this thread: a peer that looked at accept() time raced the client
    (the kernel completes the TCP handshake before connect() returns)."""
    import pymysql

    from cdcserver.core.config import SourceAddress
    from cdcserver.core.errors import SourceUnavailable
    from cdcserver.replication import source

    events: list[str] = []
    monkeypatch.setattr(source, "end_silent_peers",
                        lambda sock, seconds: events.append("bounded"))

    def greeting(self: object) -> None:
        events.append("greeting")
        raise pymysql.err.OperationalError(2013, "no greeting (the test's)")

    monkeypatch.setattr(source.Connection, "_get_server_information", greeting)
    with socket.create_server(("127.0.0.1", 0)) as server:  # its backlog completes connects
        address = SourceAddress(host="127.0.0.1", port=server.getsockname()[1], user="u",
                                password="", connect_timeout=2.0)
        with pytest.raises((SourceUnavailable, pymysql.err.MySQLError)):
            source.connect(address)
    assert events == ["bounded", "greeting"]


def test_without_a_data_timeout_only_the_idle_bound_is_set():
    """The listener's sockets: Linux's TCP_USER_TIMEOUT would end a client that stops
    reading (a zero window) as well as a dead one, so it is left at the system's 0."""
    with socket.socket() as sock:
        end_silent_peers(sock, 3.0, data_timeout=False)
        got = _options(sock)
    assert got["keepalive"] == 1
    assert got["user_timeout_ms"] == 0
    assert got["idle"] + got["interval"] * got["probes"] <= 4


@contextlib.contextmanager
def _connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection on 127.0.0.1: (one end, the other end)."""
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as sock:
        peer, _ = server.accept()
        with peer:
            yield sock, peer


def test_a_connection_with_nothing_outstanding_has_acknowledged_everything():
    with _connected() as (sock, peer):
        assert awaiting_acknowledgement(sock) is None
        sock.sendall(b"x" * 1000)
        assert peer.recv(1000)
        time.sleep(1.1)  # the last acknowledgement a second old: idle, not silent
        assert awaiting_acknowledgement(sock) is None
        assert SilenceWatch().silent_for(sock, time.monotonic()) == 0.0


def test_a_reader_with_a_full_window_is_never_silent_for_long():
    """A peer that reads nothing while its window is full still answers the window probes
    (Linux rate-limits those answers to one per 500 ms, so an early probe may go
    unanswered for a moment)."""
    with _connected() as (sock, _):
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                sock.send(b"x" * 65536)
        watch = SilenceWatch()
        silences = []
        for _ in range(40):  # 4 s: probes 0.2, 0.6, 1.4 and 3 s after it filled
            silences.append(watch.silent_for(sock, time.monotonic()))
            time.sleep(0.1)
    assert max(silences) < 2.0, silences


def _watched(readings: list[float | None], step: float = 1.0) -> list[float]:
    """What a watch says, asked every ``step`` seconds, of a socket whose TCP_INFO reads
    ``readings`` in turn (seconds since the last acknowledgement, or None)."""
    it = iter(readings)
    watch = SilenceWatch(read=lambda sock: next(it))
    return [watch.silent_for(None, n * step) for n in range(len(readings))]  # type: ignore[arg-type]


def test_a_probe_on_its_way_long_after_the_last_acknowledgement_is_not_silence():
    """A reader paused for minutes is probed every 2 minutes: while a probe travels, the
    last acknowledgement is 120 s old, but the peer answers it."""
    assert _watched([None, None, 120.0, None, None, 120.5, None]) == [0, 0, 0, 0, 0, 0, 0]


def test_a_peer_gone_while_data_is_outstanding_is_silent_since_its_last_acknowledgement():
    """Data flowing (outstanding at every look), then the peer gone at the third look."""
    got = _watched([0.01, 0.02, 0.0, 1.0, 2.0, 3.0, 4.0])
    assert got[:3] == [0.0, 0.02, 0.0]
    assert got[3:] == [1.0, 2.0, 3.0, 4.0]


def test_a_peer_gone_while_its_window_is_closed_is_silent_from_the_unanswered_probe():
    """The last acknowledgement 100 s ago (the previous probe's), the next probe never
    answered: the silence counts from when it was first seen outstanding."""
    assert _watched([None, 100.0, 101.0, 102.0, 103.0]) == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_a_unix_socket_has_no_acknowledgements_to_count():
    left, right = socket.socketpair()
    with left, right:
        assert awaiting_acknowledgement(left) is None
