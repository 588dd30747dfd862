"""When the network fails: the service against a MariaDB server in a network namespace of
the test's own, and clients in another, with the link between them broken
(tests/netfault.py): packets lost at random, delayed and reordered, a partition of 5 s
and of 120 s, a half-open connection each way. The test's own statements reach the server
over its Unix socket, which no fault touches, so the source goes on committing
throughout.

What must hold after each fault ends: the service noticed by itself (heartbeats, read
timeouts, keepalive), reconnected from its checkpoint, and the table rebuilt from its JSON
stream over a raw socket (tests/oracle.py, which shares no code with the service) equals
``SELECT`` on the source, every change there once; a client whose host went silent is
dropped and its connection freed.
"""

from __future__ import annotations

import asyncio
import decimal
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cdcserver.app.embedded import EmbeddedMariaDB
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, until
from tests.netfault import Host, slow_missing
from tests.oracle import assert_each_change_once, auth_message, read_stream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DB = "faults"
HEARTBEAT = 1.0  # the service's heartbeat period: silent for 3 of them, a connection is dead
RECOVERY = 45.0  # seconds from a fault's end until the service holds every change again


@pytest.fixture
def source_host() -> Iterator[Host]:
    with Host() as host:
        yield host


class RemoteSource(Source):
    """The service logs in over the link, as a user of its own (root may log in only over
    the Unix socket, which the test's own statements use)."""

    @property
    def url(self) -> str:
        return self.server.url("cdc", "cdc-pw")


@pytest.fixture
def remote_source(source_host: Host, tmp_path) -> Iterator[Source]:
    """A MariaDB server of its own, listening only inside ``source_host``."""
    server = EmbeddedMariaDB(str(tmp_path / "mariadb"), port=3306, host=source_host.address,
                             launcher=source_host.launcher, die_with_parent=True)
    server.start()
    try:
        server.execute("CREATE USER cdc IDENTIFIED BY 'cdc-pw'",
                       "GRANT ALL ON *.* TO cdc",
                       f"CREATE DATABASE {DB}",
                       f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, n INT, body TEXT)")
        yield RemoteSource(server, DB)
    finally:
        server.stop()


async def _service(source: Source, tmp_path, users_file: str, **listener: object
                   ) -> RunningService:
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         source={"heartbeat": HEARTBEAT}, listener=dict(listener))
    running = await start_service(config)
    await running.replicating()
    return running


class Writer:
    """Seeded transactions of inserts, updates and deletes, over the server's Unix socket."""

    def __init__(self, source: Source, seed: int) -> None:
        self.source = source
        self.random = random.Random(seed)
        self.seed = seed
        self.next_id = 1
        self.live: list[int] = []
        self.transactions = 0

    def transaction(self) -> None:
        statements = ["BEGIN"]
        for _ in range(self.random.randint(1, 8)):
            roll = self.random.random()
            if roll < 0.6 or not self.live:
                statements.append(f"INSERT INTO {DB}.t VALUES ({self.next_id}, 0, "
                                  f"'{'x' * self.random.randint(0, 300)}')")
                self.live.append(self.next_id)
                self.next_id += 1
            elif roll < 0.9:
                statements.append(f"UPDATE {DB}.t SET n = n + 1 WHERE id = "
                                  f"{self.random.choice(self.live)}")
            else:
                victim = self.live.pop(self.random.randrange(len(self.live)))
                statements.append(f"DELETE FROM {DB}.t WHERE id = {victim}")
        statements.append("COMMIT")
        self.source.execute(*statements)
        self.transactions += 1

    async def for_seconds(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.transaction)
            await asyncio.sleep(0.02)


async def _assert_whole(running: RunningService, source: Source, writer: Writer) -> None:
    conn = source.server.connect()
    try:
        await assert_each_change_once(running.port, conn, DB, "t", user=USER,
                                      password=PASSWORD, label=f"seed {writer.seed}: ")
    finally:
        conn.close()


async def _recovered(running: RunningService, source: Source) -> float:
    """Seconds until the service holds everything the source logged."""
    healed = time.monotonic()
    await running.caught_up(source, timeout=RECOVERY)
    return time.monotonic() - healed


def _reconnects(running: RunningService) -> int:
    return running.service.replication.runner.stats().reconnects


async def test_a_lossy_link_to_the_source_loses_and_doubles_nothing(
        source_host: Host, remote_source: Source, tmp_path, users_file: str):
    running = await _service(remote_source, tmp_path, users_file)
    writer = Writer(remote_source, seed=551)
    try:
        await writer.for_seconds(1)
        source_host.lossy(25)
        await writer.for_seconds(8)
        source_host.heal()
        await _recovered(running, remote_source)
        await _assert_whole(running, remote_source, writer)
    finally:
        await running.stop()


async def test_a_slow_reordering_link_to_the_source_loses_and_doubles_nothing(
        source_host: Host, remote_source: Source, tmp_path, users_file: str):
    """Every packet between the service and the source held 20-180 ms, and a quarter let
    through at once, overtaking those held: a slow link is not a dead one, so the service
    keeps up while it lasts, and the stream holds every change once."""
    if slow_missing() is not None:
        pytest.skip(slow_missing())
    running = await _service(remote_source, tmp_path, users_file)
    writer = Writer(remote_source, seed=556)
    try:
        await writer.for_seconds(1)
        source_host.slow(100, jitter_ms=80, reorder=25, seed=556)
        await writer.for_seconds(8)
        await running.caught_up(remote_source, timeout=RECOVERY)  # still slow
        source_host.heal()
        assert source_host.slowed.overtaken > 0, source_host.slowed  # it did reorder
        await _assert_whole(running, remote_source, writer)
    finally:
        await running.stop()


@pytest.mark.parametrize("seconds", [5, 120])
async def test_a_partition_from_the_source_is_noticed_and_healed_by_itself(
        source_host: Host, remote_source: Source, tmp_path, users_file: str, seconds: int):
    running = await _service(remote_source, tmp_path, users_file)
    writer = Writer(remote_source, seed=552 + seconds)
    try:
        await writer.for_seconds(1)
        await running.caught_up(remote_source)
        stored = len(await read_stream(running.port, f"{DB}.t", user=USER, password=PASSWORD))
        before = _reconnects(running)
        source_host.partition()
        await writer.for_seconds(min(seconds, 4 * HEARTBEAT + 2))
        deadline = time.monotonic() + 10 * HEARTBEAT
        while running.service.replication.runner.stats().connected:
            assert time.monotonic() < deadline, "a dead source connection went unnoticed"
            await asyncio.sleep(0.1)
        # while cut off: what was stored is served
        served = await read_stream(running.port, f"{DB}.t", user=USER, password=PASSWORD)
        assert len(served) == stored
        await asyncio.sleep(max(0.0, seconds - (4 * HEARTBEAT + 2) - 10))
        await writer.for_seconds(min(10.0, seconds))
        source_host.heal()
        took = await _recovered(running, remote_source)
        assert _reconnects(running) > before
        print(f"partition of {seconds} s: caught up {took:.1f} s after it ended")
        await _assert_whole(running, remote_source, writer)
    finally:
        await running.stop()


@pytest.mark.parametrize("inbound", [False, True], ids=["source-silent", "service-silent"])
async def test_a_half_open_source_connection_is_noticed_and_healed_by_itself(
        source_host: Host, remote_source: Source, tmp_path, users_file: str, inbound: bool):
    running = await _service(remote_source, tmp_path, users_file)
    writer = Writer(remote_source, seed=553 + inbound)
    try:
        await writer.for_seconds(1)
        before = _reconnects(running)
        source_host.half_open(inbound=inbound)
        await writer.for_seconds(6 * HEARTBEAT)
        source_host.heal()
        await writer.for_seconds(1)
        await _recovered(running, remote_source)
        assert _reconnects(running) > before
        await _assert_whole(running, remote_source, writer)
    finally:
        await running.stop()


TAILING_CLIENT = r"""
import hashlib, socket, sys
host, port, table, user, password = sys.argv[1:]
sock = socket.create_connection((host, int(port)))
digest = hashlib.sha1(password.encode()).hexdigest()
sock.sendall(((user + ":").encode().hex() + digest).encode())
reader = sock.makefile("rb")
assert reader.readline() == b"OK\n"
sock.sendall(b"REGISTER UUID=silent, TYPE=JSON\n")
assert reader.readline() == b"OK\n"
sock.sendall(f"REQUEST-DATA {table}\n".encode())
print("tailing", flush=True)
for line in reader:
    pass
"""


@pytest.mark.parametrize("traffic", ["idle", "changes"])
async def test_a_client_whose_host_goes_silent_is_dropped(
        remote_source: Source, tmp_path, users_file: str, traffic: str):
    with Host() as client_host:
        running = await _service(remote_source, tmp_path, users_file,
                                 listen=f"{client_host.gateway}:0", dead_client_timeout=3.0)
        writer = Writer(remote_source, seed=554)
        client = subprocess.Popen(
            client_host.command([sys.executable, "-c", TAILING_CLIENT, client_host.gateway,
                                 str(running.port), f"{DB}.t", USER, PASSWORD]),
            stdout=subprocess.PIPE, text=True)
        try:
            await writer.for_seconds(0.5)
            assert client.stdout is not None
            assert await asyncio.to_thread(client.stdout.readline) == "tailing\n"
            server = running.service.listener.server
            assert server.connections == 1
            client_host.partition()
            silent = time.monotonic()
            if traffic == "changes":
                await writer.for_seconds(2)
            while server.connections:
                assert time.monotonic() - silent < 30, \
                    f"a client silent for 30 s still holds its connection ({traffic})"
                await asyncio.sleep(0.2)
            print(f"{traffic}: dropped {time.monotonic() - silent:.1f} s after it went silent")
            assert client.poll() is None  # the client itself is alive, only cut off
        finally:
            await _ended(client, running)


async def _ended(client: subprocess.Popen[str], running: RunningService) -> None:
    """A client process in a Host killed, its pipe closed, and the service stopped."""
    client.kill()
    client.wait()
    assert client.stdout is not None
    client.stdout.close()
    await running.stop()


def test_hosts_are_removed_when_the_test_ends():
    with Host() as made:
        name = made.name
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert name not in listed.split(), f"{name} left behind"
    assert os.path.exists(f"/proc/{os.getpid()}")


ECHOING_CLIENT = TAILING_CLIENT.replace("REGISTER UUID=silent, TYPE=JSON",
                                        "REGISTER UUID=slow, TYPE=JSON, DIALECT=EXACT").replace(
    "for line in reader:\n    pass", "for line in reader:\n    sys.stdout.write(line.decode())\n"
    "    sys.stdout.flush()")


async def test_a_client_behind_a_slow_reordering_link_is_served_every_change(
        remote_source: Source, tmp_path, users_file: str):
    """The client's packets, both ways, held 50-350 ms and a quarter let through at once,
    out of order: a slow client is not a dead one (it keeps its connection, well inside the
    dead-client timeout), and it receives the same lines, in the same order, as a client on
    a clean link."""
    if slow_missing() is not None:
        pytest.skip(slow_missing())
    with Host() as client_host:
        running = await _service(remote_source, tmp_path, users_file,
                                 listen=f"{client_host.gateway}:0", dead_client_timeout=3.0)
        writer = Writer(remote_source, seed=557)
        client_host.slow(200, jitter_ms=150, reorder=25, seed=557)
        client = subprocess.Popen(
            client_host.command([sys.executable, "-c", ECHOING_CLIENT, client_host.gateway,
                                 str(running.port), f"{DB}.t", USER, PASSWORD]),
            stdout=subprocess.PIPE, text=True)
        received: list[dict[str, object]] = []
        try:
            assert client.stdout is not None
            assert await asyncio.to_thread(client.stdout.readline) == "tailing\n"
            reading = asyncio.create_task(asyncio.to_thread(_lines, client.stdout, received))
            await writer.for_seconds(8)
            await running.caught_up(remote_source, timeout=RECOVERY)
            clean = await read_stream(running.port, f"{DB}.t", user=USER, password=PASSWORD,
                                      host=client_host.gateway)
            assert len(clean) > writer.transactions  # (a schema line, then the changes)
            deadline = time.monotonic() + 60
            while len(received) < len(clean) and not reading.done():
                assert time.monotonic() < deadline, f"{len(received)} of {len(clean)} lines"
                await asyncio.sleep(0.1)
            assert received == clean, f"{len(received)} of {len(clean)} lines"
            assert client.poll() is None and not reading.done()  # still connected, and
            # the only one once the clean reader's connection is let go (the listener may
            # not have seen that one end yet: ci19, on a loaded machine)
            server = running.service.listener.server
            await until(lambda: server.connections == 1, timeout=30,
                        what="the slow client the only connection")
            client_host.heal()
            assert client_host.slowed.overtaken > 0, client_host.slowed  # it did reorder
        finally:
            await _ended(client, running)


def _lines(stream: Any, into: list[dict[str, object]]) -> None:
    """Each JSON line of ``stream`` parsed into ``into``, until it ends."""
    for line in stream:
        into.append(json.loads(line, parse_float=decimal.Decimal))


async def test_a_client_that_stops_reading_is_not_taken_for_dead(
        remote_source: Source, tmp_path, users_file: str):
    """A client alive but not reading (applying a large batch, paused in a debugger) for
    three times the dead-client timeout, while changes are written: its host acknowledges
    the window probes, so it keeps its connection, and then reads every line a fresh client
    reads. (Linux's TCP_USER_TIMEOUT ended such a connection after the timeout: the
    listener now asks the socket what is unacknowledged instead.)"""
    running = await _service(remote_source, tmp_path, users_file, dead_client_timeout=3.0)
    writer = Writer(remote_source, seed=558)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a zero window soon
    sock.settimeout(60)  # (the service runs in this loop: each read in a thread)
    try:
        await asyncio.to_thread(sock.connect, ("127.0.0.1", running.port))
        sock.sendall(auth_message(USER, PASSWORD))
        reader = sock.makefile("rb")
        assert await asyncio.to_thread(reader.readline) == b"OK\n"
        sock.sendall(b"REGISTER UUID=paused, TYPE=JSON, DIALECT=EXACT\n")
        assert await asyncio.to_thread(reader.readline) == b"OK\n"
        await asyncio.to_thread(writer.transaction)  # the table's first file stored
        await running.caught_up(remote_source, timeout=RECOVERY)
        sock.sendall(f"REQUEST-DATA {DB}.t\n".encode())
        await writer.for_seconds(9)  # not reading meanwhile
        await running.caught_up(remote_source, timeout=RECOVERY)
        assert running.service.listener.server.connections == 1, "the paused client was cut"
        clean = await read_stream(running.port, f"{DB}.t", user=USER, password=PASSWORD)
        received = [json.loads(await asyncio.to_thread(reader.readline),
                               parse_float=decimal.Decimal) for _ in clean]
        assert received == clean
    finally:
        sock.close()
        await running.stop()
