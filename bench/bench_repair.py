"""A big table's repair beside the stream (issue 49, item 2): the other tables' latency and
the service's memory while a rewriting ALTER of an N-row table is repaired.

    .venv/bin/python bench/bench_repair.py [--rows 10000000] [--tables 100] [--rate 1000]
        [--baseline 15] [--resync] [--timeline]

A private MariaDB under bench/out/repair-mariadb holds ``bench.big`` (id INT PRIMARY KEY,
a VARCHAR(40), b INT, c DOUBLE: N rows, inserted in transactions of 200,000) and ``--tables``
small tables ``bench.t000``... (id INT AUTO_INCREMENT PRIMARY KEY, sent BIGINT). The service
runs as its own process (``cdcserver run``, so its resident memory is its own) from the oldest
binlog and first catches up with the load. Then:

- a writer commits ``--rate`` rows/s, one row to each of 10 small tables per transaction, in
  turn, on a fixed schedule; ``sent`` is the writer's CLOCK_MONOTONIC (microseconds) just
  before the INSERT;
- one client process tails every small table (one JSON connection each) and notes, for each
  row, its arrival on the same clock: the row's latency is arrival - sent (the INSERT and the
  COMMIT included);
- after ``--baseline`` seconds of that, ``ALTER TABLE bench.big ADD COLUMN k INT NOT NULL
  DEFAULT 1`` (instant in MariaDB; every row gets a value the binlog does not carry: a repair
  of every row) and the run goes on until /metrics says the repair is out
  (``cdc_repairs_total`` grew and ``cdc_repair_pending`` is 0).

With ``--resync`` the service replicates as a user who may read the small tables but not
``bench.big`` (``SELECT`` granted table by table): the ALTER's repair cannot read it, so the
table is quarantined; then ``bench.big`` is granted and a resync asked for
(``cdcserver resync``'s request file), which the service reads beside the stream; the run
goes on until ``cdc_resyncs_total`` grew and no repair is pending. The times and the "during"
figures are from the grant to the resync's records all out.

Printed: the repair's time (ALTER to out), the rows it wrote (``cdc_repair_records_total``),
the small tables' latency p50/p99/max before the ALTER and during the repair, the rows they
received during it, and the service's resident memory (VmRSS sampled every 0.2 s: the
largest before the ALTER and during the repair; VmHWM at the end covers the initial catch-up
too). Goal (issue 49): p99 <= 100 ms during the repair and peak RSS <= 300 MB, 10M rows, 100
tables at 1,000 rows/s, on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import sys
import threading
import time
import urllib.request
from multiprocessing.connection import Connection

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_listener import USERS, ServiceProcess
from bench.common import announce_code_path, fresh_server, line
from cdcserver.app import resyncs
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.names import TableName
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import auth_message
from tests.helpers import memory_mib

USER = "bench"
REPLICA = "cdcrepl"  # the service's source user with --resync
LOAD_BATCH = 200_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1000, help="rows/s to the small tables")
    parser.add_argument("--baseline", type=float, default=15.0)
    parser.add_argument("--resync", action="store_true",
                        help="quarantine the table (the service may not read it) and measure "
                             "its resync instead of its repair")
    parser.add_argument("--timeline", action="store_true",
                        help="the largest latency of each second of the repair")
    args = parser.parse_args()
    announce_code_path()
    line("path measured", "cdcserver run (its own process), JSON clients over TCP")
    with fresh_server("repair-mariadb") as server:
        started = time.monotonic()
        load(server, args.rows, args.tables)
        line("source loaded", f"{args.rows:,} rows + {args.tables} tables in "
                              f"{time.monotonic() - started:.0f} s")
        UsersFile(USERS).add(USER, USER)
        source = limited_user(server, args.tables) if args.resync else None
        with ServiceProcess(server, "repair", server_id=4242, source=source) as service:
            run(server, service, args)
    return 0


def load(server: EmbeddedMariaDB, rows: int, tables: int) -> None:
    conn = server.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE DATABASE bench")
        cur.execute("USE bench")  # the seq_ tables are in the current database
        cur.execute("CREATE TABLE bench.big (id INT PRIMARY KEY, a VARCHAR(40), b INT, "
                    "c DOUBLE)")
        for first in range(0, rows, LOAD_BATCH):
            last = min(rows, first + LOAD_BATCH)
            cur.execute(f"INSERT INTO bench.big SELECT seq, CONCAT('row number ', seq), "
                        f"seq % 1000, seq / 7 FROM seq_{first + 1}_to_{last}")
            conn.commit()
        for i in range(tables):
            cur.execute(f"CREATE TABLE bench.t{i:03d} (id INT AUTO_INCREMENT PRIMARY KEY, "
                        "sent BIGINT)")
    conn.close()


def limited_user(server: EmbeddedMariaDB, tables: int) -> str:
    """A replication user who may read the small tables, not ``bench.big``: its URL."""
    grants = [f"GRANT SELECT ON bench.t{i:03d} TO '{REPLICA}'@'{host}'"
              for i in range(tables) for host in ("127.0.0.1", "localhost")]
    server.execute(*(f"CREATE USER '{REPLICA}'@'{host}' IDENTIFIED BY '{REPLICA}'"
                     for host in ("127.0.0.1", "localhost")),
                   *(f"GRANT RELOAD, REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER "
                     f"ADMIN ON *.* TO '{REPLICA}'@'{host}'"
                     for host in ("127.0.0.1", "localhost")), *grants)
    return server.url(REPLICA, REPLICA)


def metrics(service: ServiceProcess) -> dict[str, float]:
    port = re.search(r"metrics and health on http://[\d.]+:(\d+)", service._log())
    assert port is not None, "no metrics address in the service's log"
    with urllib.request.urlopen(f"http://127.0.0.1:{port[1]}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[str, float] = {}
    for name in ("cdc_repairs_total", "cdc_repair_pending", "cdc_resyncs_total",
                 "cdc_tables_quarantined"):
        match = re.search(rf"^{name} (\S+)$", text, re.M)
        found[name] = float(match[1]) if match else 0.0
    found["records"] = sum(float(m[1]) for m in
                           re.finditer(r"^cdc_repair_records_total\{[^}]*\} (\S+)$", text, re.M))
    return found


def run(server: EmbeddedMariaDB, service: ServiceProcess, args: argparse.Namespace) -> None:
    started = time.monotonic()
    caught_up(server, service)
    line("service caught up with the load", f"{time.monotonic() - started:.0f} s")
    parent, child = multiprocessing.Pipe()
    clients = multiprocessing.Process(target=client_process,
                                      args=(service.port, args.tables, child), daemon=True)
    clients.start()
    assert parent.recv() == "ready"
    stop = threading.Event()
    writer = threading.Thread(target=write, args=(server, args.tables, args.rate, stop))
    writer.start()
    samples: list[tuple[float, float]] = []
    sampler = threading.Thread(target=sample, args=(service.pid, samples, stop), daemon=True)
    sampler.start()
    time.sleep(args.baseline)
    before = metrics(service)
    alter_at = time.monotonic()
    server.execute("ALTER TABLE bench.big ADD COLUMN k INT NOT NULL DEFAULT 1")
    if args.resync:
        while not metrics(service)["cdc_tables_quarantined"]:
            time.sleep(0.2)
        line("bench.big quarantined (it cannot be read)", f"{time.monotonic() - alter_at:.1f} s "
                                                          "after the ALTER")
        before = metrics(service)
        server.execute(*(f"GRANT SELECT ON bench.big TO '{REPLICA}'@'{host}'"
                         for host in ("127.0.0.1", "localhost")))
        alter_at = time.monotonic()  # the figures below: from the grant
        resyncs.ask(service.data_dir, TableName("bench", "big"))
    done = "cdc_resyncs_total" if args.resync else "cdc_repairs_total"
    while True:
        time.sleep(0.5)
        now = metrics(service)
        if now[done] > before[done] and not now["cdc_repair_pending"]:
            break
        if time.monotonic() - alter_at > 7200:
            raise RuntimeError("the repair did not finish in 2 hours")
    done_at = time.monotonic()
    time.sleep(2)
    stop.set()
    writer.join()
    parent.send("stop")
    latencies: list[tuple[float, float]] = parent.recv()  # (arrival, latency ms)
    clients.join()
    what = "resync (grant to out)" if args.resync else "repair of every row (ALTER to out)"
    line(what, f"{done_at - alter_at:.1f} s, "
               f"{now['records'] - before['records']:,.0f} records")
    start, during = ("the grant (the ALTER and quarantine included)", "the resync") \
        if args.resync else ("the ALTER", "the repair")
    report(f"latency before {start}", [ms for at, ms in latencies if at < alter_at])
    report(f"latency during {during}",
           [ms for at, ms in latencies if alter_at <= at <= done_at])
    if args.timeline:
        for second in range(int(done_at - alter_at) + 1):
            window = sorted(ms for at, ms in latencies
                            if alter_at + second <= at < alter_at + second + 1)
            if window:
                line(f"  second {second} of {during}",
                     f"max {window[-1]:.0f} ms, {len(window)} rows")
    line(f"RSS before {start} (largest sample)",
         f"{max((mb for at, mb in samples if at < alter_at), default=0):.0f} MB")
    line(f"RSS during {during} (largest sample)",
         f"{max((mb for at, mb in samples if alter_at <= at <= done_at), default=0):.0f} MB")
    line("VmHWM at the end (the catch-up included)", f"{memory_mib(service.pid, 'VmHWM'):.0f} MB")


def report(label: str, values: list[float]) -> None:
    if not values:
        line(label, "no rows")
        return
    values.sort()
    p = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    line(label, f"p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {values[-1]:.1f} ms "
                f"({len(values):,} rows)")


def caught_up(server: EmbeddedMariaDB, service: ServiceProcess) -> None:
    conn = server.connect()
    with conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        target = cur.fetchone()[0]
    conn.close()
    from cdcserver.core.gtid import GtidState

    service.wait_covers(GtidState.parse(target), timeout=7200)


def sample(pid: int, samples: list[tuple[float, float]], stop: threading.Event) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), memory_mib(pid)))
        time.sleep(0.2)


def write(server: EmbeddedMariaDB, tables: int, rate: int, stop: threading.Event) -> None:
    """``rate`` rows/s: one transaction of one row to each of 10 tables, ``rate / 10``
    times a second, on a fixed schedule."""
    conn = server.connect()
    interval = 10 / rate
    nxt, turn = time.monotonic(), 0
    with conn.cursor() as cur:
        while not stop.is_set():
            for _ in range(10):
                sent = time.monotonic_ns() // 1000
                cur.execute(f"INSERT INTO bench.t{turn % tables:03d} (sent) VALUES ({sent})")
                turn += 1
            conn.commit()
            nxt += interval
            pause = nxt - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    conn.close()


def client_process(port: int, tables: int, pipe: Connection) -> None:
    asyncio.run(_clients(port, tables, pipe))


async def _clients(port: int, tables: int, pipe: Connection) -> None:
    latencies: list[tuple[float, float]] = []
    tasks = [asyncio.create_task(_tail(port, f"bench.t{i:03d}", latencies))
             for i in range(tables)]
    await asyncio.sleep(2)
    pipe.send("ready")
    await asyncio.to_thread(pipe.recv)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    pipe.send(latencies)


async def _tail(port: int, table: str, latencies: list[tuple[float, float]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(auth_message(USER, USER))
    await reader.readline()
    writer.write(b"REGISTER UUID=bench, TYPE=JSON\n")
    await reader.readline()
    writer.write(f"REQUEST-DATA {table}\n".encode())
    await reader.readline()  # the schema
    pattern = re.compile(rb'"sent": (\d+)')
    while True:
        data = await reader.readline()
        if not data:
            return
        now = time.monotonic()
        found = pattern.search(data)
        if found:
            latencies.append((now, max(0.0, now * 1000 - int(found[1]) / 1000)))


if __name__ == "__main__":
    sys.exit(main())
