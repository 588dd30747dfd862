"""Crash safety: kill -9 at random instants under load, a restarted MariaDB, a dropped network.

After each ordeal ``verify`` compares every table with the state replayed from its stream:
nothing may be missing, extra, different or duplicated.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import fastavro
import pymysql
import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import Report, verify_table
from tests.conftest import Source, make_config, start_service
from tests.helpers import TcpProxy

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

TABLES = ("orders", "line_items", "audit")
KILLS = 20


class Load:
    """Writes to the source from a thread until stopped: single-row and multi-row
    transactions, updates, deletes, transactions over several tables, a big one now and
    then, and one schema change."""

    def __init__(self, source: Source, seed: int, big: int = 3000, pause: float = 0.0) -> None:
        self.source = source
        self.big = big  # rows of the occasional big transaction
        self.pause = pause  # between transactions
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.next_id = 1

    def create(self) -> None:
        db = f"`{self.source.database}`"
        self.source.execute(
            f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, customer VARCHAR(40), "
            "amount DECIMAL(12,2), placed DATETIME(6), note TEXT)",
            f"CREATE TABLE {db}.line_items (id INT PRIMARY KEY, order_id INT, qty INT, "
            "price DOUBLE)",
            f"CREATE TABLE {db}.audit (id BIGINT AUTO_INCREMENT PRIMARY KEY, what VARCHAR(100))")

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            conn = self.source.server.connect(self.source.database)
            conn.autocommit(False)
            with conn.cursor() as cur:
                while not self.stop.wait(self.pause):
                    self._transaction(cur)
                    conn.commit()
                    self.transactions += 1
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def _transaction(self, cur: pymysql.cursors.Cursor) -> None:
        r = self.random
        choice = r.random()
        if choice < 0.02:  # a big transaction
            rows = [(self._id(), f"bulk-{i}", r.randint(1, 10**6) / 100) for i in range(self.big)]
            cur.executemany("INSERT INTO orders (id, customer, amount) VALUES (%s, %s, %s)",
                            rows)
        elif choice < 0.45:
            order = self._id()
            cur.execute("INSERT INTO orders (id, customer, amount, placed, note) "
                        "VALUES (%s, %s, %s, NOW(6), %s)",
                        (order, f"c{r.randint(1, 99)}", r.randint(1, 10**6) / 100,
                         "x" * r.randint(0, 300)))
            cur.executemany("INSERT INTO line_items VALUES (%s, %s, %s, %s)",
                            [(self._id(), order, r.randint(1, 9), r.random() * 100)
                             for _ in range(r.randint(1, 5))])
            cur.execute("INSERT INTO audit (what) VALUES (%s)", (f"order {order}",))
        elif choice < 0.75:
            cur.execute("UPDATE orders SET amount = amount + 1, note = CONCAT(COALESCE(note, "
                        "''), 'u') WHERE id %% 7 = %s LIMIT 20", (r.randint(0, 6),))
        elif choice < 0.85:
            cur.execute("DELETE FROM line_items WHERE id %% 11 = %s LIMIT 5", (r.randint(0, 10),))
        else:
            # at most 50 rows, as the other updates: an unbounded one touched a fifth of a
            # table that only grows, so the records to verify grew with the square of the
            # test's duration (2 million of them in 85 s, more on a slower machine)
            cur.execute("UPDATE line_items SET qty = qty + 1 WHERE order_id %% 5 = %s "
                        "LIMIT 50", (r.randint(0, 4),))

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def alter(self) -> None:
        self.source.execute(f"ALTER TABLE `{self.source.database}`.orders "
                            "ADD COLUMN priority TINYINT NOT NULL DEFAULT 0")


@dataclass
class ServiceProcess:
    args: list[str]
    log: str  # the service's stderr, across every start
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def _service_args(data_dir: str, source: Source, users: str) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    return [exe, "run", "--source", source.url, "--data-dir", data_dir, "--listen",
            "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--users-file", users,
            "--server-id", "6001", "--flush-interval", "0.05", "--start-gtid", "oldest",
            "--log-level", "warning"]


def _verify_all(source: Source, data_dir: str) -> list[Report]:
    return [verify_table(parse_source_url(source.url), data_dir,
                         TableName(source.database, t), timeout=120) for t in TABLES]


def _assert_exact(reports: list[Report]) -> None:
    for report in reports:
        assert report.ok and report.duplicates == 0, "\n".join(report.lines())
        assert report.source_rows > 0


def _assert_readable(data_dir: str) -> None:
    """Every file is a valid Avro container after the repairs."""
    avro_dir = os.path.join(data_dir, "avro")
    for name in os.listdir(avro_dir):
        if name.endswith(".avro"):
            with open(os.path.join(avro_dir, name), "rb") as f:
                for _ in fastavro.reader(f):
                    pass


async def test_kill_9_at_random_instants_loses_and_duplicates_nothing(tmp_path, source: Source,
                                                                      users_file: str):
    data_dir = str(tmp_path / "data")
    # paced: the kill instants are the service's, and the work to verify then grows with
    # the test's duration, not with how fast this machine's other workers leave MariaDB
    load = Load(source, seed=20261121, pause=0.01)
    load.create()
    load.start()
    service = ServiceProcess(_service_args(data_dir, source, users_file),
                             str(tmp_path / "service.log"))
    chance = random.Random(7)
    pause = threading.Event()  # never set: a timer for the random kill instants
    try:
        for kill in range(KILLS):
            service.start()
            # A random instant: while starting, recovering, catching up or tailing.
            await asyncio.to_thread(pause.wait, chance.uniform(0.05, 1.2))
            service.kill()
            if kill == KILLS // 2:
                load.alter()
    finally:
        load.finish()
    assert load.transactions > 100
    service.start()
    try:
        reports = await asyncio.to_thread(_verify_all, source, data_dir)
    finally:
        assert service.terminate() == 0
    _assert_exact(reports)
    _assert_readable(data_dir)
    records = sum(r.records for r in reports)
    print(f"\ncrash test: {KILLS} kills -9 during {load.transactions} transactions; "
          f"{records} records verified against {sum(r.source_rows for r in reports)} rows: "
          f"lost {sum(len(r.missing) + len(r.different) for r in reports)}, "
          f"duplicated {sum(r.duplicates for r in reports)}")


@pytest.fixture
def restartable(source: Source) -> Iterator[Source]:
    yield source
    if source.server.process is None:  # a test stopped it: leave it running for the next
        source.server.start()


async def test_mariadb_restarted_under_the_service(tmp_path, restartable: Source,
                                                   users_file: str):
    source = restartable
    load = Load(source, seed=2)
    load.create()
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file))
    try:
        load.start()
        await asyncio.to_thread(threading.Event().wait, 1.0)  # load before the restart
        load.finish()
        await asyncio.to_thread(source.server.stop)  # SIGTERM: a clean server restart
        await asyncio.to_thread(source.server.start)
        load = Load(source, seed=3)
        load.next_id = 10**7
        load.start()
        await asyncio.to_thread(threading.Event().wait, 1.0)
        load.finish()
        await running.caught_up(source, timeout=120)
        assert running.service.replication.runner.replicator is not None
        assert running.service.replication.runner.replicator.reconnects >= 1
        reports = await asyncio.to_thread(_verify_all, source,
                                          running.service.config.store.data_dir)
    finally:
        await running.stop()
    _assert_exact(reports)


async def test_network_drops_are_survived(tmp_path, source: Source, users_file: str):
    proxy = TcpProxy("127.0.0.1", source.server.port or 0)
    await proxy.start()
    url = f"mysql://root@127.0.0.1:{proxy.port}"
    load = Load(source, seed=4)
    load.create()
    running = await start_service(make_config(str(tmp_path / "data"), url, users_file))
    try:
        load.start()
        for _ in range(3):
            await asyncio.to_thread(threading.Event().wait, 0.7)
            proxy.cut()  # every connection through the proxy is reset...
            proxy.refuse = True  # ...and new ones refused for a while
            await asyncio.to_thread(threading.Event().wait, 0.5)
            proxy.refuse = False
        load.finish()
        await running.caught_up(source, timeout=120)
        assert running.service.replication.runner.replicator is not None
        assert running.service.replication.runner.replicator.reconnects >= 3
        reports = await asyncio.to_thread(_verify_all, source,
                                          running.service.config.store.data_dir)
    finally:
        await running.stop()
        await proxy.stop()
    _assert_exact(reports)
