"""Latency, this service beside Debezium (issue 53): at a fixed rate of inserts, the time from
a transaction's commit to a consumer receiving its rows' messages; ``bench_peers.py
--latency`` runs it after the throughput part.

For each tool in turn (one after the other, as the throughput part): ``RESET MASTER`` and a
new, empty ``latency.orders`` (bench/common.py's table); the tool started on it as in the
throughput part (peers_tools.service_running, debezium_running: the same producers, its
table's topic created beforehand) and a consumer (aiokafka) of that topic from its end. One
warm-up row is written and waited for: the tool's start-up (a JVM's, the connection, the
schema) is not in the figures. Then, for each rate, a writer in a process of its own (not to
share this one's interpreter lock with the consumer) inserts rows at that rate for
``seconds``: every 10 ms tick, the rows due by then in one multi-row INSERT and one
transaction, their ids given by the writer; ``time.time()`` as the COMMIT is sent is each
of the batch's rows' commit time (no tool can have its rows before; read once the COMMIT
returned, it came after the consumer's receipt on a loaded machine, a negative latency). The
figures include the commit's own round trip, the same for both tools. The consumer notes
``time.time()`` when a fetch hands it messages and reads the
row id from each message's key (both tools' keys: Connect's JSON envelope, ``payload.id``);
a row's latency is its first receipt's time minus its commit time. Per tool and rate: the
rows written, the rate reached, p50, p99 and the max in ms, and the rows not received within
a bounded wait after the writer stops; then the ratio of the p99s, service/Debezium, beside
issue 53's goal (at most half). Writer, consumer, MariaDB, Kafka and the tool share this
machine's cores: the figures include their contention.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

import pymysql

from bench import peers_tools as peers
from bench.common import CREATE, line
from bench.peers_memory import Peaks
from bench.peers_tools import Producer, Running
from cdcserver.app.embedded import EmbeddedMariaDB

DATABASE = "latency"
RATES = (1_000, 10_000)
TICK = 0.01  # seconds between the writer's transactions
LATENCY_GOAL = 0.5  # issue 53: the service's p99 at most half of Debezium's
WRITER_SHORT = 0.95  # a writer below this share of the rate asked is flagged: not that rate
DRAIN = 60.0  # seconds the consumer may take, after the writer stops, to receive every row

Starter = Callable[[list[str]], AbstractContextManager[Running]]


@dataclasses.dataclass(frozen=True)
class Latency:
    tool: str
    rate: int  # rows/s asked for
    written: int
    reached: float  # rows/s the writer reached
    latencies: list[float]  # ms, one per row received
    missing: int  # rows written but not received

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")

    @property
    def p50(self) -> float:
        return self.percentile(0.50)

    @property
    def p99(self) -> float:
        return self.percentile(0.99)

    @property
    def max(self) -> float:
        return max(self.latencies, default=float("nan"))


def fresh_table(server: EmbeddedMariaDB) -> None:
    """An empty ``latency.orders`` as the binlog's whole content, so a tool reading it from its
    start is at once streaming live."""
    server.execute(f"DROP DATABASE IF EXISTS {DATABASE}", "RESET MASTER",
                   f"CREATE DATABASE {DATABASE}",
                   CREATE.replace("bench.orders", f"{DATABASE}.orders"))


# -- the writer (in a process of its own) -----------------------------------------------------

_INSERT = (f"INSERT INTO {DATABASE}.orders (id, big, name, amount, created, body, score, attrs) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")


def _row(i: int) -> tuple[object, ...]:
    return (i, i * 7919, f"customer-{i}", f"{i % 100000}.25", "2024-06-15 12:34:56",
            "lorem ipsum dolor sit amet " * 4, i / 3, f'{{"k": {i}}}')


def write_paced(socket: str, first: int, rate: int, seconds: float) -> dict[int, float]:
    """Rows ``first``, ``first + 1``... inserted at ``rate`` rows/s for ``seconds``: at each
    tick, those due by then (a writer late by a tick catches up in the next). Returns each
    row's commit time (``time.time()`` as its COMMIT is sent)."""
    conn = pymysql.connect(unix_socket=socket, user="root", autocommit=False,
                           charset="utf8mb4", ssl_disabled=True)
    committed: dict[int, float] = {}
    start, written = time.monotonic(), 0
    with contextlib.closing(conn), conn.cursor() as cur:
        for ticks in range(1, max(1, round(seconds / TICK)) + 1):
            due = round(rate * ticks * TICK) - written
            ids = range(first + written, first + written + due)
            cur.executemany(_INSERT, [_row(i) for i in ids])  # one multi-row INSERT
            issued = time.time()  # (read after the COMMIT returns, a busy machine may
            conn.commit()  # run the consumer first: a message "before" its commit)
            committed.update(dict.fromkeys(ids, issued))
            written += due
            time.sleep(max(0.0, start + ticks * TICK - time.monotonic()))  # pacing
    return committed


# -- the consumer -----------------------------------------------------------------------------

def row_id(key: bytes | None) -> int:
    """The row id from a message key in Connect's JSON envelope (``{"schema", "payload"}``)."""
    if key is None:
        raise ValueError("a message without a key")
    return int(json.loads(key)["payload"]["id"])


class Receiver:
    """Every message of ``topic`` from its end: each row id's first receipt time."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self.partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.received: dict[int, float] = {}
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_end(*self.partitions)
        for tp in self.partitions:  # the end resolved now, not at the first fetch
            await self.consumer.position(tp)
        self._task = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            now = time.time()
            for messages in batches.values():
                for message in messages:
                    self.received.setdefault(row_id(message.key), now)
            if batches:
                async with self._changed:
                    self._changed.notify_all()

    async def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` rows were received within ``timeout`` seconds."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(
                    lambda: len(self.received) >= count or self._failed()), timeout)
        self._failed()
        return len(self.received) >= count

    def _failed(self) -> bool:
        """Raises what ended the receiving task, if it ended; False otherwise."""
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("the receiver stopped")
        return False

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.consumer.stop()


# -- one tool ---------------------------------------------------------------------------------

async def _measure(server: EmbeddedMariaDB, receiver: Receiver, running: Running, tool: str,
                   rates: tuple[int, ...], seconds: float) -> list[Latency]:
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    results = []
    with ProcessPoolExecutor(1, mp_context=spawn) as writer:
        # the warm-up row: the tool is streaming once it is received
        await loop.run_in_executor(writer, write_paced, server.socket, 1, 100, TICK)
        if not await receiver.wait_for(1, 300):
            running.alive()
            raise RuntimeError(f"{tool}: the warm-up row not received in 300 s")
        first = 2
        for rate in rates:
            started = time.monotonic()
            committed = await loop.run_in_executor(writer, write_paced, server.socket, first,
                                                   rate, seconds)
            reached = len(committed) / (time.monotonic() - started)
            await receiver.wait_for(first - 1 + len(committed), DRAIN)
            running.alive()
            got = receiver.received
            latencies = [(got[i] - t) * 1000 for i, t in committed.items() if i in got]
            results.append(Latency(tool, rate, len(committed), reached, latencies,
                                   len(committed) - len(latencies)))
            first += len(committed)
    return results


async def _with_receiver(server: EmbeddedMariaDB, bootstrap: str, topic: str,
                         producer: Producer, running: Running, tool: str,
                         rates: tuple[int, ...], seconds: float) -> list[Latency]:
    receiver = Receiver(bootstrap, topic, producer.partitions)
    await receiver.start()
    try:
        return await _measure(server, receiver, running, tool, rates, seconds)
    finally:
        await receiver.stop()


def tool_latency(server: EmbeddedMariaDB, bootstrap: str, prefix: str, producer: Producer,
                 start: Starter, tool: str, rates: tuple[int, ...], seconds: float,
                 peaks: Peaks | None = None) -> list[Latency]:
    """One tool's latencies at each rate, on a fresh table (``start``: the tool running,
    given the topics to create; ``peaks``: its peak RSS meanwhile, phase ``latency``)."""
    fresh_table(server)
    topic = f"{prefix}.{DATABASE}.orders"
    with start([topic]) as running, (peaks or Peaks()).phase(tool, "latency", running.pid):
        return asyncio.run(_with_receiver(server, bootstrap, topic, producer, running, tool,
                                          rates, seconds))


def measure(server: EmbeddedMariaDB, bootstrap: str, directory: Path, producer: Producer,
            rates: tuple[int, ...] = RATES, seconds: float = 20.0, *, tuned: bool = True,
            run: str = "", peaks: Peaks | None = None) -> tuple[list[Latency], list[Latency]]:
    """The service's latencies, then Debezium's (``run``: a suffix for the topics' prefixes,
    unique on a shared broker)."""
    svc, dbz = f"svclat{run}", f"dbzlat{run}"

    def service(topics: list[str]) -> AbstractContextManager[Running]:
        return peers.service_running(server, bootstrap, directory / "service", producer,
                               server_id=9401, prefix=svc, topics=topics)

    def debezium(topics: list[str]) -> AbstractContextManager[Running]:
        return peers.debezium_running(server, DATABASE, bootstrap, directory / "debezium", producer,
                                server_id=9402, prefix=dbz, tuned=tuned, topics=topics)

    ours = tool_latency(server, bootstrap, svc, producer, service, peers.SERVICE, rates, seconds,
                        peaks)
    theirs = tool_latency(server, bootstrap, dbz, producer, debezium, peers.DEBEZIUM, rates,
                          seconds, peaks)
    return ours, theirs


# -- the report -------------------------------------------------------------------------------

def report(ours: list[Latency], theirs: list[Latency], seconds: float) -> dict[int, bool]:
    """Print the table and, per rate, the ratio of the p99s; returns the goal per rate."""
    line("latency", f"COMMIT sent -> consumer received, {seconds:g} s per rate, each tool "
                    "streaming live (start-up excluded)")
    line("latency: sharing the machine", "the writer, the consumer, MariaDB, Kafka and the tool")
    print(f"{'tool':<12} {'rows/s asked':>12} {'reached':>9} {'rows':>8} {'missing':>8} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}", flush=True)
    for r in (*ours, *theirs):
        behind = "  writer behind the rate" if r.reached < WRITER_SHORT * r.rate else ""
        print(f"{r.tool:<12} {r.rate:>12,} {r.reached:>9,.0f} {r.written:>8,} {r.missing:>8,} "
              f"{r.p50:>8.1f} {r.p99:>8.1f} {r.max:>8.1f}{behind}", flush=True)
    goals = {}
    for a, b in zip(ours, theirs, strict=True):
        ratio = peers.ratio(a.p99, b.p99)
        goals[a.rate] = ratio <= LATENCY_GOAL and not (a.missing or b.missing)
        line(f"ratio p99 at {a.rate:,} rows/s, service / Debezium",
             f"{ratio:.2f} (goal <= {LATENCY_GOAL:g}: {'met' if goals[a.rate] else 'not met'})")
    return goals

