"""A table's existing rows to Kafka: this service's initial snapshot against Debezium's two
snapshot modes (issue 53), while an application writes and an ``ALTER TABLE`` runs.

    .venv/bin/python bench/peers_snapshot.py [--rows N]    (bench_peers.py --snapshot runs it)

One private MariaDB in bench/out and one Apache Kafka broker (bench/peers_tools.py). Table
``snap.orders`` has the standard workload's 8 mixed columns (bench/common.py) and ``--rows``
rows (10,000,000 by default), loaded with ``INSERT ... SELECT`` from ``seq_1_to_N`` outside
the binlog (``sql_log_bin = 0``, then ``RESET MASTER``): only the snapshots carry them. Then,
one tool at a time (they would share the two cores otherwise), each to topics of its own:

- (a) this service, ``[kafka] snapshot = "initial"``, format ``debezium`` with Connect
  schemas: chunked dumps, each table's rows published, then its changes;
- (b) Debezium 3.6.1's MySQL connector in Kafka Connect standalone, ``snapshot.mode =
  initial`` (its default: one consistent read of the table);
- (c) the same connector with ``snapshot.mode = no_data`` and an ``execute-snapshot`` signal
  of type ``incremental`` inserted into its signal table once it streams (its incremental
  snapshot: chunks of ``incremental.snapshot.chunk.size``, 1024 rows by default, interleaved
  with the stream).

While each runs, a writer commits one row into ``snap.orders`` every 100 ms, and when the
topic holds half the rows an ``ALTER TABLE snap.orders ADD COLUMN`` runs. For each tool: the
time from its start until its table topic holds the N rows that were there before it started
(the snapshot's last row; the brokers' high watermarks polled every 50 ms), rows/s over that
time, the writer's longest commit meanwhile, the ALTER's duration (held behind a snapshot's
metadata lock, or not), peak RSS (``VmHWM`` of the process, or the largest sum of ``VmRSS``
over it and its children sampled every 50 ms if larger: the service's with the process that
formats a big table's snapshot, the Connect worker's) and CPU seconds (user and system, its
children's included). Then the ratios service / Debezium's fastest
mode and issue 53's goal: at least 2x faster than Debezium's fastest, without blocking writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import CREATE, OUT, announce_code_path, fresh_server, line
from bench.peers_memory import sampling
from bench.peers_tools import (
    Producer,
    Running,
    Stopped,
    cpu_seconds,
    debezium_running,
    kafka_broker,
    peak_rss_mb,
    ratio,
    service_running,
)
from cdcserver.app.embedded import EmbeddedMariaDB
from tests import debezium_source

ROWS = 10_000_000
DATABASE = "snap"
GOAL = 2.0  # issue 53: at least 2x faster than Debezium's fastest mode, writes not blocked
BLOCKED = 1.0  # seconds: a commit or an ALTER that waited longer was held by the snapshot
WRITE_EVERY = 0.1
SERVICE, INITIAL, INCREMENTAL = "cdcserver", "Debezium initial", "Debezium incremental"


@dataclasses.dataclass(frozen=True)
class Result:
    tool: str
    rows: int  # on its topic when it was done
    seconds: float  # from its start until the table's rows were all on its topic
    max_commit: float  # the writer's longest commit meanwhile
    alter: float  # the ALTER TABLE's duration
    rss_mb: float
    cpu: float  # CPU seconds of the process over the run
    abandoned: str = ""  # why the tool gave its snapshot up before the last row ("": it did not)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    @property
    def blocked(self) -> bool:
        return self.max_commit > BLOCKED or self.alter > BLOCKED


# -- the table and the application ------------------------------------------------------------

def load_table(server: EmbeddedMariaDB, rows: int) -> None:
    """``snap.orders`` with ``rows`` rows, outside the binlog, and Debezium's signal table."""
    server.execute(f"CREATE DATABASE {DATABASE}", CREATE.replace("bench.", f"{DATABASE}."),
                   f"CREATE TABLE {DATABASE}.debezium_signal (id VARCHAR(42) PRIMARY KEY, "
                   "type VARCHAR(32) NOT NULL, data VARCHAR(2048))")
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            step = 1_000_000
            for first in range(1, rows + 1, step):
                last = min(first + step - 1, rows)
                cur.execute(
                    f"INSERT INTO {DATABASE}.orders (id, big, name, amount, created, body, "
                    "score, attrs) SELECT seq, CAST(seq AS SIGNED) * 7919 - 5000000, "
                    "CONCAT('customer-', seq), "
                    "(seq % 1000000) / 100, '2024-01-01 12:34:56' + INTERVAL (seq % 86400) "
                    "SECOND, REPEAT('lorem ipsum dolor sit amet ', 4), seq / 3, "
                    "JSON_OBJECT('k', seq, 'tag', CONCAT('t', seq % 7)) "
                    f"FROM {DATABASE}.seq_{first}_to_{last}")
                conn.commit()
    finally:
        conn.close()
    server.execute("RESET MASTER")


class Abandoned(Stopped):
    """The tool gave the snapshot up and streams on (Debezium's incremental snapshot does
    when the table's columns change under it)."""


class Writer:
    """One row committed every 100 ms; the longest commit (a write queued behind an ALTER
    that waits for a snapshot's metadata lock shows here)."""

    def __init__(self, server: EmbeddedMariaDB) -> None:
        self.server = server
        self.stop = threading.Event()
        self.longest = 0.0
        self.commits = 0
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)

    def _run(self) -> None:
        conn = self.server.connect()
        try:
            with conn.cursor() as cur:
                while not self.stop.wait(WRITE_EVERY):
                    started = time.monotonic()
                    cur.execute(f"INSERT INTO {DATABASE}.orders (big, name, amount, created, "
                                "body, score, attrs) VALUES (1, 'app', 1.00, NOW(), 'x', 1, "
                                "'{}')")
                    conn.commit()
                    self.longest = max(self.longest, time.monotonic() - started)
                    self.commits += 1
        finally:
            conn.close()


def alter(server: EmbeddedMariaDB, column: str) -> float:
    """``ADD COLUMN``; its duration."""
    started = time.monotonic()
    server.execute(f"ALTER TABLE {DATABASE}.orders ADD COLUMN {column} INT NULL")
    return time.monotonic() - started


# -- measuring ------------------------------------------------------------------------------

async def _until_rows(bootstrap: str, topic: str, partitions: int, rows: int,
                      running: Running, on_half: Callable[[], None], timeout: float
                      ) -> tuple[int, float, str]:
    """Until ``topic`` holds ``rows`` messages: how many, after how long, and why the tool
    gave up first if it did."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, metadata_max_age_ms=1000)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        half = False
        while True:
            count = sum((await consumer.end_offsets(assigned)).values())
            now = time.monotonic()
            try:
                running.alive()
            except Abandoned as e:
                return count, now - running.started, str(e)
            if not half and count >= rows // 2:
                half = True
                on_half()
            if count >= rows:
                return count, now - running.started, ""
            if now - running.started > timeout:
                raise Stopped(f"{count:,} of {rows:,} rows on {topic} after {timeout:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


def measure(tool: str, server: EmbeddedMariaDB, bootstrap: str, topic: str, rows: int,
            running: Running, producer: Producer, timeout: float) -> Result:
    """The tool's run, with the writer and the ALTER at half the rows."""
    altered: list[float] = []
    alter_thread: list[threading.Thread] = []
    column = "extra_" + "".join(c for c in tool.lower() if c.isalnum())

    def on_half() -> None:
        thread = threading.Thread(target=lambda: altered.append(alter(server, column)))
        thread.start()
        alter_thread.append(thread)

    with Writer(server) as writer, sampling(running.pid) as sampler:
        count, seconds, abandoned = asyncio.run(_until_rows(
            bootstrap, topic, producer.partitions, rows, running, on_half, timeout))
        # (the process's own peak, or its tree's, the snapshot's formatting process with it)
        cpu = cpu_seconds(running.pid)
        rss = max(peak_rss_mb(running.pid), sampler.peak_mb())
        for thread in alter_thread:
            thread.join(timeout)
    return Result(tool, count, seconds, writer.longest, altered[0] if altered else 0.0,
                  rss, cpu, abandoned)


# -- the tools ------------------------------------------------------------------------------

@contextlib.contextmanager
def service(server: EmbeddedMariaDB, bootstrap: str, directory: Path, producer: Producer,
            prefix: str, topic: str) -> Iterator[Running]:
    """``cdcserver run`` with ``snapshot = "initial"`` on an empty data directory."""
    with service_running(server, bootstrap, directory, producer, server_id=9401,
                         prefix=prefix, topics=[topic],
                         kafka=f'snapshot = "initial"\ninclude = "{DATABASE}.orders"\n'
                         ) as running:
        yield running


@contextlib.contextmanager
def debezium(server: EmbeddedMariaDB, bootstrap: str, directory: Path, producer: Producer,
             prefix: str, topic: str, incremental: bool, tuned: bool, server_id: int
             ) -> Iterator[Running]:
    """Debezium's connector with ``snapshot.mode = initial``, or ``no_data`` and an
    incremental snapshot asked for by a signal once it streams."""
    options: dict[str, object] = {"snapshot.mode": "no_data" if incremental else "initial"}
    if incremental:
        options["signal.data.collection"] = f"{DATABASE}.debezium_signal"
    debezium_source.create_user(server)
    # an incremental snapshot writes its chunks' open and close marks into the signal table
    server.execute(f"GRANT INSERT, UPDATE, DELETE ON {DATABASE}.debezium_signal TO "
                   f"'{debezium_source.USER}'@'127.0.0.1'")
    with debezium_running(server, DATABASE, bootstrap, directory, producer,
                          server_id=server_id, prefix=prefix, tuned=tuned, topics=[topic],
                          options=options) as running:
        if not incremental:
            yield running
            return
        log = directory / "connect.log"

        def alive() -> None:
            running.alive()
            if _gave_up(log):
                raise Abandoned("Debezium: 'Error while executing incremental snapshot ..., "
                                "skipping and continuing streaming' (its log)")

        _signal_once_streaming(server, bootstrap, prefix, alive)
        yield Running(running.pid, running.started, alive)


def _gave_up(log: str | os.PathLike[str]) -> bool:
    with open(log, "rb") as f:
        return b"Error while executing incremental snapshot" in f.read()


def _signal_once_streaming(server: EmbeddedMariaDB, bootstrap: str, prefix: str,
                           alive: Callable[[], None]) -> None:
    """The ``execute-snapshot`` signal, once the connector has written its schema (its
    schema change topic, ``prefix``, has messages: it streams from the position it read
    then, so the signal's insert is seen)."""
    async def schema_written() -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, metadata_max_age_ms=1000)
        await consumer.start()
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                alive()
                if prefix in await consumer.topics():
                    tp = TopicPartition(prefix, 0)
                    if (await consumer.end_offsets([tp]))[tp]:
                        return
                await asyncio.sleep(0.1)
            raise Stopped("Debezium wrote no schema change in 300 s")
        finally:
            await consumer.stop()

    asyncio.run(schema_written())
    server.execute(f"INSERT INTO {DATABASE}.debezium_signal VALUES ('bench-1', "
                   "'execute-snapshot', '{\"data-collections\": [\"" + DATABASE +
                   ".orders\"], \"type\": \"incremental\"}')")


MODES = (SERVICE, INITIAL, INCREMENTAL)


def run_all(server: EmbeddedMariaDB, bootstrap: str, directory: Path, rows: int, *,
            run: str = "", tuned: bool = True, timeout: float = 7200.0,
            producer: Producer | None = None, modes: tuple[str, ...] = MODES
            ) -> list[Result]:
    """(a), (b) and (c) in turn (those of ``modes``) on ``server``, whose ``snap.orders``
    holds ``rows`` rows."""
    producer = producer or Producer()
    results = []
    prefix = f"svc{run}"
    topic = f"{prefix}.{DATABASE}.orders"
    if SERVICE in modes:
        with service(server, bootstrap, directory / "service", producer, prefix,
                     topic) as r:
            results.append(measure(SERVICE, server, bootstrap, topic, rows, r, producer,
                                   timeout))
    for incremental, name, server_id in ((False, INITIAL, 9402), (True, INCREMENTAL, 9403)):
        if name not in modes:
            continue
        prefix = f"{'inc' if incremental else 'dbz'}{run}"
        topic = f"{prefix}.{DATABASE}.orders"
        with debezium(server, bootstrap, directory / prefix, producer, prefix, topic,
                      incremental, tuned, server_id) as r:
            results.append(measure(name, server, bootstrap, topic, rows, r, producer,
                                   timeout))
    return results


def report(results: list[Result]) -> bool:
    """The table, the ratios to Debezium's fastest mode, and the goal met or not."""
    print(f"{'tool':<22} {'rows':>11} {'to last row s':>13} {'rows/s':>10} "
          f"{'max commit s':>12} {'ALTER s':>8} {'peak RSS MB':>11} {'CPU s':>7}", flush=True)
    for r in results:
        print(f"{r.tool:<22} {r.rows:>11,} {r.seconds:>13.1f} {r.rate:>10,.0f} "
              f"{r.max_commit:>12.2f} {r.alter:>8.2f} {r.rss_mb:>11.0f} {r.cpu:>7.1f}"
              + (" gave up" if r.abandoned else ""), flush=True)
    for r in results:
        if r.abandoned:
            line(f"{r.tool} gave its snapshot up", r.abandoned)
    ours = results[0]
    finished = [r for r in results[1:] if not r.abandoned] or results[1:]
    fastest = max(finished, key=lambda r: r.rate)
    speed = ratio(ours.rate, fastest.rate)
    line(f"ratio rows/s, service / {fastest.tool} (the faster)", f"{speed:.2f}")
    line(f"ratio peak RSS, service / {fastest.tool}", f"{ratio(ours.rss_mb, fastest.rss_mb):.2f}")
    line(f"ratio CPU s, service / {fastest.tool}", f"{ratio(ours.cpu, fastest.cpu):.2f}")
    for r in results:
        line(f"{r.tool}: writes and ALTER", "blocked" if r.blocked else
             f"not blocked (longest wait under {BLOCKED:g} s)")
    met = speed >= GOAL and not ours.blocked
    line(f"goal: >= {GOAL:g}x Debezium's fastest mode, writes not blocked",
         "met" if met else "not met")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=ROWS, help="rows in the table")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"which to run, comma-separated (default: {','.join(MODES)})")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(","))
    if set(modes) - set(MODES) or SERVICE not in modes or len(modes) < 2:
        parser.error(f"--modes: {SERVICE} and one or both of Debezium's, among {MODES}")
    announce_code_path()
    os.makedirs(OUT, exist_ok=True)
    with fresh_server("mariadb") as server, kafka_broker() as broker:
        started = time.monotonic()
        load_table(server, args.rows)
        line("table", f"{DATABASE}.orders, {args.rows:,} rows of 8 mixed columns, loaded "
                      f"in {time.monotonic() - started:.0f} s outside the binlog")
        line("tools run", "one after the other; a writer commits a row every 100 ms, an "
                          "ADD COLUMN at half the rows")
        line("machine", f"{os.cpu_count()} cores, shared with other work")
        report(run_all(server, broker.bootstrap, Path(OUT, "peers_snapshot"), args.rows,
                       modes=modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
