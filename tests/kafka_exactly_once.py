"""Checks of exactly-once delivery shared by the tests and ``bench/bench_kafka_exactly_once.py``:
the service killed (-9) again and again under load, then what a ``read_committed`` consumer
reads compared with the Avro store and with the source.

The oracle is the source (``SELECT``) and the Avro store's records (read with fastavro), never
the sink's own bookkeeping: every stored record (GTID, event number) must be in Kafka exactly
once, each partition in GTID order, and replaying the topics must give the tables.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mariadb_cdc_client.kafka import KafkaChange, KafkaChangeReader
from tests.apache_kafka import free_port
from tests.conftest import Source
from tests.helpers import TcpProxy, pace
from tests.integration.test_kafka_delivery import (
    kafka_file_covers,
    message_positions,
    replay,
    source_rows,
    stored_positions,
)
from tests.server.test_crash import TABLES, Load, ServiceProcess, _service_args


def exactly_once_config(bootstrap: str, source: Source, **extra: Any) -> str:
    db = source.database
    lines = [f'bootstrap = "{bootstrap}"', 'delivery = "exactly-once"',
             f'schema_topic = "{db}.schemas"', f'state_topic = "{db}.state"',
             'topic = "{db}.{table}"', "partitions = 3", "linger_ms = 5"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
    return "[kafka]\n" + "\n".join(lines) + "\n"


async def committed_changes(bootstrap: str, source: Source,
                            tables: tuple[str, ...] = TABLES) -> list[KafkaChange]:
    """Every change a read_committed consumer reads from the tables' topics, to their end
    (their last stable offsets now: a pause of the broker's answers under load is not it)."""
    reader = KafkaChangeReader(bootstrap, [f"{source.database}.{t}" for t in tables],
                               format="databus", schema_topic=f"{source.database}.schemas",
                               isolation_level="read_committed")
    return [c async for c in reader.changes(to_end=True)]


@dataclass
class Figures:
    kills: int
    transactions: int
    messages: int
    duplicates: int
    missing: int
    out_of_order: int
    seconds: float

    def line(self) -> str:
        return (f"exactly-once kill -9: {self.kills} kills, {self.transactions} source "
                f"transactions, {self.messages} messages, {self.duplicates} duplicates, "
                f"{self.missing} gaps, {self.out_of_order} out of order ({self.seconds:.0f} s)")


def check(changes: list[KafkaChange], data_dir: str, source: Source,
          tables: tuple[str, ...] = TABLES) -> tuple[int, int, int]:
    """(duplicates, missing, out of order) of what was read against the store and the
    source; asserts the replayed tables equal the source."""
    seen: Counter[tuple[str, int, str, int]] = Counter(
        (c.topic, c.partition, c.gtid, c.event_number) for c in changes if not c.is_statement)
    duplicates = sum(n - 1 for n in seen.values())
    missing = 0
    for table in tables:
        stored = stored_positions(data_dir, table)
        assert stored, f"nothing stored for {table}"
        missing += len(stored - message_positions(changes, table))
        extra = message_positions(changes, table) - stored
        assert not extra, f"{table}: in Kafka but not in the store: {sorted(extra)[:5]}"
    out_of_order = 0
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for c in sorted(changes, key=lambda c: (c.topic, c.partition, c.offset)):
        if c.is_statement:
            continue
        order = (int(c.gtid.split("-")[2]), c.event_number)
        before = last.get((c.topic, c.partition))
        if before is not None and order <= before:
            out_of_order += 1
        last[(c.topic, c.partition)] = order
    state = replay(changes)
    if "orders" in tables:
        assert {k: (r["amount"], r["note"]) for k, r in state["orders"].items()} == {
            k: (amount, note) for k, amount, note in
            source_rows(source, "orders", "amount, note").values()}
    if "line_items" in tables:
        assert {k: r["qty"] for k, r in state["line_items"].items()} == {
            k: qty for k, qty in source_rows(source, "line_items", "qty").values()}
    return duplicates, missing, out_of_order


async def kill_loop(tmp: str, source: Source, users_file: str, bootstrap: str, kills: int,
                    seed: int, catch_up: float = 300.0) -> Figures:
    """``kills`` times: start the service (exactly-once), kill -9 it at a random instant
    while the load writes; then let it catch up and compare."""
    began = time.monotonic()
    os.makedirs(tmp, exist_ok=True)
    data_dir = os.path.join(tmp, "data")
    config = os.path.join(tmp, "kafka.toml")
    with open(config, "w") as f:
        f.write(exactly_once_config(bootstrap, source))
    load = Load(source, seed=seed, big=500, pause=0.002)
    load.create()
    load.start()
    args = [*_service_args(data_dir, source, users_file), "--config", config]
    service = ServiceProcess(args, os.path.join(tmp, "service.log"))
    chance = random.Random(seed)
    pause = threading.Event()  # never set: a timer for the random kill instants
    print(f"kill loop: seed {seed}, {kills} kills")
    try:
        for kill in range(kills):
            service.start()
            await asyncio.to_thread(pause.wait, chance.uniform(0.5, 2.5))
            service.kill()
            if kill == kills // 2:
                load.alter()
    finally:
        load.finish()
    health_port = free_port()
    service.args = [*service.args, "--metrics-listen", f"127.0.0.1:{health_port}"]
    service.start()
    try:
        # A heartbeat a second, as a live source has: the repair of the ALTER (read beside
        # the stream) rides on a transaction after its read (docs/repairs.md)
        await _caught_up(data_dir, source, lambda: _health(health_port), seed, service.log,
                         catch_up, heartbeat=1.0)
        await _caught_up(data_dir, source, lambda: _health(health_port), seed, service.log,
                         catch_up, heartbeat=None)  # the heartbeats' too
    finally:
        assert service.terminate() == 0
    changes = await committed_changes(bootstrap, source)
    duplicates, missing, out_of_order = check(changes, data_dir, source)
    return Figures(kills, load.transactions, len(changes), duplicates, missing, out_of_order,
                   time.monotonic() - began)


async def _caught_up(data_dir: str, source: Source, health: Callable[[], str], seed: int,
                     log: str, catch_up: float, heartbeat: float | None) -> None:
    """Until Kafka's committed position covers what the source holds now; a row in
    ``audit`` every ``heartbeat`` seconds meanwhile (None: none)."""
    target = source.gtid_state()
    deadline = time.monotonic() + catch_up
    beat = time.monotonic()
    while not await asyncio.to_thread(kafka_file_covers, data_dir, target):
        if time.monotonic() > deadline:
            raise AssertionError(f"the Kafka commits did not catch up (seed {seed}); "
                                 f"see {log}; /health: {await asyncio.to_thread(health)}")
        if heartbeat is not None and time.monotonic() > beat + heartbeat:
            beat = time.monotonic()
            await asyncio.to_thread(source.execute, f"INSERT INTO `{source.database}`.audit "
                                    "(what) VALUES ('heartbeat')")
        await pace(0.2)


def _health(port: int) -> str:
    """The service's /health, as it answers (for a failure's message)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.read().decode()
    except OSError as error:
        return f"no answer: {error}"


class _Writer:
    """Writes to the source from a thread, a step every ``interval`` seconds, until
    stopped (:meth:`step` says what)."""

    interval = 0.01

    def __init__(self, source: Source) -> None:
        self.source = source
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__,
                                        daemon=True)

    def create(self) -> None:
        """The tables, before the thread starts."""

    def start(self) -> None:
        self.create()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = self.source.server.connect(self.source.database)
        with conn.cursor() as cur:
            while not self._stop.wait(self.interval):
                self.step(cur)
                conn.commit()
        conn.close()

    def step(self, cur: Any) -> None:
        raise NotImplementedError


class RowWriter(_Writer):
    """Inserts rows into ``items``, 50 to a transaction."""

    written = 0

    def create(self) -> None:
        self.source.execute(f"CREATE TABLE `{self.source.database}`.items "
                            "(id INT PRIMARY KEY, body TEXT)")

    def step(self, cur: Any) -> None:
        cur.executemany("INSERT INTO items (id, body) VALUES (%s, %s)",
                        [(self.written + i, "x" * 200) for i in range(1, 51)])
        self.written += 50


class CascadeWriter(_Writer):
    """A parent with three children, then the parent deleted (InnoDB deletes the children
    without row events: a repair each), every 20 ms."""

    interval = 0.02
    parents = 0

    def create(self) -> None:
        db = self.source.database
        self.source.execute(f"CREATE TABLE `{db}`.parent (id INT PRIMARY KEY) ENGINE=InnoDB",
                            f"CREATE TABLE `{db}`.child (id INT PRIMARY KEY, pid INT, "
                            "FOREIGN KEY (pid) REFERENCES parent (id) ON DELETE CASCADE) "
                            "ENGINE=InnoDB")

    def step(self, cur: Any) -> None:
        n = self.parents + 1
        cur.execute("INSERT INTO parent VALUES (%s)", (n,))
        cur.executemany("INSERT INTO child VALUES (%s, %s)", [(n * 10 + i, n) for i in range(3)])
        cur.connection.commit()
        cur.execute("DELETE FROM parent WHERE id = %s", (n,))
        self.parents = n


async def items_exactly_once(bootstrap: str, source: Source, written: int) -> int:
    """The ``items`` rows a read_committed consumer reads: each written row once, in order
    of id within each partition (ids grow with the GTIDs); returns how many messages."""
    changes = await committed_changes(bootstrap, source, ("items",))
    ids = [c.after["id"] for c in changes if c.after is not None]
    if written > 0 and len(ids) != len(set(ids)):
        raise PublishedTwice("a row was published twice:\n" + _twice(changes) + "\n" +
                             await _state_records(bootstrap, f"{source.database}.state"),
                             _copies(changes))
    assert written > 0
    missing = sorted(set(range(1, written + 1)) - set(ids))
    assert not missing and set(ids) <= set(range(1, written + 1)), \
        f"{len(missing)} rows missing of {written} (first {missing[:10]}), " \
        f"{len(set(ids) - set(range(1, written + 1)))} not written"
    by_partition: dict[int, list[int]] = {}
    for c in sorted(changes, key=lambda c: (c.partition, c.offset)):
        if c.after is not None:
            by_partition.setdefault(c.partition, []).append(c.after["id"])
    assert all(p == sorted(p) for p in by_partition.values()), "out of order"
    return len(ids)


class PublishedTwice(AssertionError):
    """Rows read twice; ``copies``: (partition, offset) of each copy of the first ones."""

    def __init__(self, message: str, copies: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.copies = copies


def _read_twice(changes: list[KafkaChange]) -> list[list[KafkaChange]]:
    """The copies of each row read more than once, in the order read."""
    copies: dict[int, list[KafkaChange]] = {}
    for c in changes:
        if c.after is not None:
            copies.setdefault(c.after["id"], []).append(c)
    return [found for found in copies.values() if len(found) > 1]


def _copies(changes: list[KafkaChange], rows: int = 5) -> list[tuple[int, int]]:
    """Where the copies of the first ``rows`` rows read twice are, and of the last one."""
    twice = _read_twice(changes)
    return sorted({(c.partition, c.offset) for found in twice[:rows] + twice[-1:]
                   for c in found})


def _twice(changes: list[KafkaChange]) -> str:
    """The first rows read twice and the last: where each copy is, and its source
    transaction."""
    twice = _read_twice(changes)
    return f"{len(twice)} rows twice; the first and the last:\n" + "\n".join(
        "  id " + str(found[0].after["id"]) + ": " + ", ".join(  # type: ignore[index]
            f"partition {c.partition} offset {c.offset} ({c.gtid})" for c in found)
        for found in twice[:5] + twice[-1:])


async def _state_records(bootstrap: str, topic: str) -> str:
    """The exactly-once sink's state topic as a read_committed consumer and a
    read_uncommitted one see it (their last records): which commits the brokers hold, and
    records of transactions not committed (an offset only the second lists)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    described = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, max(end - 200, 0))
            records = []
            async with asyncio.timeout(30):
                while await consumer.position(tp) < end:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    records += batch.get(tp, [])
        finally:
            await consumer.stop()
        described.append(f"{topic} {isolation}, end {end}, its last records:\n" + "\n".join(
            f"  {r.offset}: {r.value.decode()[:160] if r.value else None}"
            for r in records[-8:]))
    return "\n".join(described)


async def rewinds_once_caught_up(running: Any, source: Source, timeout: float) -> int:
    """The Kafka sink's rewinds, once its checkpoint covers what the source logged."""
    from tests.integration.test_kafka import kafka_caught_up

    await kafka_caught_up(running, source, timeout=timeout)
    sink = running.service.replication.sink("kafka")
    assert sink is not None
    return int(sink.stats.rewinds)


@dataclass
class Outage:
    away: float  # seconds the broker was down
    written: int  # rows written meanwhile and around
    messages: int
    rewinds: int


async def broker_outage(broker: Any, source: Source, users_file: str, data_dir: str,
                        away: float, transaction_timeout: float = 60.0,
                        proxy: TcpProxy | None = None, host: Any = None,
                        link: str = "partition") -> Outage:
    """The service publishes exactly once to ``broker`` (an ``ApacheKafka`` of its own)
    while rows are written; the broker is killed (-9) and stays down ``away`` seconds, then
    starts again on its log; or, with ``proxy`` (in front of the broker, which advertises
    it), the broker runs on but cannot be reached for ``away`` seconds; or, with ``host``
    (the ``tests/netfault.Host`` the broker runs in), the link to it fails for ``away``
    seconds as ``link`` says: ``partition`` drops every packet both ways, ``half-open``
    only the broker's answers, ``slow`` holds every packet 30-130 ms and lets a quarter
    through at once, reordered. Every row must reach a read_committed consumer once."""
    from tests.conftest import make_config, start_service

    db = source.database
    config = make_config(data_dir, source.url, users_file, kafka={
        "bootstrap": broker.bootstrap, "delivery": "exactly-once", "request_timeout": 5.0,
        "transaction_timeout": transaction_timeout,
        "schema_topic": f"{db}.schemas", "state_topic": f"{db}.state",
        "topic": "{db}.{table}", "partitions": 3})
    with _TimedLog() as sink_log:
        running = await start_service(config)
        writer = RowWriter(source)
        try:
            writer.start()
            await pace(2.0)
            if proxy is not None:
                proxy.refuse = True
                proxy.cut()
                await pace(away)
                proxy.refuse = False
            elif host is not None:
                if link == "half-open":  # the broker hears the service, its answers are lost
                    host.half_open(inbound=False)
                elif link == "slow":
                    host.slow(80, jitter_ms=50, reorder=25)
                else:
                    host.partition()
                await pace(away)
                host.heal()
            else:
                await asyncio.to_thread(broker.kill, 1)
                await pace(away)
                await asyncio.to_thread(broker.start, 1)
            await pace(2.0)
            writer.stop()
            rewinds = await rewinds_once_caught_up(running, source, timeout=300)
        finally:
            writer.stop()
            await running.stop()
        messages = await items_once_on(broker, source, writer.written, sink_log)
    return Outage(away, writer.written, messages, rewinds)


async def items_once_on(broker: Any, source: Source, written: int,
                        sink_log: _TimedLog | None = None) -> int:
    """:func:`items_exactly_once` on a single ``broker``; failing, the message adds the
    broker's warnings and, for rows read twice, the batches it stored and the sink's log."""
    try:
        return await items_exactly_once(broker.bootstrap, source, written)
    except PublishedTwice as exc:
        logged = f"\nthe sink's log:\n{sink_log.text()}" if sink_log is not None else ""
        raise AssertionError(f"{exc}\n{_transaction_lines(broker.log_files())}\n"
                             f"{_stored_batches(broker, source.database, exc.copies)}"
                             f"{logged}") from None
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_transaction_lines(broker.log_files())}") from None


def _stored_batches(broker: Any, db: str, copies: list[tuple[int, int]]) -> str:
    """The batches the (single) broker stored: the state topic's, and those around each copy
    of a row read twice, with the producer epoch that wrote each and every marker."""
    from tests import kafka_segments

    (node,) = broker.nodes.values()
    parts = [kafka_segments.described(node.data_dir / f"{db}.state-0")]
    for partition in sorted({p for p, _ in copies}):
        offsets = tuple(o for p, o in copies if p == partition)
        parts.append(kafka_segments.described(node.data_dir / f"{db}.items-{partition}",
                                              offsets))
    return "the batches the broker stored (first-last offsets):\n" + "\n".join(parts)


class _TimedLog(logging.Handler):
    """The sink's and aiokafka's log lines of one test, with their times (the captured log
    has none), for a failure's message."""

    LOGGERS = ("cdcserver.sinks.kafka", "cdcserver.app.runner", "aiokafka")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        formatter = logging.Formatter("%(asctime)s.%(msecs)03d UTC %(name)s %(levelname)s "
                                      "%(message)s", "%H:%M:%S")
        formatter.converter = time.gmtime
        self.setFormatter(formatter)
        self.lines: list[str] = []
        self._levels: dict[str, int] = {}
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            if not logger.isEnabledFor(logging.INFO):
                logger.setLevel(logging.INFO)
            logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record)[:400])

    def text(self, last: int = 60) -> str:
        return "\n".join(f"  {line}" for line in self.lines[-last:])

    def __enter__(self) -> _TimedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).removeHandler(self)
            logging.getLogger(name).setLevel(level)
        super().close()


def _transaction_lines(paths: list[str], last: int = 40) -> str:
    """The brokers' last warnings and errors, and what their transaction coordinators said
    after starting."""
    lines = []
    for path in paths:
        with open(path, errors="replace") as f:
            lines += [f"  {path.rsplit('/', 1)[-1]}: {line.rstrip()[:300]}" for line in f
                      if " WARN " in line or " ERROR " in line or
                      ("TransactionCoordinator" in line and "Elected" not in line)]
    return "the brokers' warnings and transaction coordinators (last lines):\n" + \
        "\n".join(lines[-last:])
