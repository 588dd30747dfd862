"""Service instances are interchangeable: two ``cdcserver run`` processes replicating the same
source give the same stream, so a client given both follows a table across ``kill -9`` of the
instance it reads, again and again, with nothing lost and nothing twice.

The client library is what is tested here (``CdcClient`` with ``host="a:p1,b:p2"``); the
oracle is the table itself: the records received are applied to a dict by key and compared
with ``SELECT``, and their count with what the writer's statements made.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from cdcserver.app.embedded import free_port
from cdcserver.core.names import TableName
from cdcserver.store.naming import version_file
from mariadb_cdc_client import CdcClient, ChangeRecord
from tests.conftest import Source
from tests.helpers import PASSWORD, USER, joined, lines_until, until

pytestmark = pytest.mark.mariadb


class Instance:
    """One ``cdcserver run`` on a fixed port, restartable on it."""

    def __init__(self, base: str, source: Source, users: str, server_id: int) -> None:
        self.port = free_port()
        exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
        self.args = [exe, "run", "--source", source.url, "--data-dir",
                     os.path.join(base, "data"), "--listen", f"127.0.0.1:{self.port}",
                     "--metrics-listen", "", "--users-file", users, "--server-id",
                     str(server_id), "--flush-interval", "0.05", "--start-gtid", "oldest",
                     "--log-level", "info"]
        self.base = base
        self.log = os.path.join(base, "service.log")
        os.makedirs(base, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log,
                                            start_new_session=True)

    def stored(self, database: str, table: str) -> bool:
        """The instance stored the table's first version: a client asking for it before
        would get NO-FILE, which ends a stream (the table is unknown to it yet)."""
        return os.path.exists(os.path.join(self.base, "data", "avro", version_file(
            TableName(database, table), 1, "avro")))

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def _tail(path: str, size: int = 1500) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - size))
        return f.read().decode("utf-8", "replace")


class Writer:
    """Inserts, updates and deletes on ``orders`` in its own thread, counting the records
    they make, until stopped."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.random = random.Random(5)
        self.records = 0
        self.next_id = 1
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = self.source.server.connect(self.source.database)
        rnd = self.random
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    action = rnd.random()
                    if action < 0.6 or self.next_id < 10:
                        cur.execute("INSERT INTO orders VALUES (%s, %s)",
                                    (self.next_id, rnd.randint(1, 1000)))
                        self.next_id += 1
                        self.records += 1
                    elif action < 0.85:
                        self.records += 2 * cur.execute(
                            "UPDATE orders SET amount = amount + 1 WHERE id = %s",
                            (rnd.randrange(1, self.next_id),))
                    else:
                        self.records += cur.execute("DELETE FROM orders WHERE id = %s",
                                                    (rnd.randrange(1, self.next_id),))
                    self.stop.wait(0.002)
        finally:
            conn.close()


async def _two_instances_with_orders(tmp_path: os.PathLike[str], source: Source,
                                     users_file: str, server_ids: tuple[int, int]
                                     ) -> list[Instance]:
    """Two instances started, once each has stored ``orders`` (created here); none left
    running if they do not get there."""
    source.execute(f"CREATE TABLE `{source.database}`.orders (id INT PRIMARY KEY, "
                   "amount INT)")
    instances = [Instance(os.path.join(tmp_path, name), source, users_file, server_id)
                 for name, server_id in zip(("a", "b"), server_ids, strict=True)]
    for instance in instances:
        instance.start()
    try:
        await until(lambda: all(i.stored(source.database, "orders") for i in instances),
                    timeout=60)
    except BaseException:
        for instance in instances:
            instance.kill()
        raise
    return instances


async def test_a_client_follows_two_instances_across_repeated_kill_9(
        tmp_path: os.PathLike[str], source: Source, users_file: str) -> None:
    instances = await _two_instances_with_orders(tmp_path, source, users_file, (6101, 6102))
    writer = Writer(source)
    writer.thread.start()
    received: list[ChangeRecord] = []
    client = CdcClient(",".join(f"127.0.0.1:{i.port}" for i in instances), 0, USER, PASSWORD,
                       retry_delays=(0.1, 0.2, 0.5))

    async def follow() -> None:
        async for event in client.stream(f"{source.database}.orders"):
            if isinstance(event, ChangeRecord):
                received.append(event)

    following = asyncio.create_task(follow())
    try:
        try:
            await until(lambda: len(received) >= 200, timeout=60)
        except TimeoutError as exc:  # say how far each instance got (seen once under load)
            raise AssertionError(f"{len(received)} records in 60 s; " + "; ".join(
                f"{i.port}: exit {i.process.poll() if i.process else None}, log "
                f"{_tail(i.log)!r}" for i in instances)) from exc
        moves = []
        for _ in range(3):  # kill the instance in use; the other takes over; restart it
            in_use = instances[client.endpoints.index]
            moves.append(in_use.port)
            in_use.kill()
            before = len(received)
            await until(lambda b=before: len(received) >= b + 200, timeout=60)
            assert client.endpoints.current[1] != in_use.port
            in_use.start()
            await until(in_use.listening, timeout=30)  # back before the other is killed
        writer.stop.set()
        joined(writer.thread)
        await until(lambda: len(received) >= writer.records, timeout=60)
        await asyncio.sleep(1.0)  # anything more would be a duplicate
    finally:
        writer.stop.set()
        following.cancel()
        for instance in instances:
            instance.kill()
    assert len(set(moves)) == 2  # each instance was killed under the client
    identities = [(r.domain, r.server_id, r.sequence, r.event_number) for r in received]
    assert len(identities) == len(set(identities)), "a record arrived twice"
    assert len(received) == writer.records
    table: dict[int, Any] = {}
    for record in received:
        if record.event_type in ("insert", "update_after"):
            table[record.values["id"]] = record.values["amount"]
        else:
            table.pop(record.values["id"], None)
    rows = dict(source.query(f"SELECT id, amount FROM `{source.database}`.orders"))
    assert table == rows


async def test_two_instances_store_the_same_stream(tmp_path: os.PathLike[str], source: Source,
                                                   users_file: str) -> None:
    """Two instances replicating the same source from the same start send a table's stream
    as the same JSON lines, byte for byte: versions, GTIDs, event numbers, values."""
    from tests.conftest import make_config, start_service

    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(10), d DECIMAL(8,2))",
                   f"INSERT INTO `{db}`.t SELECT seq, CONCAT('v', seq), seq / 7 FROM "
                   f"`{db}`.seq_1_to_500",
                   f"UPDATE `{db}`.t SET v = 'changed' WHERE id % 3 = 0",
                   f"ALTER TABLE `{db}`.t ADD COLUMN extra INT DEFAULT 5",
                   f"DELETE FROM `{db}`.t WHERE id % 5 = 0")
    services = [await start_service(make_config(os.path.join(tmp_path, name), source.url,
                                                users_file)) for name in ("a", "b")]
    try:
        streams = []
        for service in services:
            await service.caught_up(source)
            streams.append(await _raw_lines(service.port, f"{db}.t", source))
        assert len(streams[0]) > 1000 and streams[0] == streams[1]
    finally:
        for service in services:
            await service.stop()


async def _raw_lines(port: int, table: str, source: Source) -> list[bytes]:
    """The table's stream as the server's default dialect writes it, up to what the source
    has logged."""
    return await lines_until(port, f"REQUEST-DATA {table}", source.gtid_state(), dialect=None)


async def test_cdc_given_two_instances_continues_on_the_other_after_kill_9(
        tmp_path: os.PathLike[str], source: Source, users_file: str) -> None:
    """``cdc -h a,b`` prints the JSON stream as the server sends it; when the instance it
    reads is killed it continues on the other after the last record printed: every record
    printed once, the records rebuild the table, the schema line not repeated."""
    import json

    instances = await _two_instances_with_orders(tmp_path, source, users_file, (6201, 6202))
    writer = Writer(source)
    writer.thread.start()
    cdc = os.path.join(os.path.dirname(sys.executable), "cdc")
    command = [cdc, "-h", ",".join(f"127.0.0.1:{i.port}" for i in instances), "-u", USER,
               "-p", PASSWORD, "-t", "4", f"{source.database}.orders"]
    printed: list[bytes] = []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            printed.append(line)

    reading = threading.Thread(target=collect, daemon=True)
    reading.start()
    try:
        await until(lambda: len(printed) >= 200, timeout=60)
        instances[0].kill()
        before = len(printed)
        await until(lambda: len(printed) >= before + 200, timeout=60)
    except BaseException:  # nothing left running for the tests after this one
        process.kill()
        process.wait()
        for instance in instances:
            instance.kill()
        raise
    finally:
        writer.stop.set()
        joined(writer.thread)
    assert process.stdout is not None and process.stderr is not None
    try:
        # every record and the schema printed before `cdc` goes quiet for its 4 s and ends
        # (the instance left may still be catching up with the writer's last rows)
        await until(lambda: len(printed) >= writer.records + 1, timeout=120,
                    what="every record printed")
        await asyncio.to_thread(process.wait, 60)
        reading.join(10)
        errors = process.stderr.read()
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()
        for instance in instances:
            instance.kill()
    assert b"continuing on" in errors, errors
    lines = [json.loads(line) for line in printed]
    schemas = [line for line in lines if "fields" in line]
    records = [line for line in lines if "fields" not in line]
    assert len(schemas) == 1
    identities = [(r["domain"], r["server_id"], r["sequence"], r["event_number"])
                  for r in records]
    assert len(identities) == len(set(identities)) and len(records) == writer.records
    table: dict[int, Any] = {}
    for record in records:
        if record["event_type"] in ("insert", "update_after"):
            table[record["id"]] = record["amount"]
        else:
            table.pop(record["id"], None)
    assert table == dict(source.query(f"SELECT id, amount FROM `{source.database}`.orders"))
