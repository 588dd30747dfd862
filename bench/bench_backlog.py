"""A backlog of 10 million row changes (several GB of binlog): live clients while it is
written, the rate and memory of catching up with it, clients served meanwhile.

    .venv/bin/python bench/bench_backlog.py [--changes 10000000] [--clients 200]
        [--rate 1000] [--sample 5]

A private MariaDB under bench/out/backlog-mariadb; the services run as their own processes
(``cdcserver run``, bench/bench_listener.py's harness), so their memory is their own.
``bench.backlog`` (BIGINT key, BIGINT, VARCHAR, a 240-character VARCHAR: about 280 bytes a
row) receives 80 % of the changes as inserts and 20 % as updates, in transactions of 10,000
rows (``INSERT ... SELECT`` from the SEQUENCE engine, ``UPDATE`` by key range).

1. **Live, while the backlog is written**: a service follows the server from its current
   position; ``--clients`` JSON clients tail ``bench.ticks``, another table, while a writer
   commits ``--rate`` rows/s to it in transactions of 10 rows and the backlog is written at
   the server's full speed beside it. Printed as bench_listener.py prints its latency run:
   rows delivered, latency p50 / p99 / max from each ``COMMIT`` returning to the row's line
   arriving (target p99 <= 100 ms), and every ``--sample`` seconds the service's RSS and
   replication lag, and the latency of the rows committed in that period.
2. **Catching up**: a second service, started on a new data directory from the oldest binlog
   once everything is written (and written back to disk: ``sync``), replicates all of it with
   nothing else asking anything of it.
   Printed: the C reference (``mariadb-binlog --read-from-remote-server -v`` over the same
   binlog to /dev/null, row changes/s; the ticks' rows of part 1, under 1 %, are decoded by
   both and counted by neither); the service's rate from its listener being up until its
   checkpoint covers the last transaction, and the ratio; its RSS every ``--sample`` seconds
   with the transactions stored so far; its peak RSS (VmHWM); the Avro it stored (made durable
   before each checkpoint) in MB/s, beside the disk's own durable write rate here (the same
   number of bytes written to one file and fsynced every 256 MiB).
3. **Clients catching up meanwhile**: a third service catches up the same way, then
   ``--clients`` clients tail ``bench.ticks2`` under the live writer while two JSON clients
   read all of ``bench.backlog`` (10 million changes, 12 million records) from its store;
   printed as part 1, and the records/s each backlog client received.

A live commit made while a service is still catching up is behind the whole backlog in the
binlog: no reader of that binlog can deliver it before it has read what comes first (part 2's
time). Part 1 measures what live clients see while a backlog is being written; part 2, how
fast a backlog that is already there is caught up; part 3, what live clients see while other
clients catch up on a backlog the service holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_listener import (
    MIB,
    USER,
    USERS,
    ServiceProcess,
    gtid_pos,
    latency_part,
    open_session,
)
from bench.common import OUT, announce_code_path, line
from cdcserver.app.embedded import EmbeddedMariaDB, kill_leftovers
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile
from cdcserver.store.layout import DataDir

BATCH = 10_000
CREATE = ("CREATE TABLE bench.backlog (id BIGINT PRIMARY KEY, amount BIGINT, "
          "name VARCHAR(64), body VARCHAR(255))")


def write_backlog(server: EmbeddedMariaDB, changes: int) -> tuple[int, int, float]:
    """80 % inserts, then 20 % updates of the first rows, in transactions of BATCH rows.
    Returns (inserts, updates, seconds)."""
    inserts = changes * 4 // 5 // BATCH * BATCH
    updates = (changes - inserts) // BATCH * BATCH
    started = time.monotonic()
    conn = server.connect()
    conn.autocommit(True)
    try:
        with conn.cursor() as cur:
            for first in range(1, inserts + 1, BATCH):
                last = first + BATCH - 1
                cur.execute(
                    "INSERT INTO bench.backlog SELECT seq, seq * 7919, CONCAT('customer-', seq), "
                    "RPAD(CONCAT('body-', seq, '-'), 240, 'lorem ipsum dolor ') "
                    f"FROM bench.seq_{first}_to_{last}")
            for first in range(1, updates + 1, BATCH):
                cur.execute("UPDATE bench.backlog SET amount = amount + 1 "
                            "WHERE id BETWEEN %s AND %s", (first, first + BATCH - 1))
    finally:
        conn.close()
    return inserts, updates, time.monotonic() - started


def binlog_bytes(server: EmbeddedMariaDB) -> int:
    return sum(int(row[1]) for row in server.query("SHOW BINARY LOGS"))


def mariadb_binlog_seconds(server: EmbeddedMariaDB) -> float:
    """The C reference over the whole binlog, output discarded."""
    logs = [row[0] for row in server.query("SHOW BINARY LOGS")]
    started = time.perf_counter()
    subprocess.run(["mariadb-binlog", "--no-defaults", "--read-from-remote-server",
                    "-h127.0.0.1", f"-P{server.port}", "-uroot",
                    "--base64-output=decode-rows", "-v", *logs],
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for entry in f:
            if entry.startswith(field + ":"):
                return int(entry.split()[1])
    return 0


class BacklogReader(threading.Thread):
    """A JSON client asking for bench.backlog from its first record, counting lines until
    it holds ``records`` of them (and the schema line)."""

    def __init__(self, port: int, records: int) -> None:
        super().__init__(daemon=True)
        self.port, self.records = port, records
        self.first = self.last = 0.0
        self.lines = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            sock = open_session(self.port, "JSON", "EXACT")
            with sock:
                sock.settimeout(600)
                sock.sendall(b"REQUEST-DATA bench.backlog")
                buf = bytearray(MIB)
                while self.lines < self.records + 1:
                    n = sock.recv_into(buf)
                    if not n:
                        raise ConnectionError(f"the stream ended after {self.lines} lines")
                    if not self.first:
                        self.first = time.perf_counter()
                        if buf.startswith(b"ERR"):
                            raise RuntimeError(bytes(buf[:n]).decode(errors="replace"))
                    self.lines += buf.count(b"\n", 0, n)
                self.last = time.perf_counter()
        except (OSError, RuntimeError) as exc:
            self.error = exc

    @property
    def rate(self) -> float:
        return self.records / (self.last - self.first) if self.last > self.first else 0.0


def catch_up_part(server: EmbeddedMariaDB, changes: int, every: float) -> None:
    reference = mariadb_binlog_seconds(server)
    line("mariadb-binlog -v (C reference), row changes/s",
         f"{changes / reference:,.0f} ({reference:.1f} s)")
    target = GtidState.parse(gtid_pos(server))
    with ServiceProcess(server, "backlog-catchup", 9412, "oldest") as service:
        started = time.perf_counter()
        next_sample = 0.0
        while True:
            stored = service.stored()
            t = time.perf_counter() - started
            if all(stored.covers(g) for g in target):
                break
            if t >= next_sample:
                line(f"  t={t:5.1f} s", f"RSS {service.rss_mib():6.1f} MiB, transactions "
                     f"stored {_sequence(stored):,} of {_sequence(target):,}")
                next_sample += every
            assert service.process is not None
            if service.process.poll() is not None:
                raise RuntimeError(f"the service exited; see {service.log_path}")
            time.sleep(0.1)
        line(f"  t={t:5.1f} s", f"RSS {service.rss_mib():6.1f} MiB, caught up")
        line("service: binlog -> durable Avro, row changes/s",
             f"{changes / t:,.0f} ({t:.1f} s from the listener being up)")
        line("  ratio service / mariadb-binlog", f"{reference / t:.2f}")
        line("service peak RSS (VmHWM), MiB", f"{vm_kib(service.pid, 'VmHWM') / 1024:.1f}")
        stored = directory_bytes(DataDir(service.data_dir).avro)
    ceiling = durable_write_seconds(stored)
    line("Avro stored (fsynced before each checkpoint), MB/s",
         f"{stored / t / 1e6:,.0f} ({stored / 1e9:.2f} GB)")
    line("  the disk's durable write rate here (same bytes, one file), MB/s",
         f"{stored / ceiling / 1e6:,.0f}; the service at {ceiling / t:.2f} of it")


def directory_bytes(path: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def durable_write_seconds(size: int) -> float:
    """The reference for a store that makes everything durable: ``size`` bytes written in
    1 MiB pieces to one file in bench/out and fsynced, as the checkpoints do."""
    path = os.path.join(OUT, "durable-write-reference")
    piece = os.urandom(MIB)
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size:
            written += os.write(fd, piece)
            if written % (256 * MIB) == 0:
                os.fsync(fd)  # as the store does every flush: not one huge final writeback
        os.fsync(fd)
    finally:
        os.close(fd)
        seconds = time.perf_counter() - started
        os.unlink(path)
    return seconds


def read_backlog(records: int, results: list[BacklogReader]) -> Callable[[int], None]:
    """The load of part 3: two clients reading the whole backlog from the service's store."""
    def run(port: int) -> None:
        results.extend(BacklogReader(port, records) for _ in range(2))
        for reader in results:
            reader.start()
        for reader in results:
            reader.join(1800)
    return run


def report_readers(readers: list[BacklogReader], records: int) -> None:
    for i, reader in enumerate(readers):
        if reader.error is not None or reader.is_alive():
            line(f"backlog client {i + 1}", f"FAILED: {reader.error or 'not done'}")
        else:
            line(f"backlog client {i + 1}: records/s from its first to its last",
                 f"{reader.rate:,.0f} ({records:,} records in {reader.last - reader.first:.1f} s)")


def _sequence(state: GtidState) -> int:
    gtid = state.get(0)
    return gtid.sequence if gtid is not None else 0


def private_server() -> EmbeddedMariaDB:
    base = os.path.join(OUT, "backlog-mariadb")
    kill_leftovers(os.path.join(base, "data"))
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(base, port=0, die_with_parent=True)
    server.start()
    server.execute("RESET MASTER", "CREATE DATABASE bench", CREATE)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=10_000_000, help="backlog row changes")
    parser.add_argument("--clients", type=int, default=200, help="clients tailing bench.ticks")
    parser.add_argument("--rate", type=int, default=1000, help="rows/s committed to bench.ticks")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    UsersFile(USERS).add(USER, USER)
    announce_code_path()
    server = private_server()
    try:
        written: list[tuple[int, int, float]] = []
        live = argparse.Namespace(minutes=0.0, seconds=3600.0, clients=args.clients,
                                  rate=args.rate, batch=10, sample=args.sample)
        line("part 1: live clients while the backlog is written", "")
        latency_part(server, live, load=lambda _port: written.append(
            write_backlog(server, args.changes)))
        if not written:
            raise RuntimeError("the backlog writer failed (its traceback is above)")
        inserts, updates, seconds = written[0]
        changes = inserts + updates
        line("backlog written beside the live writer",
             f"{inserts:,} inserts + {updates:,} updates = {changes:,} row changes in "
             f"{seconds:.1f} s ({changes / seconds:,.0f}/s), binlog "
             f"{binlog_bytes(server) / 1e9:.2f} GB")
        line("part 2: a new service catching up with all of it, alone", "")
        # part 1's store and the server's writes are still being written back: let the
        # disk finish them first, so that neither the reference nor the service pays for them
        shutil.rmtree(os.path.join(OUT, "listener-latency"), ignore_errors=True)
        os.sync()
        catch_up_part(server, changes, args.sample)
        records = inserts + 2 * updates
        readers: list[BacklogReader] = []
        line("part 3: clients reading the backlog from the store while others tail", "")
        latency_part(server, live, load=read_backlog(records, readers), table="bench.ticks2",
                     start_gtid="oldest")
        report_readers(readers, records)
    finally:
        server.stop()
        for name in ("listener-latency", "listener-backlog-catchup"):
            shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
