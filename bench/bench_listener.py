"""The listener (issue 7): AVRO mode beside sendfile, JSON rows/s, tail latency and RSS under load.

    .venv/bin/python bench/bench_listener.py [--runs N] [--seconds S | --minutes M]
        [--clients C] [--rate R] [--batch B] [--sample T] [--only avro|json|latency]

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
- `service RSS before the clients connected`: the service's VmRSS, the table just created;
- `writer`: rows and transactions committed, and the rate achieved;
- `rows delivered`: rows all clients received, of clients x rows committed (gaps, duplicates and
  lost connections are reported);
- `latency p50 / p99 / max`: over every row of every client (targets p50 <= 20 ms,
  p99 <= 100 ms); then, if any, the rows not delivered by the end of the drain (and the figures
  over the rows delivered alone), and the rows that arrived before their COMMIT returned;
- `t=... s`: the time series, every T seconds (``--sample``, default 5): the service's VmRSS;
  its replication lag (the age of the oldest committed transaction its checkpoint, written every
  0.2 s, does not cover yet: the part of the latency spent before the listener); and the p50 /
  p99 latency of the rows committed in the T seconds before (``>=``: some were not delivered);
- `service RSS first / last / max`: over those samples (the first: clients connected, writer
  starting);
- `CPU over the writer's run`: the service process's CPU time, and the two client processes',
  in % of one core (the machine has two);
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
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, RECORDS, announce_code_path, line, load_workload
from cdcserver.app.embedded import EmbeddedMariaDB, kill_me_with_my_parent
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile
from cdcserver.store.checkpoint import covered_state
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.wire import auth_message

USER = PASSWORD = "bench"
MIB = 1 << 20
USERS = os.path.join(OUT, "listener-cdcusers")
CLIENT_PROCESSES = 2
TRANSFERS = 7  # a run of the AVRO comparison: the median of this many transfers of each kind
SEED_ID, FIRST_ID = 1, 2  # the row every tailing client sees first; the writer's first id
_ID = re.compile(rb'"id": (\d+)')
_PROBLEM = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (WARNING|ERROR|CRITICAL) ")


# -- the service, as its own process ------------------------------------------------------

class ServiceProcess:
    """``cdcserver run`` on a private data directory, its listener on 127.0.0.1 port 0."""

    def __init__(self, server: EmbeddedMariaDB, name: str, server_id: int,
                 start_gtid: str = "oldest") -> None:
        self.data_dir = os.path.join(OUT, f"listener-{name}")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        os.makedirs(self.data_dir)
        self.log_path = os.path.join(OUT, f"listener-{name}.log")
        exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
        self.args = [exe, "run", "--source", server.url(), "--data-dir", self.data_dir,
                     "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                     "--users-file", USERS,
                     "--server-id", str(server_id), "--start-gtid", start_gtid,
                     "--log-level", "info"]
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> ServiceProcess:
        with open(self.log_path, "wb") as log:
            # killed with this process, even by -9: no service is left behind
            self.process = subprocess.Popen(self.args, stdout=log, stderr=log,
                                            preexec_fn=kill_me_with_my_parent)
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

    def problems(self) -> list[str]:
        """The service's log records at level WARNING and above, so far."""
        return [entry for entry in self._log().splitlines() if _PROBLEM.match(entry)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


# -- latency under load: the clients (a process of their own) -------------------------------

@dataclass(frozen=True)
class TickPlan:
    batch: int  # rows per transaction
    tx_per_window: int  # transactions committed per sample period
    table: str = "bench.ticks"  # the table written and tailed


@dataclass
class ClientStats:
    rows: int = 0  # delivered
    undelivered: int = 0  # not delivered by the end of the drain (counted at that time)
    early: int = 0  # rows that arrived before the writer's COMMIT returned
    gaps: int = 0  # a received id that is not the next one
    lost: int = 0  # connections that ended before the drain
    max_ns: int = 0  # of the rows received
    max_censored_ns: int = 0
    # (window, bucket) -> rows: received, and not received by the end of the drain
    hist: dict[tuple[int, int], int] = field(default_factory=dict)
    censored: dict[tuple[int, int], int] = field(default_factory=dict)

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


def _bucket(us: int) -> int:
    """Microseconds, kept to three significant digits (under 1 % low)."""
    if us < 1000:
        return us
    scale = 10 ** (len(str(us)) - 3)
    return us // scale * scale


class TailClient(asyncio.Protocol):
    """One JSON-mode connection tailing bench.ticks, noting each row's arrival."""

    def __init__(self, plan: TickPlan, commits: Any, stats: ClientStats) -> None:
        self.plan = plan
        self.commits = commits
        self.stats = stats
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
                                 else b"REQUEST-DATA " + self.plan.table.encode())
            self.phase += 1
            return
        cut = data.rfind(b"\n") + 1
        self.tail = data[cut:]
        ids = _ID.findall(data, 0, cut)
        if not ids:
            return  # the schema line
        first, last = int(ids[0]), int(ids[-1])
        if first != self.expected or last - first + 1 != len(ids):
            self.stats.gaps += 1
        self.expected = last + 1
        if not self.ready.done():
            self.ready.set_result(None)
        if last >= FIRST_ID:
            self.stats.rows += last - max(first, FIRST_ID) + 1
            self.account(max(first, FIRST_ID), last, now)
        if self.target >= 0 and self.expected > self.target and not self.done.done():
            self.done.set_result(None)

    def account(self, lo: int, hi: int, now: int, censored: bool = False) -> None:
        """Rows ``lo..hi`` arrived at ``now`` (or, ``censored``, had not by then): their
        latency, per transaction."""
        batch = self.plan.batch
        if self.pending:
            self.resolve()
        for tx in range((lo - FIRST_ID) // batch, (hi - FIRST_ID) // batch + 1):
            start = FIRST_ID + tx * batch
            rows = min(hi, start + batch - 1) - max(lo, start) + 1
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
        if self.transport is not None:
            self.transport.close()


def client_process(port: int, count: int, plan: TickPlan, commits: Any,
                   pipe: Connection) -> None:
    """``count`` tailing connections; tells the parent when all have the seed row, waits for
    ``("drain", last id, seconds)``, then sends back its ``ClientStats``."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_clients(port, count, plan, commits, pipe))
    except (OSError, RuntimeError, EOFError) as exc:
        pipe.send(("error", repr(exc)))


async def _clients(port: int, count: int, plan: TickPlan, commits: Any,
                   pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    stats = ClientStats()
    clients: list[TailClient] = []
    gate = asyncio.Semaphore(16)  # connections being set up at once

    async def connect() -> None:
        async with gate:
            _, client = await loop.create_connection(
                lambda: TailClient(plan, commits, stats), "127.0.0.1", port)
            clients.append(client)
            await asyncio.wait_for(client.ready, 60)

    await asyncio.gather(*(connect() for _ in range(count)))
    pipe.send(("ready", count))
    _, last_id, seconds = await asyncio.to_thread(pipe.recv)
    for client in clients:
        client.drain_to(last_id)
    done, _ = await asyncio.wait([c.done for c in clients], timeout=seconds)
    now = time.monotonic_ns()
    for client in clients:
        if client.done in done and client.done.exception() is not None:
            stats.lost += 1
        client.resolve()  # every COMMIT has returned by now
        client.close()
        missing = max(client.expected, FIRST_ID)
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
    connect."""
    seconds = args.minutes * 60 if args.minutes else args.seconds
    batch = args.batch
    tx_rate = args.rate / batch
    plan = TickPlan(batch, max(1, round(tx_rate * args.sample)), table)
    start_state = gtid_pos(server) if start_gtid is None else start_gtid
    with ServiceProcess(server, "latency", 9401, start_state) as service:
        server.execute(f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, "
                       "sent BIGINT)",
                       f"INSERT INTO {table} VALUES ({SEED_ID}, {time.time_ns()})")
        seeded = GtidState.parse(gtid_pos(server))
        service.wait_covers(seeded)
        idle_rss = service.rss_mib()
        planned = int(seconds * tx_rate) + 1
        ctx = multiprocessing.get_context("spawn")
        commits = ctx.RawArray("q", planned)
        pipes, processes = [], []
        procs = min(CLIENT_PROCESSES, args.clients)
        for i in range(procs):
            parent_end, child_end = ctx.Pipe()
            count = args.clients // procs + (i < args.clients % procs)
            process = ctx.Process(target=client_process,
                                  args=(service.port, count, plan, commits, child_end))
            process.start()
            pipes.append(parent_end)
            processes.append(process)
        try:
            for pipe in pipes:
                _expect(pipe, "ready", 180)
            line(f"latency: {args.clients} JSON clients tailing {table}",
                 f"writer {args.rate:,} rows/s as {tx_rate:,.0f} transactions/s of "
                 f"{batch} rows, {seconds:,.0f} s")
            line("service RSS before the clients connected, MiB", f"{idle_rss:.1f}")
            series: list[Sample] = []
            stop = threading.Event()
            started = time.monotonic()
            cpu_start = service.cpu_seconds()
            clients_cpu_start = sum(cpu_seconds(p.pid) for p in processes if p.pid)
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
            clients_cpu = sum(cpu_seconds(p.pid) for p in processes if p.pid) - clients_cpu_start
            last_id = FIRST_ID + written * batch - 1
            drain = min(120.0, max(10.0, seconds / 2))
            for pipe in pipes:
                pipe.send(("drain", last_id, drain))
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
             f"{100 * cpu / wrote_for:.0f} / {100 * clients_cpu / wrote_for:.0f}")
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
    is set; ``commits[k]`` is the monotonic clock when transaction k's COMMIT returned.
    Returns the number committed."""
    conn = server.connect()
    conn.autocommit(False)
    interval = 1 / tx_rate
    total = min(len(commits), int(seconds * tx_rate))
    start = time.monotonic()
    with contextlib.closing(conn), conn.cursor() as cur:
        for tx in range(total):
            if until is not None and until.is_set():
                return tx
            delay = start + tx * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            first, sent = FIRST_ID + tx * plan.batch, time.time_ns()
            cur.execute(f"INSERT INTO {plan.table} (id, sent) VALUES " +
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
    expected = rows * args.clients
    faults = [f"{n} {what}" for n, what in ((sum(r.gaps for r in results), "gaps"),
                                            (sum(r.lost for r in results), "lost connections"))
              if n]
    line("rows delivered (all clients), of clients x rows committed",
         f"{delivered:,} of {expected:,}" + (f"; {', '.join(faults)}" if faults else ""))
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
    base = os.path.join(OUT, "listener-mariadb")
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(base, port=0, die_with_parent=True)
    server.start()
    try:
        if workload:
            load_workload(server)
        else:
            server.execute("RESET MASTER", "CREATE DATABASE bench")
        yield server
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="AVRO and JSON repetitions "
                                                            "(the median is shown)")
    parser.add_argument("--seconds", type=float, default=30.0, help="latency run length")
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="latency run length in minutes (instead of --seconds)")
    parser.add_argument("--clients", type=int, default=200, help="tailing JSON clients")
    parser.add_argument("--rate", type=int, default=2000, help="rows/s the writer commits")
    parser.add_argument("--batch", type=int, default=10, help="rows per transaction")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--only", choices=("avro", "json", "latency"))
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    UsersFile(USERS).add(USER, PASSWORD)
    announce_code_path()
    with private_server(workload=args.only != "latency") as server:
        if args.only != "latency":
            bulk_parts(server, args)
        if args.only in (None, "latency"):
            latency_part(server, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
