"""Dead-peer detection on every TCP connection the project opens: the listener's accepted
sockets, the client library's and the source connections' (the behaviour itself, a peer gone
silent and dropped, is tests/integration/test_network_faults.py's)."""

from __future__ import annotations

import socket

import pytest

from mariadb_cdc_client.format.keepalive import KEEPALIVE_PROBES, end_silent_peers


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
