"""Recovery, this service beside Debezium (issue 53): each tool killed with SIGKILL while it
streams a steady write load, started again on the state it left, and what that costs;
``bench_peers.py --recovery`` runs it.

For each tool in turn: ``RESET MASTER`` and a new, empty ``recovery.orders``
(bench/common.py's table), the tool started on it as in the other parts (the same producer
settings, its table's topic created beforehand: peers_tools), a consumer (aiokafka) reading
that topic from its start, and a writer in a process of its own inserting rows at a fixed rate
(peers_latency's rows, one multi-row INSERT and transaction every 10 ms, ids 1, 2, ...) until
the end. Once the rows written during the tool's first start-up are received and its lag
has settled (under 2 s, or after :data:`SETTLE` s), ``kills`` times: :data:`STREAM` seconds of
live streaming, then ``kill -9`` of the tool (the
service: ``cdcserver run`` and every process below it; Debezium: the Kafka Connect worker's
JVM), and at once the same command again on the same state (the service: its data
directory and its ``state_topic`` in Kafka; Debezium: Connect's offsets file and its schema
history file); the next kill comes once the tool has received every row committed by its
restart and its lag is back to normal (at most twice its p99 in the first streaming, or
1 s), then :data:`STREAM` seconds of streaming.
Per kill:

- **publishes again**: from the restart (the command started) to the consumer's receipt of
  the first message beyond the topic's end at the kill (a resent message counts: the tool
  publishes again);
- **caught up**: from the restart to when the first row committed after the restart has been
  received, together with every row before it, within the tool's threshold of its commit (the
  backlog of the downtime drained and the tool live again). The threshold is the larger of
  :data:`LIVE` and twice the tool's own p99 lag (commit to receipt of the row and all before
  it) of the rows committed in the streaming before the first kill and received before it:
  on a loaded machine neither tool keeps a lag
  under a second, and "caught up" means back to its own normal;
- **duplicates**: messages received between this restart and the next (or the end) whose
  (row key, source position) a message already had: the key's ``id`` and the Debezium
  envelope's ``source`` block, ``gtid``, ``file``, ``pos`` and ``row`` (the same change read
  again from the binlog has them all the same; the service fills ``gtid``, Debezium's MySQL
  connector does too when the server has GTIDs).

A row not received while rows :data:`LOST` seconds newer were is given up on (the waits go on
past it). After the writer stops, every row written must be received within :data:`DRAIN` seconds:
the rows that are not are **missing** (a loss, which at-least-once delivery must never
have). Duplicates before the first kill are counted apart (at least once allows them only
after a failure). Per tool: the median and max over the kills of each figure, and the ratios
service/Debezium. Writer, consumer, MariaDB, Kafka and the tool share this machine's cores.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Protocol

import pymysql

from bench import peers_tools as peers
from bench.common import CREATE, line
from bench.peers_latency import TICK, _row
from bench.peers_memory import descendants
from bench.peers_tools import Producer, Stopped
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.lifetime import die_with_parent
from tests import debezium_source
from tests.kafka_connect import producer_settings

DATABASE = "recovery"
RATE = 1_000  # rows/s the writer keeps
STREAM = 4.0  # seconds of live streaming before each kill
SETTLE = 30.0  # seconds at most for the lag to fall under 2 s after the first start-up
LIVE = 1.0  # caught up: a row received within this many seconds of its commit, and all before
WAIT = 300.0  # seconds a tool may take to publish again, or to catch up, after a restart
LOST = 30  # seconds of newer rows received while one is not: that one is taken as lost
DRAIN = 120.0  # seconds every row written may take to be received after the writer stops

_INSERT = (f"INSERT INTO {DATABASE}.orders (id, big, name, amount, created, body, score, attrs) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")


@dataclasses.dataclass(frozen=True)
class Kill:
    republished: float  # seconds from the restart to the first new message received
    caught_up: float  # seconds from the restart to being live again
    duplicates: int  # messages received again after this restart


@dataclasses.dataclass(frozen=True)
class Recovery:
    tool: str
    written: int
    missing: list[int]  # row ids written and never received
    early_duplicates: int  # duplicates before the first kill
    kills: list[Kill]
    steady_p99: float  # seconds: the p99 of its rows' lag before the first kill
    threshold: float  # seconds: the lag it counts as caught up at


    def stat(self, field: str, how: str) -> float:
        values = [getattr(k, field) for k in self.kills]
        if not values:
            return float("nan")
        return float(statistics.median(values) if how == "median" else max(values))


# -- the writer (in a process of its own) -----------------------------------------------------

def write_until(socket: str, rate: int, stop: Any, last: Any, path: str) -> None:
    """Rows 1, 2... inserted at ``rate`` rows/s (peers_latency's pacing) until ``stop`` is
    set; ``last`` holds the last id committed; each row's commit time (``time.time()`` as its
    COMMIT returned) written to ``path`` as JSON at the end."""
    conn = pymysql.connect(unix_socket=socket, user="root", autocommit=False,
                           charset="utf8mb4", ssl_disabled=True)
    committed: dict[int, float] = {}
    start, written, ticks = time.monotonic(), 0, 0
    with contextlib.closing(conn), conn.cursor() as cur:
        while not stop.is_set():
            ticks += 1
            due = round(rate * ticks * TICK) - written
            ids = range(written + 1, written + due + 1)
            if due:
                cur.executemany(_INSERT, [_row(i) for i in ids])
                conn.commit()
                done = time.time()
                committed.update(dict.fromkeys(ids, done))
                written += due
                last.value = written
            time.sleep(max(0.0, start + ticks * TICK - time.monotonic()))
    Path(path).write_text(json.dumps(committed))


# -- the consumer -----------------------------------------------------------------------------

Identity = tuple[int, object, object, object, object]  # id, gtid, file, pos, row


def identity(key: bytes | None, value: bytes | None) -> Identity:
    """A message's row id and source position (Connect's JSON envelopes, with or without
    their ``schema``)."""
    if key is None or value is None:
        raise ValueError("a message without a key or a value")
    k, v = json.loads(key), json.loads(value)
    k, v = k.get("payload", k), v.get("payload", v)
    source = v["source"]
    return (int(k["id"]), source.get("gtid"), source.get("file"), source.get("pos"),
            source.get("row"))


class Tail:
    """Every message of ``topic`` from its start: when each arrived, and its identity."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, lost_after: int) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self.partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                         fetch_max_wait_ms=100)
        # (received, partition, offset, identity) in the order received
        self.messages: list[tuple[float, int, int, Identity]] = []
        self.first: dict[int, float] = {}  # row id -> its first receipt
        self.through = 0  # rows 1..through all received, or given up as lost
        self.lost_after = lost_after  # a row is given up once one this many ids later arrived
        self.top = 0  # the highest row id received
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_beginning(*self.partitions)
        self._task = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            now = time.time()
            for tp, messages in batches.items():
                for m in messages:
                    ident = identity(m.key, m.value)
                    self.messages.append((now, tp.partition, m.offset, ident))
                    self.first.setdefault(ident[0], now)
                    self.top = max(self.top, ident[0])
            while (self.through + 1 in self.first
                   or self.through + 1 <= self.top - self.lost_after):
                self.through += 1  # (a row given up is missing in the figures, if it stays so)

    def check(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("the consumer stopped")

    async def ends(self) -> dict[int, int]:
        ends = await self.consumer.end_offsets(self.partitions)
        return {tp.partition: offset for tp, offset in ends.items()}

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()


# -- the tools, killed and started again ------------------------------------------------------

class Tool(Protocol):
    name: str

    def start(self) -> None: ...
    def kill(self) -> None: ...
    def alive(self) -> None: ...
    def stop(self) -> None: ...


def kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every process below it (found first, then killed: none can
    start another meanwhile, they are stopped with SIGSTOP first)."""
    tree = [pid, *descendants(pid)]
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    tree = list(dict.fromkeys([*tree, *descendants(pid)]))
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


class Service:
    """``cdcserver run`` on a directory of its own, started again on the same directory."""

    name = peers.SERVICE

    def __init__(self, server: EmbeddedMariaDB, bootstrap: str, directory: Path,
                 producer: Producer, prefix: str, server_id: int) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        self.config = directory / "cdcserver.toml"
        self.config.write_text(peers.service_config(server, bootstrap, directory, producer,
                                                    server_id, prefix))
        self.log_path = directory / "cdcserver.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill() and stop()
        self.process = subprocess.Popen(
            [*peers.service_command(), "run", "--config", str(self.config)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent)

    def alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise Stopped(f"cdcserver exited ({self.process.returncode}); see {self.log_path}")

    def kill(self) -> None:
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process.wait()
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None


class Debezium:
    """Debezium's connector in a Connect standalone worker, started again on the same
    offsets and schema history files."""

    name = peers.DEBEZIUM

    def __init__(self, server: EmbeddedMariaDB, bootstrap: str, directory: Path,
                 producer: Producer, prefix: str, server_id: int, tuned: bool) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        debezium_source.create_user(server)
        self.prefix = prefix
        self.worker = debezium_source.worker(
            directory, bootstrap, tuned=tuned,
            producer=producer_settings("all", producer.compression, producer.batch_bytes,
                                       producer.linger_ms))
        self.connector = debezium_source.connector_config(
            server, directory, prefix=prefix, databases=DATABASE, server_id=server_id)

    def start(self) -> None:
        self.worker.start({self.prefix: self.connector})

    def alive(self) -> None:
        try:
            self.worker.check_running(self.prefix)
        except AssertionError as e:
            raise Stopped(str(e)) from None

    def kill(self) -> None:
        kill_tree(self.worker.pid)
        self.worker.stop()  # the process is gone: reaps it, closes its log

    def stop(self) -> None:
        self.worker.stop()


# -- one tool ---------------------------------------------------------------------------------

def fresh_table(server: EmbeddedMariaDB) -> None:
    server.execute(f"DROP DATABASE IF EXISTS {DATABASE}", "RESET MASTER",
                   f"CREATE DATABASE {DATABASE}",
                   CREATE.replace("bench.orders", f"{DATABASE}.orders"))


async def _until(condition: Any, tool: Tool, tail: Tail, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        tool.alive()
        tail.check()
        if time.monotonic() > deadline:
            raise Stopped(f"{tool.name}: {what} not within {timeout:.0f} s")
        await asyncio.sleep(0.05)


Restarts = list[tuple[float, dict[int, int]]]  # each restart's time, the topic's ends at its kill


class _Lag:
    """While the session runs, how long the oldest row not yet received (with every row before
    it) has been committed: the writer's last id noted every 20 ms gives each row's commit
    time within 20 ms (the figures reported use the writer's own times, after)."""

    def __init__(self, tail: Tail, last: Any) -> None:
        self.tail, self.last = tail, last
        self.marks: list[tuple[int, float]] = []  # (last id committed, noted at)

    async def mark(self) -> None:
        while True:
            value = self.last.value
            if not self.marks or value > self.marks[-1][0]:
                self.marks.append((value, time.time()))
            await asyncio.sleep(0.02)

    def age(self) -> float:
        oldest = self.tail.through + 1
        at = bisect.bisect_left(self.marks, (oldest, 0.0))
        return time.time() - self.marks[at][1] if at < len(self.marks) else 0.0


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


async def _streaming(seconds: float, tool: Tool, tail: Tail, each: Any,
                     until: Any = lambda: False) -> None:
    """``seconds`` of the tool streaming (less once ``until()`` is true), checked (and
    ``each`` called) every 50 ms."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        tool.alive()
        tail.check()
        each()
        await asyncio.sleep(0.05)


async def _session(tool: Tool, server: EmbeddedMariaDB, tail: Tail, kills: int, rate: int,
                   ) -> tuple[dict[int, float], Restarts, float]:
    """The tool streaming the writer's rows, killed and restarted ``kills`` times; returns
    each row's commit time, each restart's time with the topic's ends at its kill, and when
    the streaming before the first kill began."""
    spawn = multiprocessing.get_context("spawn")
    stop, last = spawn.Event(), spawn.Value("q", 0)
    fd, times = tempfile.mkstemp(prefix="recovery-", suffix=".json")
    os.close(fd)
    writer = spawn.Process(target=write_until, args=(server.socket, rate, stop, last, times),
                           daemon=True)
    restarts: Restarts = []
    lag = _Lag(tail, last)
    await tail.start()
    marking = asyncio.create_task(lag.mark())
    try:
        tool.start()
        writer.start()
        await _until(lambda: tail.first, tool, tail, "the first row", WAIT)
        initial = last.value  # the backlog of the tool's first start: drained before a kill
        await _until(lambda: tail.through >= initial, tool, tail, "the first rows", WAIT)
        # settled: its lag under 2 s, or what it is after SETTLE s
        await _streaming(SETTLE, tool, tail, lambda: None, until=lambda: lag.age() <= 2 * LIVE)
        live = time.time()
        ages: list[float] = []
        await _streaming(STREAM, tool, tail, lambda: ages.append(lag.age()))
        normal = max(LIVE, 2 * _p99(ages))  # the tool's own lag, while live
        for n in range(kills):
            if n:  # (live again since the last restart) STREAM s before the next kill
                await _streaming(STREAM, tool, tail, lambda: None)
            tool.alive()
            tool.kill()
            await asyncio.sleep(0.1)  # a request the broker had already received, appended
            ends = await tail.ends()
            restarted = time.time()
            tool.start()
            restarts.append((restarted, ends))
            backlog = last.value  # every row committed by the restart

            def published(ends: dict[int, int] = ends) -> bool:
                return any(offset >= ends[p] for _, p, offset, _ in tail.messages[-200:])

            await _until(published, tool, tail, "a message after the restart", WAIT)
            await _until(lambda b=backlog: tail.through > b, tool, tail,
                         "the rows written before the restart", WAIT)
            # live again: its lag back to normal (or WAIT s, caught up then reported as inf)
            await _streaming(WAIT, tool, tail, lambda: None, until=lambda: lag.age() <= normal)
        await asyncio.sleep(STREAM)
        stop.set()
        await asyncio.get_running_loop().run_in_executor(None, writer.join, 60)
        written = last.value
        with contextlib.suppress(Stopped):
            await _until(lambda: tail.through >= written, tool, tail, "every row", DRAIN)
        committed = {int(k): v for k, v in _read_json(times).items()}
        return committed, restarts, live
    finally:
        marking.cancel()
        stop.set()
        if writer.is_alive():
            writer.join(10)
        if writer.is_alive():
            writer.kill()
        await tail.stop()
        tool.stop()
        with contextlib.suppress(OSError):
            os.unlink(times)


def _read_json(path: str) -> dict[str, float]:
    with open(path) as f:
        loaded: dict[str, float] = json.load(f)
    return loaded


def analyse(tool: str, committed: dict[int, float], tail: Tail, restarts: Restarts,
            live: float) -> Recovery:
    """The figures of one tool's session."""
    missing = sorted(set(committed) - set(tail.first))
    # duplicates: a copy of an identity seen before, by the window it was received in
    seen: set[Identity] = set()
    counts = [0] * (len(restarts) + 1)  # [before the first kill, after restart 1, ...]
    starts = [t for t, _ in restarts]
    for received, _, _, ident in tail.messages:
        if ident in seen:
            counts[sum(1 for t in starts if t <= received)] += 1
        seen.add(ident)
    # each row's "every row up to it received by" time (ids are committed in order)
    ids = sorted(committed)
    prefix, through = float("-inf"), {}
    for i in ids:  # (a row never received is reported missing, not waited for here)
        prefix = max(prefix, tail.first.get(i, prefix))
        through[i] = prefix
    # the tool's own steady lag: rows committed once it was live and received (with all
    # before them) before the first kill (a row the kill caught in flight has the kill's lag)
    killed = restarts[0][0] - 0.5 if restarts else float("inf")
    steady = sorted(through[i] - committed[i] for i in ids
                    if live <= committed[i] and through[i] < killed)
    p99 = steady[min(len(steady) - 1, int(0.99 * len(steady)))] if steady else float("nan")
    threshold = max(LIVE, 2 * p99) if steady else LIVE
    kills = []
    nexts = [t for t, _ in restarts[1:]] + [float("inf")]
    for n, (restarted, ends) in enumerate(restarts):
        later = [t for t, p, offset, _ in tail.messages if offset >= ends.get(p, 0)
                 and t >= restarted]
        republished = min(later, default=float("inf")) - restarted
        caught = next((through[i] for i in ids if committed[i] >= restarted
                       and through[i] - committed[i] <= threshold
                       and through[i] < nexts[n]), float("inf"))
        kills.append(Kill(republished, caught - restarted, counts[n + 1]))
    return Recovery(tool, len(committed), missing, counts[0], kills, p99, threshold)


def tool_recovery(server: EmbeddedMariaDB, bootstrap: str, directory: Path,
                  producer: Producer, tool: str, prefix: str, *, kills: int = 3,
                  rate: int = RATE, tuned: bool = True) -> Recovery:
    """One tool's session on a fresh table: ``kills`` kills and restarts."""
    fresh_table(server)
    topic = f"{prefix}.{DATABASE}.orders"
    peers.create_topics(bootstrap, [topic], producer)
    with contextlib.ExitStack() as stack:
        handle: Tool
        if tool == peers.SERVICE:
            handle = Service(server, bootstrap, directory / "service", producer, prefix, 9501)
        else:
            handle = Debezium(server, bootstrap, directory / "debezium", producer, prefix, 9502,
                              tuned)
            stack.enter_context(peers.version_for_debezium(server))

        async def session() -> tuple[dict[int, float], Restarts, float, Tail]:
            tail = Tail(bootstrap, topic, producer.partitions, rate * LOST)  # (in the loop)
            return (*await _session(handle, server, tail, kills, rate), tail)

        committed, restarts, live, tail = asyncio.run(session())
    with open(directory / f"{prefix}.json", "w") as f:  # the raw figures, to look into
        json.dump({"committed": committed, "restarts": restarts, "live": live,
                   "messages": [(t, p, o, i) for t, p, o, i in tail.messages]}, f)
    return analyse(tool, committed, tail, restarts, live)


def measure(server: EmbeddedMariaDB, bootstrap: str, directory: Path, producer: Producer, *,
            kills: int = 3, rate: int = RATE, tuned: bool = True, run: str = ""
            ) -> tuple[Recovery, Recovery, int]:
    """The service's recovery, then Debezium's (``run``: a suffix for the topics' prefixes,
    unique on a shared broker). Returns both and the rate."""
    ours = tool_recovery(server, bootstrap, directory, producer, peers.SERVICE, f"svcrec{run}",
                         kills=kills, rate=rate, tuned=tuned)
    theirs = tool_recovery(server, bootstrap, directory, producer, peers.DEBEZIUM,
                           f"dbzrec{run}", kills=kills, rate=rate, tuned=tuned)
    return ours, theirs, rate


# -- the report -------------------------------------------------------------------------------

def report(ours: Recovery, theirs: Recovery, rate: int) -> dict[str, bool]:
    """Print each kill, then per tool the medians and maxima and the ratios; returns, per
    tool, whether nothing was missing and nothing was sent twice before a kill."""
    line("recovery", f"kill -9 mid-stream at {rate:,} rows/s, restarted at once on the same "
                     f"state; {len(ours.kills)} kill(s) per tool")
    line("recovery: caught up", "the first row committed after the restart received, with "
                                "every row before it, within the tool's threshold")
    for r in (ours, theirs):
        line(f"recovery: {r.tool} threshold", f"{r.threshold:.2f} s: max({LIVE:g} s, twice its "
                                              f"p99 lag before the first kill, "
                                              f"{r.steady_p99:.2f} s)")
    print(f"{'tool':<12} {'kill':>4} {'publishes again s':>18} {'caught up s':>12} "
          f"{'duplicates':>11}", flush=True)
    for r in (ours, theirs):
        for n, k in enumerate(r.kills, 1):
            print(f"{r.tool:<12} {n:>4} {k.republished:>18.2f} {k.caught_up:>12.2f} "
                  f"{k.duplicates:>11,}", flush=True)
    print(f"{'tool':<12} {'rows':>8} {'missing':>8} {'dup. before kills':>18} "
          f"{'publishes again s':>18} {'caught up s':>14} {'duplicates':>14}", flush=True)
    print(f"{'':<12} {'':>8} {'':>8} {'':>18} {'median / max':>18} {'median / max':>14} "
          f"{'median / max':>14}", flush=True)
    for r in (ours, theirs):
        print(f"{r.tool:<12} {r.written:>8,} {len(r.missing):>8,} {r.early_duplicates:>18,} "
              f"{r.stat('republished', 'median'):>8.2f} / {r.stat('republished', 'max'):<7.2f}"
              f" {r.stat('caught_up', 'median'):>6.2f} / {r.stat('caught_up', 'max'):<5.2f}"
              f" {r.stat('duplicates', 'median'):>6,.0f} / {r.stat('duplicates', 'max'):<5,.0f}",
              flush=True)
        if r.missing:
            more = " ..." if len(r.missing) > 20 else ""
            line(f"{r.tool}: rows missing", f"{r.missing[:20]}{more}")
    for field, label in (("republished", "publishes again"), ("caught_up", "caught up"),
                         ("duplicates", "duplicates")):
        med = peers.ratio(ours.stat(field, "median"), theirs.stat(field, "median"))
        top = peers.ratio(ours.stat(field, "max"), theirs.stat(field, "max"))
        line(f"ratio {label}, service / Debezium", f"median {med:.2f}, max {top:.2f}")
    return {r.tool: not r.missing and not r.early_duplicates for r in (ours, theirs)}
