"""The listener (issue 7): AVRO mode beside sendfile, JSON rows/s, tail latency and RSS under load.

    .venv/bin/python bench/bench_listener.py [--runs N] [--seconds S | --minutes M] [--service EXE]
        [--clients C] [--rate R] [--batch B] [--sample T] [--only avro|json|latency]
        [--tables N] [--client-processes P]

A private MariaDB under bench/out/listener-mariadb; the service always runs as its own process
(``cdcserver run``, listener on 127.0.0.1, port 0), so no client shares its event loop and its
resident memory is its own. The clients read with ``recv_into`` a preallocated 1 MiB buffer.

AVRO and JSON: the standard workload (bench/common.py), replicated by the service from the
oldest binlog; bench.orders is 300,000 records in one version file. Medians of N runs; an
AVRO run is the median of 7 transfers of each kind, taken in turn (a transfer lasts about 30 ms
and loopback sendfile alone jumps between 2 and 9 GB/s from one transfer to the next here):
- `AVRO mode, one client`: ``REQUEST-DATA bench.orders`` in ``TYPE=AVRO``, MB/s (and records/s)
  from the first byte received until the client holds as many bytes as the ``.avro`` file (the
  container header, then the blocks as stored). An untimed round first checks that the stream
  is the file, byte for byte;
- `os.sendfile over loopback (reference)`: the same file sent with ``os.sendfile`` through a
  loopback TCP socket (a thread of this process) to the same receiving loop, timed the same way;
- `ratio AVRO mode / sendfile`: the two medians, same run (target >= 0.8); then each run's
  pair, and the slowest and fastest single transfers of each kind;
- `JSON mode, one client`: records/s from sending ``REQUEST-DATA`` in ``TYPE=JSON`` until the
  schema line and every record line have arrived (the client counts newlines; a missing line
  fails the run; target >= 100,000), in the exact dialect (``DIALECT=EXACT``) and the maxscale
  dialect (the default, what MaxScale's clients get), taken in turn; then each run's pair.

Latency under load: a second service process, started at the end of the binlog, serving the
table ``bench.ticks (id INT AUTO_INCREMENT PRIMARY KEY, sent BIGINT)`` (``sent``: the writer's
wall clock before the INSERT, for a person reading the rows; the figures do not use it). C JSON
clients (default 200, one connection each, in two client processes running asyncio) tail the
table while a writer commits R rows/s (default 2,000) as transactions of B rows (default 10:
200 transactions/s) on a fixed schedule, for S seconds (default 30; ``--minutes M``: M
minutes). The writer notes the monotonic clock when each ``COMMIT`` returns, a client notes it
when a row's line arrives, and the row's latency is the difference (CLOCK_MONOTONIC is one
clock for every process of the machine; a row that arrives before its ``COMMIT`` returned
counts as 0 ms). After the writer stops, the clients get half the run time (10 s to 120 s) to
receive the rest; a row still missing then is counted as arriving then, and the percentiles are
marked as lower bounds.

``--tables N`` (default 1: ``bench.ticks`` alone): N such tables ``bench.ticks_0`` ..
``bench.ticks_{N-1}``; client i tails table i % N, and the writer's transaction k goes to table
k % N, so the total stays R rows/s; each table's ids run on from its own seed row, and every
check below (order, gaps, duplicates, rows delivered) is per connection, so per table.
``--client-processes P`` (default 2): the processes the clients are spread over (each sets up
16 connections at once). For many connections the bench raises its RLIMIT_NOFILE (the hard
limit too where it may) to 2 x C + 4096, which the service and the client processes inherit
(the service raises its soft limit to the hard one and budgets one descriptor per connection,
its socket, beside the version files its streams share, cdcserver/app/descriptors.py); it
starts the service with ``--max-connections`` max(2048, C + 64) and
``CDCSERVER_LISTENER_MAX_UNAUTHENTICATED`` max(32, 16 x P), and stops at once, saying why, if
the connections the service budgets (its start-up log) are fewer than C.
- `service RSS before the clients connected`: the service's VmRSS, the tables just created;
- with more than one table, or another number of client processes: the tables and clients per
  table; the client processes x connections, the time all took to connect (and get their
  table's seed row), the descriptor limit and the service's ``--max-connections``;
- `writer`: rows and transactions committed, and the rate achieved;
- `rows delivered`: rows all clients received, of clients x rows committed (with N tables:
  the sum over the tables of the table's rows x its clients; gaps, rows repeated or out of
  order, and lost connections are reported); with N > 1, `tables whose clients got all their
  rows once, in order`: how many of the N, and the first tables that did not, with counts;
- `latency p50 / p99 / max`: over every row of every client (targets p50 <= 20 ms,
  p99 <= 100 ms); then, if any, the rows not delivered by the end of the drain (and the figures
  over the rows delivered alone), and the rows that arrived before their COMMIT returned;
- `t=... s`: the time series, every T seconds (``--sample``, default 5): the service's VmRSS;
  its replication lag (the age of the oldest committed transaction its checkpoint, written every
  0.2 s, does not cover yet: the part of the latency spent before the listener); and the p50 /
  p99 latency of the rows committed in the T seconds before (``>=``: some were not delivered);
- `service RSS first / last / max`: over those samples (the first: clients connected, writer
  starting);
- `CPU over the writer's run`: the service process's CPU time, and the client processes'
  together, in % of one core (the machine has two); with N > 1 or another number of client
  processes, each client process's, and this process's (the writer and the sampler) and
  MariaDB's;
- `service log`: the warnings and errors the service logged (its log: bench/out/listener-*.log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import multiprocessing
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, RECORDS, announce_code_path, fresh_server, line, load_workload
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.gtid import GtidState
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from cdcserver.store.checkpoint import covered_state
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.wire import auth_message

USER = PASSWORD = "bench"
MIB = 1 << 20
USERS = os.path.join(OUT, "listener-cdcusers")
# the ``cdcserver`` executable run (``--service``: another tree's, to compare with this one)
THIS_SERVICE = os.path.join(os.path.dirname(sys.executable), "cdcserver")
SERVICE = [THIS_SERVICE]
CLIENT_PROCESSES = 2
TRANSFERS = 7  # a run of the AVRO comparison: the median of this many transfers of each kind
SEED_ID, FIRST_ID = 1, 2  # the row every tailing client sees first; the writer's first id
_ID = re.compile(rb'"id": (\d+)')
_PROBLEM = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (WARNING|ERROR|CRITICAL) ")


# -- the service, as its own process ------------------------------------------------------

class ServiceProcess:
    """``cdcserver run`` on a private data directory, its listener on 127.0.0.1 port 0."""

    def __init__(self, server: EmbeddedMariaDB, name: str, server_id: int,
                 start_gtid: str = "oldest", options: Sequence[str] = (),
                 environment: dict[str, str] | None = None, source: str | None = None
                 ) -> None:
        self.data_dir = os.path.join(OUT, f"listener-{name}")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        os.makedirs(self.data_dir)
        self.log_path = os.path.join(OUT, f"listener-{name}.log")
        self.args = [SERVICE[0], "run", "--source", source or server.url(),
                     "--data-dir", self.data_dir,
                     "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                     "--users-file", USERS,
                     "--server-id", str(server_id), "--start-gtid", start_gtid,
                     "--log-level", "info", *options]
        self.environment = None if environment is None else {**os.environ, **environment}
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> ServiceProcess:
        with open(self.log_path, "wb") as log:
            # killed with this process, even by -9: no service is left behind
            self.process = subprocess.Popen(self.args, stdout=log, stderr=log,
                                            env=self.environment,
                                            preexec_fn=die_with_parent)
        deadline = time.monotonic() + 60
        while not self.port:
            found = re.search(r"listening on [\d.]+:(\d+)", self._log())
            if found:
                self.port = int(found[1])
            elif self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {self.log_path}")
            else:
                time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stored(self) -> GtidState:
        """What the service's checkpoint covers (stored and fsynced)."""
        return covered_state(DataDir(self.data_dir).checkpoint)

    def wait_covers(self, target: GtidState, timeout: float = 600) -> None:
        """Until the service's checkpoint covers ``target``."""
        deadline = time.monotonic() + timeout
        while not all(self.stored().covers(g) for g in target):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited with {self.process.returncode}; "
                                   f"see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service did not reach {target}")
            time.sleep(0.1)

    def rss_mib(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for entry in f:
                if entry.startswith("VmRSS:"):
                    return int(entry.split()[1]) / 1024
        return 0.0

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def budget_line(self) -> str:
        """The service's account of its file descriptors (logged at start), or ''."""
        found = re.search(r"file descriptors: .*", self._log())
        return found[0] if found else ""

    def connections_budget(self) -> int | None:
        """The client connections the service serves at once, as it logged at start."""
        found = re.search(r"(\d+) client connections", self.budget_line())
        return int(found[1]) if found else None

    def problems(self) -> list[str]:
        """The service's log records at level WARNING and above, so far."""
        return [entry for entry in self._log().splitlines() if _PROBLEM.match(entry)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_nofile(wanted: int) -> int:
    """Raise this process's RLIMIT_NOFILE to at least ``wanted`` descriptors: the hard limit
    too where allowed (root; at most fs.nr_open), else the soft one up to the hard one.
    Children (the service, the client processes) inherit it. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    with contextlib.suppress(OSError), open("/proc/sys/fs/nr_open") as f:
        wanted = min(wanted, int(f.read()))
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
        except (ValueError, OSError):  # not privileged: as far as the hard limit goes
            wanted = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return wanted


def gtid_pos(server: EmbeddedMariaDB) -> str:
    return str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


# -- one client, blocking, reading into a preallocated buffer ------------------------------

def open_session(port: int, fmt: str, dialect: str | None = None) -> socket.socket:
    """Connected, authenticated and registered in ``fmt`` (JSON or AVRO; ``dialect``: the
    JSON dialect asked for, None: the server's default, as MaxScale's clients get)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    extension = f", DIALECT={dialect}" if dialect else ""
    for command in (auth_message(USER, PASSWORD),
                    f"REGISTER UUID=bench-listener, TYPE={fmt}{extension}".encode()):
        sock.sendall(command)
        reply = sock.recv(256)
        if reply != b"OK\n":
            raise RuntimeError(f"{command[:20]!r}: {reply!r}")
    return sock


@dataclass(frozen=True)
class Received:
    first: float  # perf_counter when the first read returned
    last: float  # ... and the last
    bytes: int
    newlines: int
    first_read: int  # bytes the first read returned (they arrived before ``first``)

    @property
    def rate(self) -> float:
        """Bytes/s from the first byte to the last."""
        return (self.bytes - self.first_read) / (self.last - self.first)


def receive(sock: socket.socket, size: int | None = None, lines: int | None = None
            ) -> Received:
    """Read into one 1 MiB buffer until ``size`` bytes or ``lines`` newlines have arrived,
    discarding the data."""
    buf = bytearray(MIB)
    got = newlines = first_read = 0
    first = 0.0
    while (size is None or got < size) and (lines is None or newlines < lines):
        n = sock.recv_into(buf)
        if not n:
            raise RuntimeError(f"the stream ended after {got} bytes")
        if not got:
            first, first_read = time.perf_counter(), n
        got += n
        if lines is not None:
            newlines += buf.count(b"\n", 0, n)
    return Received(first, time.perf_counter(), got, newlines, first_read)


def avro_rate(port: int, size: int) -> float:
    """Bytes/s of the AVRO stream of bench.orders, from its first byte to the file's size."""
    with open_session(port, "AVRO") as sock:
        sock.sendall(b"REQUEST-DATA bench.orders")
        received = receive(sock, size=size)
    if received.bytes != size:
        raise RuntimeError(f"AVRO mode sent {received.bytes} bytes, the file has {size}")
    return received.rate


def check_avro_stream(port: int, path: str) -> None:
    """Untimed: the AVRO stream of the table is the version file, byte for byte."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open_session(port, "AVRO") as sock:
        sock.sendall(b"REQUEST-DATA bench.orders")
        got = 0
        while got < size:
            data = sock.recv(min(MIB, size - got))
            if not data:
                raise RuntimeError(f"the AVRO stream ended after {got} bytes")
            digest.update(data)
            got += len(data)
    with open(path, "rb") as f:
        if hashlib.file_digest(f, "sha256").digest() != digest.digest():
            raise RuntimeError("the AVRO stream differs from the version file")


def sendfile_rate(path: str) -> float:
    """The reference: ``os.sendfile`` of the file through loopback TCP to ``receive``."""
    size = os.path.getsize(path)
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def send() -> None:
            conn, _ = listener.accept()
            with conn, open(path, "rb") as f:
                offset = 0
                while offset < size:
                    offset += os.sendfile(conn.fileno(), f.fileno(), offset, size - offset)

        sender = threading.Thread(target=send)
        sender.start()
        with socket.create_connection(listener.getsockname(), timeout=60) as sock:
            received = receive(sock, size=size)
        sender.join()
    assert received.bytes == size
    return received.rate


def json_rate(port: int, dialect: str | None = None) -> float:
    """Records/s from the request until the schema line and every record have arrived (a
    missing line fails the run: nothing may be lost)."""
    with open_session(port, "JSON", dialect) as sock:
        start = time.perf_counter()
        sock.sendall(b"REQUEST-DATA bench.orders")
        received = receive(sock, lines=RECORDS + 1)
    if received.newlines != RECORDS + 1:
        raise RuntimeError(f"{received.newlines} lines, expected {RECORDS + 1}")
    return RECORDS / (received.last - start)


def bulk_parts(server: EmbeddedMariaDB, args: argparse.Namespace) -> None:
    """Parts 1 and 2 on the standard workload."""
    with ServiceProcess(server, "data", 9400) as service:
        service.wait_covers(GtidState.parse(gtid_pos(server)))
        versions = [f for f in os.listdir(os.path.join(service.data_dir, "avro"))
                    if f.startswith("bench.orders.") and f.endswith(".avro")]
        assert len(versions) == 1, versions
        path = os.path.join(service.data_dir, "avro", versions[0])
        size = os.path.getsize(path)
        if args.only in (None, "avro"):
            check_avro_stream(service.port, path)  # and a warm-up of both sides
            sendfile_rate(path)
            avro, reference, transfers = [], [], []
            for _ in range(args.runs):
                pairs = [(avro_rate(service.port, size), sendfile_rate(path))
                         for _ in range(TRANSFERS)]
                avro.append(statistics.median(a for a, _ in pairs))
                reference.append(statistics.median(r for _, r in pairs))
                transfers += pairs
            service_rate = statistics.median(avro)
            ref_rate = statistics.median(reference)
            line(f"bench.orders: {versions[0]}", f"{size / 1e6:.1f} MB, {RECORDS:,} records")
            line("AVRO mode, one client, MB/s (records/s)",
                 f"{service_rate / 1e6:,.0f} ({service_rate * RECORDS / size:,.0f})")
            line("os.sendfile over loopback (reference), MB/s (records/s)",
                 f"{ref_rate / 1e6:,.0f} ({ref_rate * RECORDS / size:,.0f})")
            line("ratio AVRO mode / sendfile (target >= 0.8)", f"{service_rate / ref_rate:.2f}")
            line("  each run, AVRO mode / sendfile, MB/s",
                 ", ".join(f"{a / 1e6:,.0f} / {r / 1e6:,.0f}" for a, r in zip(avro, reference,
                                                                             strict=True)))
            low_high = [f"{min(t) / 1e6:,.0f} - {max(t) / 1e6:,.0f}" for t in zip(*transfers,
                                                                                 strict=True)]
            line("  range of single transfers, AVRO mode / sendfile, MB/s",
                 " / ".join(low_high))
        if args.only in (None, "json"):
            # The two dialects in turn, so both see the same machine.
            pairs = [(json_rate(service.port, "EXACT"), json_rate(service.port))
                     for _ in range(args.runs)]
            exact, maxscale = [p[0] for p in pairs], [p[1] for p in pairs]
            line(f"JSON mode, records received of {RECORDS:,} per run, both dialects",
                 "all, every run (a missing line fails the run)")
            line("JSON mode, exact dialect, one client, records/s (target >= 100,000)",
                 f"{statistics.median(exact):,.0f}")
            line("JSON mode, maxscale dialect (the default), one client, records/s",
                 f"{statistics.median(maxscale):,.0f}")
            line("  ratio maxscale / exact dialect",
                 f"{statistics.median(maxscale) / statistics.median(exact):.3f}")
            line("  each run, records/s, exact / maxscale",
                 ", ".join(f"{e:,.0f} / {m:,.0f}" for e, m in pairs))
    report_problems(service)  # once it has stopped


def report_problems(service: ServiceProcess) -> None:
    problems = service.problems()
    line(f"service log ({os.path.relpath(service.log_path)})",
         f"{len(problems)} warnings/errors" + (f"; first: {problems[0][24:140]}"
                                               if problems else ""))


# -- latency under load: the clients (processes of their own) -------------------------------

CONNECTING = 16  # connections a client process sets up at once


@dataclass(frozen=True)
class TickPlan:
    batch: int  # rows per transaction
    tx_per_window: int  # transactions committed per sample period
    # the tables written and tailed: transaction k goes to tables[k % N], client i tails
    # tables[i % N]; in each table the ids run on from FIRST_ID, a transaction's rows in a row
    tables: tuple[str, ...] = ("bench.ticks",)

    def transactions(self, table: int, written: int) -> int:
        """How many of the writer's first ``written`` transactions went to ``tables[table]``."""
        n = len(self.tables)
        return written // n + (table < written % n)

    def last_id(self, table: int, written: int) -> int:
        return FIRST_ID + self.transactions(table, written) * self.batch - 1

    def clients_of(self, table: int, clients: int) -> int:
        n = len(self.tables)
        return clients // n + (table < clients % n)


@dataclass
class ClientStats:
    rows: int = 0  # delivered
    undelivered: int = 0  # not delivered by the end of the drain (counted at that time)
    early: int = 0  # rows that arrived before the writer's COMMIT returned
    gaps: int = 0  # a received id past the next one (ids skipped)
    duplicates: int = 0  # rows whose id is below the next one (repeated, or out of order)
    lost: int = 0  # connections that ended before the drain
    max_ns: int = 0  # of the rows received
    max_censored_ns: int = 0
    # (window, bucket) -> rows: received, and not received by the end of the drain
    hist: dict[tuple[int, int], int] = field(default_factory=dict)
    censored: dict[tuple[int, int], int] = field(default_factory=dict)
    # table index -> rows delivered to its clients; -> gaps, duplicates and lost connections
    table_rows: dict[int, int] = field(default_factory=dict)
    table_faults: dict[int, int] = field(default_factory=dict)

    def add(self, window: int, latency_ns: int, rows: int, censored: bool = False) -> None:
        if latency_ns < 0:
            self.early += rows
            latency_ns = 0
        key = (window, _bucket(latency_ns // 1000))
        if censored:
            self.max_censored_ns = max(self.max_censored_ns, latency_ns)
            self.censored[key] = self.censored.get(key, 0) + rows
        else:
            self.max_ns = max(self.max_ns, latency_ns)
            self.hist[key] = self.hist.get(key, 0) + rows

    def fault(self, table: int) -> None:
        self.table_faults[table] = self.table_faults.get(table, 0) + 1


def _bucket(us: int) -> int:
    """Microseconds, kept to three significant digits (under 1 % low)."""
    if us < 1000:
        return us
    scale = 10 ** (len(str(us)) - 3)
    return us // scale * scale


class TailClient(asyncio.Protocol):
    """One JSON-mode connection tailing ``plan.tables[table]``, noting each row's arrival."""

    def __init__(self, plan: TickPlan, commits: Any, stats: ClientStats, table: int = 0
                 ) -> None:
        self.plan = plan
        self.commits = commits
        self.stats = stats
        self.table = table
        self.transport: asyncio.Transport | None = None
        self.phase = 0  # 0: auth sent, 1: REGISTER sent, 2: streaming
        self.closing = False
        self.tail = b""
        self.expected = SEED_ID  # the next id
        self.target = -1  # the drain waits for this id
        self.pending: list[tuple[int, int, int]] = []  # (transaction, rows, arrival)
        loop = asyncio.get_running_loop()
        self.ready = loop.create_future()  # the seed row arrived
        self.done = loop.create_future()  # the target arrived, or the connection ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(auth_message(USER, PASSWORD))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        data = self.tail + data
        if self.phase < 2:
            if not data.endswith(b"\n"):
                self.tail = data
                return
            self.tail = b""
            if data != b"OK\n":
                self._fail(RuntimeError(f"the service replied {data[:200]!r}"))
                return
            assert self.transport is not None
            self.transport.write(b"REGISTER UUID=tail, TYPE=JSON" if self.phase == 0
                                 else b"REQUEST-DATA " + self.plan.tables[self.table].encode())
            self.phase += 1
            return
        cut = data.rfind(b"\n") + 1
        self.tail = data[cut:]
        ids = _ID.findall(data, 0, cut)
        if not ids:
            return  # the schema line
        numbers = list(map(int, ids))
        if numbers == list(range(self.expected, self.expected + len(numbers))):
            runs = [(numbers[0], numbers[-1])]  # the usual case: the next ids, in order
            self.expected = numbers[-1] + 1
        else:
            runs = self._check(numbers)
        if not self.ready.done():
            self.ready.set_result(None)
        for first, last in runs:
            if last >= FIRST_ID:
                rows = last - max(first, FIRST_ID) + 1
                self.stats.rows += rows
                table_rows = self.stats.table_rows
                table_rows[self.table] = table_rows.get(self.table, 0) + rows
                self.account(max(first, FIRST_ID), last, now)
        if self.target >= 0 and self.expected > self.target and not self.done.done():
            self.done.set_result(None)

    def _check(self, numbers: list[int]) -> list[tuple[int, int]]:
        """Ids out of order: count the gaps and duplicates; the runs of new ids."""
        runs: list[tuple[int, int]] = []
        for number in numbers:
            if number < self.expected:
                self.stats.duplicates += 1
                self.stats.fault(self.table)
                continue
            if number > self.expected:
                self.stats.gaps += 1
                self.stats.fault(self.table)
            if runs and runs[-1][1] == number - 1:
                runs[-1] = (runs[-1][0], number)
            else:
                runs.append((number, number))
            self.expected = number + 1
        return runs

    def account(self, lo: int, hi: int, now: int, censored: bool = False) -> None:
        """Rows ``lo..hi`` of the client's table arrived at ``now`` (or, ``censored``, had
        not by then): their latency, per transaction."""
        batch, tables = self.plan.batch, len(self.plan.tables)
        if self.pending:
            self.resolve()
        for nth in range((lo - FIRST_ID) // batch, (hi - FIRST_ID) // batch + 1):
            start = FIRST_ID + nth * batch
            rows = min(hi, start + batch - 1) - max(lo, start) + 1
            tx = nth * tables + self.table  # the writer's transaction
            committed = self.commits[tx]
            if committed:
                self.stats.add(tx // self.plan.tx_per_window, now - committed, rows, censored)
            else:  # the writer's COMMIT has not returned yet: settle it later
                self.pending.append((tx, rows, now))

    def resolve(self) -> None:
        waiting = []
        for tx, rows, arrived in self.pending:
            committed = self.commits[tx]
            if committed:
                self.stats.add(tx // self.plan.tx_per_window, arrived - committed, rows)
            else:
                waiting.append((tx, rows, arrived))
        self.pending = waiting

    def drain_to(self, target: int) -> None:
        self.target = target
        if self.expected > target and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self._fail(ConnectionError(f"connection lost: {exc}"))

    def _fail(self, exc: Exception) -> None:
        for future in (self.ready, self.done):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: whoever waits on it sees it anyway
        if self.transport is not None:
            self.transport.close()


def client_process(port: int, first: int, count: int, plan: TickPlan, commits: Any,
                   pipe: Connection) -> None:
    """Clients ``first`` to ``first + count - 1`` (client i tails ``plan.tables[i % N]``),
    one connection each; tells the parent when all have their table's seed row, waits for
    ``("drain", each table's last id, seconds)``, then sends back its ``ClientStats``."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        raise_nofile(count + 256)
        asyncio.run(_clients(port, first, count, plan, commits, pipe))
    except (OSError, RuntimeError, EOFError) as exc:
        pipe.send(("error", repr(exc)))


async def _clients(port: int, first: int, count: int, plan: TickPlan, commits: Any,
                   pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    stats = ClientStats()
    clients: list[TailClient] = []
    gate = asyncio.Semaphore(CONNECTING)  # connections being set up at once

    async def connect(table: int) -> None:
        async with gate:
            _, client = await loop.create_connection(
                lambda: TailClient(plan, commits, stats, table), "127.0.0.1", port)
            clients.append(client)
            await asyncio.wait_for(client.ready, 60)

    outcomes = await asyncio.gather(
        *(connect(i % len(plan.tables)) for i in range(first, first + count)),
        return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {count} connections failed; the first: "
                           f"{failed[0]!r}")
    pipe.send(("ready", count))
    _, last_ids, seconds = await asyncio.to_thread(pipe.recv)
    for client in clients:
        client.drain_to(last_ids[client.table])
    done, _ = await asyncio.wait([c.done for c in clients], timeout=seconds)
    now = time.monotonic_ns()
    for client in clients:
        if client.done in done and client.done.exception() is not None:
            stats.lost += 1
            stats.fault(client.table)
        client.resolve()  # every COMMIT has returned by now
        client.close()
        missing, last_id = max(client.expected, FIRST_ID), last_ids[client.table]
        if missing <= last_id:  # counted as arriving now: the percentiles become lower bounds
            stats.undelivered += last_id - missing + 1
            client.account(missing, last_id, now, censored=True)
    pipe.send(("result", vars(stats)))  # plain data: this module is __mp_main__ here


# -- latency under load: the writer, the samples, the figures --------------------------------

def latency_part(server: EmbeddedMariaDB, args: argparse.Namespace,
                 load: Callable[[int], object] | None = None, table: str = "bench.ticks",
                 start_gtid: str | None = None) -> None:
    """``load``: run in a thread of its own while the writer commits, given the service's
    port (another workload on the same server, or other clients of the service); the writer
    then stops when it ends, or after the run time. ``start_gtid``: where the service
    starts (the current position by default), which it catches up from before the clients
    connect. ``args.tables`` (default 1): that many tables ``{table}_0`` .. (one: ``table``
    itself); ``args.client_processes`` (default 2): the processes the clients are spread
    over."""
    seconds = args.minutes * 60 if args.minutes else args.seconds
    batch = args.batch
    tx_rate = args.rate / batch
    count = max(1, getattr(args, "tables", 1))
    names = (table,) if count == 1 else tuple(f"{table}_{k}" for k in range(count))
    plan = TickPlan(batch, max(1, round(tx_rate * args.sample)), names)
    start_state = gtid_pos(server) if start_gtid is None else start_gtid
    procs = max(1, min(getattr(args, "client_processes", CLIENT_PROCESSES), args.clients))
    # The service budgets a descriptor per connection (its socket; the streams of a table
    # share one of its version file) beside its reserve, table files and the version files
    # read, and takes the hard limit it inherits; it serves at most --max-connections, and
    # while over half of them are in use, at most max_unauthenticated connections of one
    # address in the login (each client process sets up CONNECTING at once).
    limit = raise_nofile(2 * args.clients + 4096)
    options = ("--max-connections", str(max(2048, args.clients + 64)))
    environment = {"CDCSERVER_LISTENER_MAX_UNAUTHENTICATED": str(max(32, CONNECTING * procs))}
    if SERVICE[0] != THIS_SERVICE:
        environment = {}  # an older tree's service: it has no such limit (and refuses the name)
    with ServiceProcess(server, "latency", 9401, start_state, options, environment) as service:
        server.execute(*(f"CREATE TABLE {name} (id INT AUTO_INCREMENT PRIMARY KEY, "
                         "sent BIGINT)" for name in names),
                       *(f"INSERT INTO {name} VALUES ({SEED_ID}, {time.time_ns()})"
                         for name in names))
        seeded = GtidState.parse(gtid_pos(server))
        service.wait_covers(seeded)
        serves = service.connections_budget()
        if serves is not None and serves < args.clients:
            raise RuntimeError(
                f"the service serves at most {serves:,} connections (its log: "
                f"{service.budget_line()}), fewer than {args.clients:,} clients: it budgets a "
                f"descriptor a connection under the hard RLIMIT_NOFILE it inherits "
                f"({resource.getrlimit(resource.RLIMIT_NOFILE)[1]:,} here, which this "
                f"process could not raise to {2 * args.clients + 4096:,})")
        idle_rss = service.rss_mib()
        planned = int(seconds * tx_rate) + 1
        ctx = multiprocessing.get_context("spawn")
        commits = ctx.RawArray("q", planned)
        pipes, processes = [], []
        first = 0
        for i in range(procs):
            parent_end, child_end = ctx.Pipe()
            share = args.clients // procs + (i < args.clients % procs)
            process = ctx.Process(target=client_process, args=(
                service.port, first, share, plan, commits, child_end))
            process.start()
            first += share
            pipes.append(parent_end)
            processes.append(process)
        try:
            connecting = time.monotonic()
            for pipe in pipes:
                _expect(pipe, "ready", max(180.0, args.clients / 20))
            connected_in = time.monotonic() - connecting
            line(f"latency: {args.clients:,} JSON clients tailing "
                 f"{table if count == 1 else f'{count} tables'}",
                 f"writer {args.rate:,} rows/s as {tx_rate:,.0f} transactions/s of "
                 f"{batch} rows" + (" in turn to each table" if count > 1 else "") +
                 f", {seconds:,.0f} s")
            if count > 1:
                each = args.clients // count
                line("  tables, clients each",
                     f"{names[0]} .. {names[-1]}, "
                     f"{each:,}{'' if args.clients % count == 0 else f'-{each + 1:,}'}")
            if count > 1 or procs != CLIENT_PROCESSES:
                line("  client processes x connections, all connected in",
                     f"{procs} x {args.clients // procs:,}"
                     f"{'' if args.clients % procs == 0 else '+'}, {connected_in:.1f} s "
                     f"(RLIMIT_NOFILE {limit:,}; service --max-connections {options[1]})")
            line("service RSS before the clients connected, MiB", f"{idle_rss:.1f}")
            series: list[Sample] = []
            stop = threading.Event()
            started = time.monotonic()
            cpu_start = service.cpu_seconds()
            pids = [p.pid for p in processes if p.pid]
            each_start = [cpu_seconds(pid) for pid in pids]
            bench_start = time.process_time()
            mariadb = server.process.pid if server.process is not None else None
            mariadb_start = cpu_seconds(mariadb) if mariadb else 0.0
            sampler = threading.Thread(target=_sample, args=(
                service, _domain_sequence(seeded), commits, args.sample, started, stop, series))
            sampler.start()
            loaded = threading.Event()
            if load is not None:
                threading.Thread(target=_run_then_set, args=(load, service.port, loaded),
                                 daemon=True).start()
            written = write_ticks(server, commits, plan, tx_rate, seconds,
                                  loaded if load is not None else None)
            wrote_for = time.monotonic() - started
            cpu = service.cpu_seconds() - cpu_start
            each_cpu = [cpu_seconds(pid) - before
                        for pid, before in zip(pids, each_start, strict=True)]
            bench_cpu = time.process_time() - bench_start
            mariadb_cpu = cpu_seconds(mariadb) - mariadb_start if mariadb else 0.0
            drain = min(120.0, max(10.0, seconds / 2))
            last_ids = [plan.last_id(t, written) for t in range(count)]
            for pipe in pipes:
                pipe.send(("drain", last_ids, drain))
            results = [ClientStats(**_expect(pipe, "result", drain + 60)) for pipe in pipes]
            stop.set()
            sampler.join()
        finally:
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.terminate()
        report_latency(args, results, written, wrote_for, series, plan)
        line("CPU over the writer's run, % of a core: service / clients",
             f"{100 * cpu / wrote_for:.0f} / {100 * sum(each_cpu) / wrote_for:.0f}")
        if count > 1 or procs != CLIENT_PROCESSES:
            line("  each client process, % of a core",
                 ", ".join(f"{100 * c / wrote_for:.0f}" for c in each_cpu))
            line("  this process (writer, sampler) / MariaDB, % of a core",
                 f"{100 * bench_cpu / wrote_for:.0f} / {100 * mariadb_cpu / wrote_for:.0f}")
    report_problems(service)  # once it has stopped


def _run_then_set(work: Callable[[int], object], port: int, done: threading.Event) -> None:
    try:
        work(port)
    finally:
        done.set()


def _expect(pipe: Connection, kind: str, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise TimeoutError(f"no {kind!r} from a client process in {timeout:.0f}s")
    message = pipe.recv()
    if message[0] != kind:
        raise RuntimeError(f"a client process: {message}")
    return message[1]


def write_ticks(server: EmbeddedMariaDB, commits: Any, plan: TickPlan, tx_rate: float,
                seconds: float, until: threading.Event | None = None) -> int:
    """Transactions of ``plan.batch`` rows on a fixed schedule, for ``seconds`` or until ``until``
    is set, transaction k to ``plan.tables[k % N]``; ``commits[k]`` is the monotonic clock when
    transaction k's COMMIT returned. Returns the number committed."""
    conn = server.connect()
    conn.autocommit(False)
    interval = 1 / tx_rate
    total = min(len(commits), int(seconds * tx_rate))
    tables = len(plan.tables)
    start = time.monotonic()
    with contextlib.closing(conn), conn.cursor() as cur:
        for tx in range(total):
            if until is not None and until.is_set():
                return tx
            delay = start + tx * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            first, sent = FIRST_ID + tx // tables * plan.batch, time.time_ns()
            cur.execute(f"INSERT INTO {plan.tables[tx % tables]} (id, sent) VALUES " +
                        ",".join(f"({i},{sent})" for i in range(first, first + plan.batch)))
            conn.commit()
            commits[tx] = time.monotonic_ns()
    return total


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the writer started
    rss: float  # MiB
    lag: float  # seconds: the oldest committed transaction the checkpoint does not cover


def _domain_sequence(state: GtidState) -> int:
    gtid = state.get(0)
    return gtid.sequence if gtid is not None else 0


def _sample(service: ServiceProcess, seeded: int, commits: Any, every: float, started: float,
            stop: threading.Event, series: list[Sample]) -> None:
    """Every ``every`` seconds, and once more at the end: RSS and replication lag. The
    writer's transaction k is GTID 0-1-(seeded + 1 + k): nothing else writes to the server."""

    def measure() -> Sample:
        oldest = _domain_sequence(service.stored()) - seeded  # not stored yet
        now = time.monotonic()
        lag = 0.0
        if oldest < len(commits) and commits[oldest]:
            lag = max(0.0, now - commits[oldest] / 1e9)
        return Sample(now - started, service.rss_mib(), lag)

    while True:
        series.append(measure())
        if stop.wait(every - (time.monotonic() - started) % every):
            if time.monotonic() - started - series[-1].t > 1:  # the end of the drain
                series.append(measure())
            return


def _percentiles(hist: dict[int, int], quantiles: tuple[float, ...]) -> list[float]:
    """Milliseconds at each quantile of a bucket -> rows histogram."""
    total, cumulative, out = sum(hist.values()), 0, []
    keys = iter(sorted(hist))
    key = 0
    for q in quantiles:
        while cumulative < q * total:
            key = next(keys)
            cumulative += hist[key]
        out.append(key / 1000)
    return out


def report_latency(args: argparse.Namespace, results: list[ClientStats], written: int,
                   wrote_for: float, series: list[Sample],
                   plan: TickPlan) -> None:
    rows = written * plan.batch
    line("writer: rows committed (rows/s achieved)",
         f"{rows:,} in {written:,} transactions ({rows / wrote_for:,.0f})")
    delivered = sum(r.rows for r in results)
    tables = len(plan.tables)
    # per table: its rows committed x its clients
    expected_of = [plan.transactions(t, written) * plan.batch * plan.clients_of(t, args.clients)
                   for t in range(tables)]
    expected = sum(expected_of)
    faults = [f"{n:,} {what}" for n, what in (
        (sum(r.gaps for r in results), "gaps"),
        (sum(r.duplicates for r in results), "rows repeated or out of order"),
        (sum(r.lost for r in results), "lost connections")) if n]
    line("rows delivered (all clients), of clients x rows committed",
         f"{delivered:,} of {expected:,}" + (f"; {', '.join(faults)}" if faults else ""))
    if tables > 1:
        got = [sum(r.table_rows.get(t, 0) for r in results) for t in range(tables)]
        faulty = [sum(r.table_faults.get(t, 0) for r in results) for t in range(tables)]
        short = [t for t in range(tables) if got[t] != expected_of[t] or faulty[t]]
        line("  tables whose clients got all their rows once, in order",
             f"{tables - len(short)} of {tables}" + (
                 "; not: " + ", ".join(f"{plan.tables[t]} {got[t]:,} of {expected_of[t]:,}"
                                       f"{f' ({faulty[t]} faults)' if faulty[t] else ''}"
                                       for t in short[:5]) + (", ..." if len(short) > 5 else "")
                 if short else ""))
    received: dict[int, int] = {}
    overall: dict[int, int] = {}
    windows: dict[int, dict[int, int]] = {}
    censored = {window for r in results for window, _ in r.censored}
    for result in results:
        for hist, buckets in ((result.hist, (received, overall)), (result.censored, (overall,))):
            for (window, bucket), count in hist.items():
                for counts in (*buckets, windows.setdefault(window, {})):
                    counts[bucket] = counts.get(bucket, 0) + count
    if not overall:
        line("latency", "no rows committed")
        return
    p50, p99 = _percentiles(overall, (0.5, 0.99))
    worst = max(max(r.max_ns, r.max_censored_ns) for r in results) / 1e6
    undelivered = sum(r.undelivered for r in results)
    line("latency p50 / p99 / max, ms (targets 20 / 100 / -)",
         f"{p50:,.1f} / {p99:,.1f} / {worst:,.1f}" + (" (lower bounds)" if undelivered else ""))
    if undelivered:
        line("  rows not delivered by the drain's end (counted then)", f"{undelivered:,}")
        if received:
            r50, r99 = _percentiles(received, (0.5, 0.99))
            line("  the rows delivered alone: p50 / p99 / max, ms",
                 f"{r50:,.1f} / {r99:,.1f} / {max(r.max_ns for r in results) / 1e6:,.1f}")
    early = sum(r.early for r in results)
    if early:
        line("  rows that arrived before their COMMIT returned (as 0)", f"{early:,}")
    for sample in series:
        window = round(sample.t / args.sample) - 1
        figures = f"RSS {sample.rss:6.1f} MiB, replication lag {sample.lag:5.1f} s"
        if window in windows and sample.t <= wrote_for + args.sample / 2:
            w50, w99 = _percentiles(windows[window], (0.5, 0.99))
            at_least = ">= " if window in censored else ""
            figures += f"; rows committed before: p50 {at_least}{w50:,.0f} ms, " \
                       f"p99 {at_least}{w99:,.0f} ms"
        line(f"  t={sample.t:5.0f} s", figures)
    values = [sample.rss for sample in series]
    line("service RSS first / last / max, MiB",
         f"{values[0]:.1f} / {values[-1]:.1f} / {max(values):.1f}")


# -- main -------------------------------------------------------------------------------------

@contextlib.contextmanager
def private_server(workload: bool) -> Iterator[EmbeddedMariaDB]:
    with fresh_server("listener-mariadb") as server:
        if workload:
            load_workload(server)
        else:
            server.execute("RESET MASTER", "CREATE DATABASE bench")
        yield server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="AVRO and JSON repetitions "
                                                            "(the median is shown)")
    parser.add_argument("--seconds", type=float, default=30.0, help="latency run length")
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="latency run length in minutes (instead of --seconds)")
    parser.add_argument("--clients", type=int, default=200, help="tailing JSON clients")
    parser.add_argument("--tables", type=int, default=1,
                        help="tables tailed (bench.ticks_0 .. N-1; 1: bench.ticks); client i "
                             "tails table i %% N, the writer commits to them in turn")
    parser.add_argument("--client-processes", type=int, default=CLIENT_PROCESSES,
                        help="processes the tailing clients are spread over")
    parser.add_argument("--rate", type=int, default=2000, help="rows/s the writer commits")
    parser.add_argument("--batch", type=int, default=10, help="rows per transaction")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--only", choices=("avro", "json", "latency"))
    parser.add_argument("--service", default=SERVICE[0],
                        help="the cdcserver executable to measure (default: this one's); "
                             "another tree's installed copy, to compare the two with the "
                             "same clients")
    args = parser.parse_args()
    SERVICE[0] = os.path.abspath(args.service)
    os.makedirs(OUT, exist_ok=True)
    if SERVICE[0] == THIS_SERVICE:
        UsersFile(USERS).add(USER, PASSWORD)
    else:  # in the measured tree's own format
        with contextlib.suppress(FileNotFoundError):
            os.remove(USERS)
        subprocess.run([SERVICE[0], "users", "add", USER, "--users-file", USERS,
                        "--password-stdin"], input=PASSWORD.encode(), check=True)
    announce_code_path()
    line("service measured", SERVICE[0])
    with private_server(workload=args.only != "latency") as server:
        if args.only != "latency":
            bulk_parts(server, args)
        if args.only in (None, "latency"):
            latency_part(server, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
