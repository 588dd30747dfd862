"""How the service's costs grow with the number of tables: 10 / 1,000 / 10,000 tables.

    .venv/bin/python bench/bench_tables.py [--tables 10,1000,10000] [--commits 5000]

Each count runs in a process of its own with ``ulimit -n 1024`` (a systemd-style limit): a
fresh private MariaDB, N tables created and given a row each, the service in-process. Printed
per count (medians where repeated):

- ``first capture``: the service replicating the N CREATE TABLEs and N first rows (a new
  table version and file each: linear in N, the metadata);
- ``start-up``: a restart over the data directory of N tables, from ``Service.run`` until the
  listener is up and replication is connected (the catalog is loaded then);
- ``per commit``: a backlog of ``--commits`` one-row transactions, each to another table
  (round robin over every table), written while the service was stopped, then caught up:
  (time to catch up) / commits;
  at 10,000 tables every one of them is a table's first write since the start (its writer
  and its row encoder made, its file opened); then the same over only 100 of the tables,
  each written ``commits / 100`` times, after another restart: the cost of a commit once a
  table is in use, with all N tables there;
- ``GTID seek``: ``REQUEST-DATA db.table GTID`` over a socket, time to the first record, for
  tables picked at random;
- ``checkpoint``: ``store.flush()`` (fsync of the dirty files, the index, the checkpoint's
  journal line) after one commit to one table, and after commits to 100 tables; the sizes of
  the checkpoint's base file and of one journal line (a checkpoint writes the tables that
  changed; the base, every table's mark, is rewritten once the journal outgrows it);
- ``open descriptors``: the most the process held (sampled every 10 ms), against the limit;
- ``RSS``: the process's resident memory at the end, and its peak.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, announce_code_path, line
from cdcserver.app.embedded import EmbeddedMariaDB, kill_leftovers
from cdcserver.app.service import Service
from cdcserver.core.config import (
    Config,
    ListenerConfig,
    MetricsConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import GtidState
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.wire import auth_message
from tests.helpers import memory_mib

FD_LIMIT = 1024
HOT_TABLES = 100  # the second backlog's tables: each written commits / 100 times
DB = "many"


def table(i: int) -> str:
    return f"t{i:05d}"


# -- the parent: one child process per count -----------------------------------------------

def run_counts(counts: list[int], commits: int) -> int:
    results = []
    for n in counts:
        line(f"{n:,} tables", "running (a process with ulimit -n 1024) ...")
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", str(n), "--commits",
             str(commits)], stdout=subprocess.PIPE, text=True,
            preexec_fn=limited_child)
        if child.returncode:
            print(child.stdout, file=sys.stderr)
            line(f"{n:,} tables", f"FAILED (exit {child.returncode})")
            return 1
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    print_table(results)
    return 0


def limited_child() -> None:
    """The child's descriptor limit; it dies with this process (no bench left behind)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    die_with_parent()


def print_table(results: list[dict[str, Any]]) -> None:
    rows = [
        ("first capture of N tables, s", "first_capture", "{:.2f}"),
        ("  per table, ms", "first_capture_per_table", "{:.2f}"),
        ("start-up (listener up, replication connected), ms", "startup_ms", "{:.0f}"),
        ("per commit (backlog, one table each), us", "per_commit_us", "{:.0f}"),
        (f"per commit (backlog over {HOT_TABLES} of the tables), us", "per_commit_hot_us",
         "{:.0f}"),
        ("GTID seek to the first record, ms (median)", "seek_ms", "{:.1f}"),
        ("checkpoint after 1 dirty table, ms (median)", "checkpoint_1_ms", "{:.1f}"),
        ("checkpoint after 100 dirty tables, ms (median)", "checkpoint_100_ms", "{:.1f}"),
        ("checkpoint base file, KB (rewritten once the journal outgrows it)", "checkpoint_kb",
         "{:.0f}"),
        ("checkpoint journal line after 1 dirty table, bytes", "journal_line_bytes", "{:.0f}"),
        ("open descriptors, most held (limit 1024)", "max_fds", "{:.0f}"),
        ("RSS at the end / peak, MB", "rss", "{}"),
    ]
    header = "".join(f"{r['tables']:>12,}" for r in results)
    line("tables", header)
    for label, key, fmt in rows:
        line(label, "".join(f"{fmt.format(r[key]):>12}" for r in results))


# -- the child: one count ------------------------------------------------------------------

class FdSampler:
    """The most descriptors the process held, sampled every 10 ms in a thread."""

    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.most = max(self.most, len(os.listdir("/proc/self/fd")))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def make_tables(server: EmbeddedMariaDB, n: int) -> None:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DB}")
            for i in range(n):
                cur.execute(f"CREATE TABLE {DB}.{table(i)} (id INT PRIMARY KEY, "
                            "v VARCHAR(32), n BIGINT)")
            for i in range(n):
                cur.execute(f"INSERT INTO {DB}.{table(i)} VALUES (1, 'first', 0)")
    finally:
        conn.close()


def write_backlog(server: EmbeddedMariaDB, n: int, commits: int) -> dict[int, str]:
    """One-row updates, each to another table (a stride through the first ``n``); the GTID
    of the first update of each table touched."""
    conn = server.connect()
    first: dict[int, str] = {}
    stride = 7919 if n % 7919 else 1
    try:
        with conn.cursor() as cur:
            for k in range(commits):
                i = (k * stride) % n
                cur.execute(f"UPDATE {DB}.{table(i)} SET n = n + 1, v = 'update {k}' "
                            "WHERE id = 1")
                if i not in first:
                    cur.execute("SELECT @@last_gtid")
                    first[i] = str(cur.fetchone()[0])
    finally:
        conn.close()
    return first


def commit_to(server: EmbeddedMariaDB, tables: list[int]) -> None:
    conn = server.connect()
    conn.autocommit(False)
    try:
        with conn.cursor() as cur:
            for i in tables:
                cur.execute(f"UPDATE {DB}.{table(i)} SET n = n + 1 WHERE id = 1")
            conn.commit()
    finally:
        conn.close()


def binlog_state(server: EmbeddedMariaDB) -> GtidState:
    return GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))


class InProcess:
    """The service running in this process's event loop."""

    def __init__(self, config: Config) -> None:
        self.service = Service(config)
        self.stop_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> float:
        """Seconds until the listener is up and replication connected."""
        begun = time.perf_counter()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self.service.run(
            self.stop_event, started=lambda _: started.set_result(None)))
        await started
        await self.service.replication.runner.replicating.wait()
        assert self.service.replication.runner.replicator is not None
        await asyncio.to_thread(self.service.replication.runner.replicator.connected.wait, 60)
        return time.perf_counter() - begun

    async def stop(self) -> None:
        self.stop_event.set()
        assert self.task is not None
        await self.task


def file_kb(path: str) -> float:
    return os.path.getsize(path) / 1024


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def last_journal_line_after_one_commit(service: Service, server: EmbeddedMariaDB,
                                             journal: str) -> int:
    """The size of the checkpoint written after a commit to one table (again if that
    checkpoint happened to be a new base, which leaves the journal empty)."""
    for _ in range(3):
        await asyncio.to_thread(commit_to, server, [0])
        await service.wait_caught_up(binlog_state(server))
        await service.data.store.flush()
        lines = (await asyncio.to_thread(read_bytes, journal)).splitlines()
        if lines:
            return len(lines[-1]) + 1
    raise RuntimeError("every checkpoint was written as a new base")


def resident_mb() -> float:
    return memory_mib()


async def timed(work: Callable[[], Awaitable[Any]]) -> float:
    begun = time.perf_counter()
    await work()
    return time.perf_counter() - begun


def first_record_ms(address: tuple[str, int], name: str, gtid: str) -> float:
    with socket.create_connection(address) as sock:
        reader = sock.makefile("rb")
        for command in (auth_message("bench", "bench"), b"REGISTER UUID=bench, TYPE=JSON"):
            sock.sendall(command)
            assert reader.readline() == b"OK\n"
        begun = time.perf_counter()
        sock.sendall(f"REQUEST-DATA {DB}.{name} {gtid}".encode())
        reader.readline()  # the schema
        record = reader.readline()
        elapsed = time.perf_counter() - begun
        assert b'"n"' in record, record[:200]
        return elapsed * 1000


async def one_count(n: int, commits: int) -> dict[str, Any]:
    base = os.path.join(OUT, "tables")
    kill_leftovers(os.path.join(base, "mariadb", "data"))
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(os.path.join(base, "mariadb"), port=0,
                             extra_args=("--innodb-file-per-table=0",
                                         "--innodb-flush-log-at-trx-commit=0",
                                         "--sync-binlog=0"), die_with_parent=True)
    server.start()
    fds = FdSampler()
    try:
        users = os.path.join(base, "cdcusers")
        UsersFile(users).add("bench", "bench")
        config = Config(source=SourceConfig(url=server.url(), server_id=9200,
                                            start_gtid="oldest"),
                        store=StoreConfig(data_dir=os.path.join(base, "data")),
                        listener=ListenerConfig(listen="127.0.0.1:0", users_file=users),
                        metrics=MetricsConfig(listen=""))
        result: dict[str, Any] = {"tables": n}
        await asyncio.to_thread(make_tables, server, n)

        running = InProcess(config)
        target = binlog_state(server)
        begun = time.perf_counter()
        await running.start()
        await running.service.wait_caught_up(target)
        await running.service.data.store.flush()
        result["first_capture"] = time.perf_counter() - begun
        result["first_capture_per_table"] = result["first_capture"] * 1000 / n
        await running.stop()

        first = await asyncio.to_thread(write_backlog, server, n, commits)
        target = binlog_state(server)
        running = InProcess(config)
        startup = await running.start()
        caught_up = await timed(lambda: running.service.wait_caught_up(target))
        result["startup_ms"] = startup * 1000
        result["per_commit_us"] = caught_up * 1e6 / commits
        await running.stop()

        await asyncio.to_thread(write_backlog, server, min(n, HOT_TABLES), commits)
        target = binlog_state(server)
        running = InProcess(config)
        await running.start()
        caught_up = await timed(lambda: running.service.wait_caught_up(target))
        result["per_commit_hot_us"] = caught_up * 1e6 / commits

        service = running.service
        rng = random.Random(n)
        ones, hundreds = [], []
        for _ in range(7):
            await asyncio.to_thread(commit_to, server, [rng.randrange(n)])
            await service.wait_caught_up(binlog_state(server))
            ones.append(await timed(service.data.store.flush))
            await asyncio.to_thread(commit_to, server, rng.sample(range(n), min(100, n)))
            await service.wait_caught_up(binlog_state(server))
            hundreds.append(await timed(service.data.store.flush))
        result["checkpoint_1_ms"] = statistics.median(ones) * 1000
        result["checkpoint_100_ms"] = statistics.median(hundreds) * 1000
        layout = DataDir(os.path.join(base, "data"))
        result["checkpoint_kb"] = file_kb(layout.checkpoint)
        result["journal_line_bytes"] = await last_journal_line_after_one_commit(
            service, server, layout.checkpoint_log)

        assert service.listener.address is not None
        picks = rng.sample(sorted(first), min(25, len(first)))
        address = service.listener.address
        seeks = [await asyncio.to_thread(first_record_ms, address, table(i), first[i])
                 for i in picks]
        result["seek_ms"] = statistics.median(seeks)
        await running.stop()
        rss = resident_mb()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result["rss"] = f"{rss:.0f} / {peak:.0f}"
    finally:
        result_fds = fds.stop()
        server.stop()
    result["max_fds"] = result_fds
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", default="10,1000,10000",
                        help="comma-separated table counts")
    parser.add_argument("--commits", type=int, default=5000,
                        help="one-row transactions in the backlog")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child's count
    args = parser.parse_args()
    if args.one is not None:
        result = asyncio.run(one_count(args.one, args.commits))
        print(json.dumps(result), flush=True)
        return 0
    announce_code_path()
    return run_counts([int(n) for n in args.tables.split(",")], args.commits)


if __name__ == "__main__":
    sys.exit(main())
