"""Descriptors and connections from the environment (issue 35, item 4 and 5).

At the shell's default ``ulimit -n 1024``, 1,100 idle unauthenticated connections and a
``CREATE TABLE`` used to crash the replication thread with EMFILE, and the process exited
(``max_connections`` was 2048, so it never applied first); 64 idle connections to the metrics
port made ``/live``, ``/ready`` and ``/health`` close without answering. The service now
takes its budgets from the limit it runs with (``cdcserver/app/descriptors.py``), refuses
connections past them with ``ERR TOO-MANY-CONNECTIONS``, caps the connections of one address
that have not logged in, and the monitoring endpoint answers whatever waits on it.

A connection costs one descriptor (issue 40, item 2): every stream of a table shares one open
descriptor of its version file (``cdcserver/store/inuse.py``), and the stored files clients
read have a budget of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator

import pytest

from cdcserver.app.descriptors import RESERVED, budgets
from cdcserver.core.config import Config, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.store.inuse import FILES, delete_unless_in_use
from cdcserver.store.naming import version_file
from tests.conftest import RunningService, Source
from tests.hardening import raise_fd_limit
from tests.helpers import (
    PASSWORD,
    USER,
    RawClient,
    eventually,
    read_descriptors_of,
    until,
    write_secret,
)
from tests.oracle import assert_stream_equals_table

LISTENING = re.compile(r"cdcserver\.protocol\.server: listening on [\d.]+:(\d+)")
MONITORING = re.compile(r"metrics and health on http://[\d.]+:(\d+)/metrics")


@pytest.mark.parametrize("limit", [64, 200, 400, 1024, 20000, 1 << 20])
def test_the_budgets_fit_the_limit_and_keep_room_for_the_rest(limit: int):
    shares = budgets(Config(), limit)
    used = shares.table_files + shares.connections + shares.stored_files + \
        3 * shares.dump_readers
    assert min(shares.table_files, shares.connections, shares.dump_readers,
               shares.stored_files) >= 1
    assert shares.stored_files <= shares.connections
    if limit >= RESERVED + 64:  # (below it every budget is 1: the service still starts)
        assert used + RESERVED <= limit
    if limit >= 20000:  # room for what is configured: the configuration decides
        assert (shares.table_files, shares.connections) == (256, 2048)
    if limit in (400, 1024):  # one descriptor a connection: they take all the rest
        assert used + RESERVED == limit


def test_ten_thousand_connections_fit_a_hard_limit_of_20000():
    config = Config()
    config = dataclasses.replace(config, listener=dataclasses.replace(
        config.listener, max_connections=10064))
    shares = budgets(config, 20000)
    assert shares.connections == 10064 and shares.stored_files == 4878


class ServiceProcess:
    """``cdcserver run`` in a process of its own, under a file descriptor limit."""

    def __init__(self, tmp_path: os.PathLike[str], source: Source, users_file: str,
                 limit: int, *extra: str) -> None:
        self.log_path = os.path.join(tmp_path, "service.log")
        exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")

        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [exe, "run", "--source", source.url, "--data-dir",
                 os.path.join(tmp_path, "data"), "--listen", "127.0.0.1:0",
                 "--metrics-listen", "127.0.0.1:0", "--users-file", users_file,
                 "--server-id", "6401", "--start-gtid", "oldest", "--log-level", "info",
                 *extra],
                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=limited)
        self.port = self.metrics_port = 0

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    async def started(self) -> None:
        def ports() -> tuple[int, int] | None:
            text = self.log()
            assert self.process.poll() is None, text
            listening, monitoring = LISTENING.search(text), MONITORING.search(text)
            if listening is None or monitoring is None:
                return None
            return int(listening[1]), int(monitoring[1])

        found = await eventually(lambda: asyncio.to_thread(ports), bool, 60, "the service")
        assert found is not None
        self.port, self.metrics_port = found

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@contextlib.asynccontextmanager
async def service(tmp_path: os.PathLike[str], source: Source, users_file: str, limit: int,
                  *extra: str) -> AsyncIterator[ServiceProcess]:
    running = ServiceProcess(tmp_path, source, users_file, limit, *extra)
    try:
        await running.started()
        yield running
    finally:
        assert running.stop() == 0, running.log()[-3000:]


async def _open_idle(port: int, addresses: list[str], each: int
                     ) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``each`` idle connections from every address (127.0.0.x is all this machine)."""
    opened = []
    for address in addresses:
        for _ in range(each):
            opened.append(await asyncio.open_connection("127.0.0.1", port,
                                                        local_addr=(address, 0)))
    return opened


async def _refused(connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
                   ) -> list[bytes]:
    """The lines of the connections the server refused as they came (and closed), read
    for 4 s after the last one opened: a connection is open once the kernel has it, before
    the service accepted it. One served, left to the authentication timeout, is not."""
    async def first_line(reader: asyncio.StreamReader) -> bytes:
        try:
            return await asyncio.wait_for(reader.readline(), 4.0)
        except TimeoutError:
            return b""
    lines = await asyncio.gather(*(first_line(r) for r, _ in connections))
    return [line for line in lines if line and not line.startswith(b"ERR TIMEOUT")]


def _close_all(connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in connections:
        writer.close()


@pytest.mark.mariadb
async def test_a_flood_of_idle_connections_stops_no_table(tmp_path, source: Source,
                                                          users_file: str):
    db = source.database
    async with service(tmp_path, source, users_file, limit=1024) as running:
        assert "file descriptors: limit 1024:" in running.log()
        # 1,200 connections from 40 addresses, 30 each (under the per-address cap of 32)
        flood = await _open_idle(running.port, [f"127.0.0.{i}" for i in range(2, 42)], 30)
        try:
            refused = await _refused(flood)
            assert refused, "the budget refused none of 1,200 connections"
            assert {line.split(b" ")[1] for line in refused} == {b"TOO-MANY-CONNECTIONS"}
            served = len(flood) - len(refused)
            assert served < 1024 // 2, served
            # replication goes on: a new table, its rows (the thread needs descriptors)
            source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(10))",
                           f"INSERT INTO `{db}`.t VALUES (1, 'a'), (2, 'b')",
                           f"UPDATE `{db}`.t SET v = 'c' WHERE id = 2")
            # a client beyond the budget is told so at once, not left hanging
            extra = await RawClient.connect(running.port)
            assert (await extra.line()).startswith(b"ERR TOO-MANY-CONNECTIONS")
            await extra.close()
        finally:
            _close_all(flood)
        assert running.process.poll() is None, running.log()[-3000:]
        conn = source.server.connect()
        try:
            async def equal() -> bool:
                with contextlib.suppress(AssertionError, ConnectionError):
                    await assert_stream_equals_table(running.port, conn, db, "t", user=USER,
                                                     password=PASSWORD, quiet=0.5)
                    return True
                return False

            await eventually(equal, bool, 60, "the table's stream once the flood is gone")
        finally:
            conn.close()
        assert "Too many open files" not in running.log()


@pytest.mark.mariadb
async def test_one_address_cannot_hold_every_login_slot(tmp_path, source: Source,
                                                        users_file: str):
    # A limit of 400 leaves 95 connections; past half of them in use, one address may hold
    # 32 that have not logged in.
    async with service(tmp_path, source, users_file, limit=400) as running:
        assert "95 client connections" in running.log()
        others = await _open_idle(running.port, [f"127.0.0.{i}" for i in range(3, 8)], 8)
        mine = await _open_idle(running.port, ["127.0.0.2"], 33)
        try:
            assert await _refused(others) == []
            refused = await _refused(mine)
            assert refused == [b"ERR TOO-MANY-CONNECTIONS 32 connections from 127.0.0.2 have "
                               b"not logged in yet\n"]
            # another address logs in at once, and a logged-in client frees its slot
            other = await RawClient.connect(running.port, host="127.0.0.1")
            await other.login()
            await other.close()
        finally:
            _close_all(mine + others)


def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.mariadb
async def test_probes_answer_whatever_waits_on_the_monitoring_port(tmp_path, source: Source,
                                                                   users_file: str):
    async with service(tmp_path, source, users_file, limit=4096) as running:
        idle = await _open_idle(running.metrics_port, ["127.0.0.1"], 200)
        try:
            for path in ("/live", "/ready", "/health"):
                status, document = await asyncio.to_thread(_get, running.metrics_port, path)
                assert status in (200, 503) and document, (path, status)
            status, _ = await asyncio.to_thread(_get, running.metrics_port, "/live")
            assert status == 200
        finally:
            _close_all(idle)




ADMIN = re.compile(r"admin API and console on http://[\d.]+:(\d+)/console/")


@pytest.mark.mariadb
async def test_more_idle_sockets_than_descriptors_on_every_port_stop_nothing(
        tmp_path, source: Source, users_file: str):
    """Issue 49: 1,000 idle connections to the admin port, which had no bound, took the
    replication thread's last descriptor at ``ulimit -n 1024`` and the process exited. Here
    1,200 to each of the three ports (3,600 against a limit of 1,024): every listener
    holds what its budget allows and closes the rest at once; a DDL and rows replicate, and
    each port still answers (the probe and the API over the idle connections of their own
    address, which they close to make room)."""
    raise_fd_limit(8000)
    db = source.database
    token = write_secret(tmp_path / "admin.token", "an-admin-token-0123456789abcdef")
    async with service(tmp_path, source, users_file, 1024, "--admin-listen", "127.0.0.1:0",
                       "--admin-token-file", token) as running:
        found = await eventually(lambda: asyncio.to_thread(ADMIN.search, running.log()),
                                 bool, 60, "the admin listener")
        assert found is not None
        admin_port = int(found[1])
        addresses = [f"127.0.0.{i}" for i in range(2, 42)]
        floods = []
        try:
            for port in (running.port, running.metrics_port, admin_port):
                floods += await _open_idle(port, addresses, 30)
            source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(10))",
                           f"INSERT INTO `{db}`.t VALUES (1, 'a'), (2, 'b')")
            status, _ = await asyncio.to_thread(_get, running.metrics_port, "/live")
            assert status == 200
            request = urllib.request.Request(
                f"http://127.0.0.1:{admin_port}/api/v1/replication",
                headers={"Authorization": "Bearer an-admin-token-0123456789abcdef"})
            with await asyncio.to_thread(urllib.request.urlopen, request, timeout=10) as r:
                assert r.status == 200 and "state" in json.loads(r.read())
            held = len(os.listdir(f"/proc/{running.process.pid}/fd"))
            assert held < 1024, held
        finally:
            _close_all(floods)
        assert running.process.poll() is None, running.log()[-3000:]
        conn = source.server.connect()
        try:
            async def equal() -> bool:
                with contextlib.suppress(AssertionError, ConnectionError):
                    await assert_stream_equals_table(running.port, conn, db, "t", user=USER,
                                                     password=PASSWORD, quiet=0.5)
                    return True
                return False

            await eventually(equal, bool, 60, "the table's stream once the floods are gone")
        finally:
            conn.close()
    assert "Too many open files" not in running.log()


# -- one descriptor a connection ---------------------------------------------------------------


class _Deletable(Exception):
    """The cleaner got as far as deleting: it held the exclusive lock."""


def _cleaner_could_delete(path: str) -> bool:
    """Whether retention's cleaner would delete ``path`` now: whether it gets the exclusive
    lock (it is stopped just before the unlink: the service still writes the file)."""
    def stop() -> None:
        raise _Deletable

    try:
        return delete_unless_in_use(path, stop)  # False: in use
    except _Deletable:
        return True


async def _tailing(port: int, table: str, fmt: str = "JSON") -> RawClient:
    client = await RawClient.connect(port)
    await client.login(fmt)
    await client.send(f"REQUEST-DATA {table}".encode())
    return client


async def _at_row_one(client: RawClient) -> None:
    await client.json_line()  # the schema
    assert (await client.json_line())["id"] == 1


@pytest.mark.mariadb
async def test_streams_of_a_table_share_one_descriptor_of_its_version_file(
        cdc: RunningService, source: Source):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{db}`.b (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.a VALUES (1)", f"INSERT INTO `{db}`.b VALUES (1)")
    await cdc.caught_up(source)
    a, b = (cdc.service.data.catalog.get(TableName(db, t)) for t in "ab")
    assert a is not None and b is not None
    a_file, b_file = a.latest(), b.latest()
    assert a_file is not None and b_file is not None
    json_a = [await _tailing(cdc.port, f"{db}.a") for _ in range(30)]
    avro_a = [await _tailing(cdc.port, f"{db}.a", "AVRO") for _ in range(5)]
    json_b = [await _tailing(cdc.port, f"{db}.b") for _ in range(10)]
    for client in json_a + json_b:
        await _at_row_one(client)
    with open(a_file.path, "rb") as f:
        stored = f.read()
    for client in avro_a:  # sendfile and pread from the shared descriptor: the file as is
        assert await client.read_exactly(len(stored)) == stored
    assert len(read_descriptors_of(a_file.path)) == 1
    assert len(read_descriptors_of(b_file.path)) == 1
    assert not _cleaner_could_delete(a_file.path)

    # A third leave mid-stream, with CLOSE or by hanging up: the rest go on, on one file.
    for client in json_a[:5]:
        await client.send(b"CLOSE\n")
    for client in json_a[5:10]:
        client.writer.transport.abort()
    source.execute(f"INSERT INTO `{db}`.a VALUES (2)")
    for client in json_a[10:]:
        assert (await client.json_line())["id"] == 2
    await cdc.caught_up(source)
    with open(a_file.path, "rb") as f:
        added = f.read()[len(stored):]
    for client in avro_a:
        assert await client.read_exactly(len(added)) == added
    assert len(read_descriptors_of(a_file.path)) == 1
    assert not _cleaner_could_delete(a_file.path)

    for client in json_a + avro_a:  # the last reader of a leaves: the cleaner may delete it
        await client.close()
    await until(lambda: not read_descriptors_of(a_file.path), 10, "a's file closed")
    assert _cleaner_could_delete(a_file.path)
    assert len(read_descriptors_of(b_file.path)) == 1 and not _cleaner_could_delete(b_file.path)
    for client in json_b:
        await client.close()
    await until(lambda: not read_descriptors_of(b_file.path), 10, "b's file closed")
    assert _cleaner_could_delete(b_file.path)


@pytest.mark.mariadb
async def test_a_reader_past_the_stored_files_budget_is_refused_retriably(
        cdc: RunningService, source: Source, monkeypatch: pytest.MonkeyPatch):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{db}`.b (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.a VALUES (1)", f"INSERT INTO `{db}`.b VALUES (1)")
    await cdc.caught_up(source)
    results = await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                                      cdc.service.config.store.data_dir, [TableName(db, "b")],
                                      DumpOptions())
    dump = results[0].info
    idle = FILES.open
    monkeypatch.setattr(FILES, "limit", idle + 1)  # room for one file
    readers = [await _tailing(cdc.port, f"{db}.a") for _ in range(3)]
    for client in readers:  # one file, however many streams read it
        await _at_row_one(client)
    refused = await _tailing(cdc.port, f"{db}.b")
    line = await refused.line()
    assert line.startswith(b"ERR TOO-MANY-CONNECTIONS ") and b"stored files" in line, line
    assert await refused.closed() == b""
    asking = await RawClient.connect(cdc.port)  # a dump's descriptor counts too
    await asking.login()
    await asking.send(f"REQUEST-DUMP {dump.name}\n".encode())
    assert (await asking.line()).startswith(b"ERR TOO-MANY-CONNECTIONS ")
    await asking.close()

    for client in readers:
        await client.close()
    await until(lambda: FILES.open == idle, 10, "the streams' file closed")
    admitted = await _tailing(cdc.port, f"{db}.b")
    await _at_row_one(admitted)
    await admitted.close()
    await until(lambda: FILES.open == idle, 10, "b's file closed")
    asking = await RawClient.connect(cdc.port)
    await asking.login()
    await asking.send(f"REQUEST-DUMP {dump.name}\n".encode())
    assert (await asking.line()).startswith(f"OK {dump.size} ".encode())
    await asking.close()


async def _streaming(port: int, table: str) -> RawClient:
    """A client at row 1 of ``table``'s stream, once the service has the table."""
    async def attempt() -> RawClient | None:
        client = await _tailing(port, table)
        line = await client.line()
        if line.startswith(b"ERR NO-FILE"):  # not replicated yet
            await client.close()
            return None
        assert (await client.json_line())["id"] == 1, line
        return client

    found = await eventually(attempt, lambda client: client is not None, 60, f"{table}")
    assert found is not None
    return found


@pytest.mark.mariadb
async def test_every_connection_the_budget_admits_streams_on_one_descriptor(
        tmp_path, source: Source, users_file: str):
    # At a limit of 464, 131 connections (87 when each stream held its version file open);
    # 224 are the rest's, the HTTP listeners' 128 among them
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.t VALUES (1)")
    async with service(tmp_path, source, users_file, limit=464) as running:
        assert "131 client connections, 43 stored files read by clients" in running.log()
        pid = running.process.pid
        first = await _streaming(running.port, f"{db}.t")
        before = len(os.listdir(f"/proc/{pid}/fd"))
        clients = [first] + [await _streaming(running.port, f"{db}.t") for _ in range(130)]
        grown = len(os.listdir(f"/proc/{pid}/fd")) - before
        assert grown <= 130 + 2, grown  # a socket each (and what a thread opens a moment)
        version = os.path.join(tmp_path, "data", "avro", version_file(TableName(db, "t"), 1,
                                                                      "avro"))
        assert len(read_descriptors_of(version, pid)) == 1
        extra = await RawClient.connect(running.port)
        assert (await extra.line()).startswith(b"ERR TOO-MANY-CONNECTIONS")
        await extra.close()
        source.execute(f"INSERT INTO `{db}`.t VALUES (2)")
        for client in clients:
            assert (await client.json_line(timeout=30))["id"] == 2
        for client in clients:
            await client.close()
    assert "Too many open files" not in running.log()
