"""The fault soak (issue 55, item 5), shared by ``bench/bench_faults.py`` and its short
version in the suite (``tests/integration/test_fault_soak.py``).

The differential chaos workload (``tests/chaos.py``: random migrations and row changes)
runs against a MariaDB server in a network namespace of its own (``tests/netfault.py``),
the service (``cdcserver run``, a process of its own) reading it over the namespace's link,
while a seeded scheduler injects one fault after another:

- ``service-kill``: the service killed with -9 and started again;
- ``source-partition``: the link to the source drops every packet, both ways;
- ``source-silent`` / ``service-silent``: a half-open link, one way dropped;
- ``source-loss``: a share of the packets dropped at random;
- ``source-slow``: every packet held up to 300 ms, a quarter let through at once, reordered;
- ``source-kill``: MariaDB killed with -9, started again;
- ``source-restart``: MariaDB stopped cleanly and started again;
- ``disk-eio-write``, ``disk-eio-fsync``, ``disk-erofs``, ``disk-full``: the data
  directory's disk fails under the service (``tests/diskfault``: an ``EIO`` on write or on
  fsync, a file system turned read-only, ``ENOSPC``), then works again;
- ``disk-slow``: every fsync in the data directory takes a second more;
- ``kafka-partition`` / ``kafka-silent`` / ``kafka-slow`` (with a broker in a Host of its
  own): the link to the Kafka broker drops every packet, or only the broker's answers, or
  holds and reorders them as ``source-slow`` does.

With a Kafka broker, the service also publishes every change exactly once (one topic for the
database), and a ``read_committed`` consumer reads the ledger's rows from it at each check:
each number once, in order.

The workload goes on during the network faults (its statements use the server's Unix
socket, which no fault touches). After each fault the soak times how long the service takes
to apply everything the source logged (its recovery). A ledger table gets one row per step,
numbered 1, 2, 3...; the client library's resuming client (``SyncCdcClient.stream``) tails it
through every fault and restart, on the service's fixed port, and each number must arrive
once, in order. At the end every table is rebuilt from its raw JSON stream and compared with
``SELECT`` (``chaos.differences``, with the stream's before-images audited).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdcserver.app.embedded import EmbeddedMariaDB, free_port
from mariadb_cdc_client import SyncCdcClient
from mariadb_cdc_client.kafka import KafkaChangeReader
from mariadb_cdc_client.stream import ChangeRecord
from tests import chaos
from tests.apache_kafka import ApacheKafka
from tests.diskfault import DiskFaults
from tests.netfault import Host

DISK_FAULTS = {"disk-eio-write": "eio-write", "disk-eio-fsync": "eio-fsync",
               "disk-erofs": "erofs", "disk-full": "enospc"}
KINDS = ("service-kill", "source-partition", "source-silent", "service-silent", "source-loss",
         "source-slow", "source-kill", "source-restart", *DISK_FAULTS, "disk-slow")
KAFKA_KINDS = ("kafka-partition", "kafka-silent", "kafka-slow")  # a broker in a Host
SOURCE_USER, SOURCE_PASSWORD = "cdc", "cdc-pw"  # root may log in over the Unix socket only
KAFKA_WAIT = 60.0  # seconds the consumer waits for the ledger's last rows
RECOVERY_LIMIT = 180.0  # seconds after a fault's end before it counts as not recovered
HELD = 10.0  # seconds: a workload step the source held longer is counted


@dataclass
class Figures:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    statements: int = 0
    refused: int = 0
    ledger_rows: int = 0
    recoveries: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds
    unrecovered: list[str] = field(default_factory=list)  # a fault the service never healed
    exits: list[str] = field(default_factory=list)  # the service ended by itself
    unsettled: list[str] = field(default_factory=list)  # a check the service never caught up for
    differences: dict[str, str] = field(default_factory=dict)
    inconsistencies: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    duplicates: int = 0  # ledger rows the resuming client got more than once
    gaps: int = 0  # ledger rows it never got
    out_of_order: int = 0
    kafka_rows: int | None = None  # ledger rows a read_committed consumer read (None: no Kafka)
    kafka_duplicates: int = 0
    kafka_gaps: int = 0
    kafka_out_of_order: int = 0
    kafka_examples: list[str] = field(default_factory=list)  # duplicates, out of order
    held_steps: int = 0  # workload steps the source held over HELD seconds during a fault
    slowest_step: float = 0.0
    checked_after: int = 0  # faults injected when the checks last ran
    peak_rss_mib: float = 0.0  # the service's, the highest of its runs (each ends by a kill)

    @property
    def exact(self) -> bool:
        return not (self.exits or self.unsettled or self.differences or self.inconsistencies
                    or self.unrecovered
                    or self.duplicates or self.gaps or self.out_of_order
                    or self.kafka_duplicates or self.kafka_gaps or self.kafka_out_of_order)

    def recovery_seconds(self) -> list[float]:
        return sorted(s for seconds in self.recoveries.values() for s in seconds)

    def report(self) -> str:
        times = self.recovery_seconds()
        lines = [f"seed {self.seed}: {sum(self.faults.values())} faults {dict(self.faults)}, "
                 f"{self.statements} statements ({self.refused} refused), "
                 f"{len(self.exits)} exits, {len(self.unrecovered)} not recovered, "
                 f"{len(self.unsettled)} checks not settled, "
                 f"{len(self.differences)} tables differ, "
                 f"{sum(self.inconsistencies.values())} stream inconsistencies, ledger "
                 f"{self.ledger_rows} rows: {self.duplicates} duplicates, {self.gaps} gaps, "
                 f"{self.out_of_order} out of order"]
        if self.kafka_rows is not None:
            lines.append(f"  read_committed Kafka consumer: {self.kafka_rows} ledger rows, "
                         f"{self.kafka_duplicates} duplicates, {self.kafka_gaps} gaps, "
                         f"{self.kafka_out_of_order} out of order")
        if times:
            lines.append(f"  recovery: p50 {percentile(times, 50):.1f} s, p99 "
                         f"{percentile(times, 99):.1f} s, max {times[-1]:.1f} s")
        lines.append(f"  the service's peak memory: {self.peak_rss_mib:,.0f} MiB RSS")
        lines += [f"  not recovered after: {u}" for u in self.unrecovered]
        lines += [f"  exit: {e[-500:]}" for e in self.exits]
        lines += [f"  did not settle: {u[-500:]}" for u in self.unsettled]
        lines += [f"  {t}: {d}" for t, d in self.differences.items()]
        lines += [f"  e.g. {e}" for e in self.examples[:5]]
        lines += [f"  Kafka: {e}" for e in self.kafka_examples[:5]]
        return "\n".join(lines)


def percentile(ordered: list[float], p: float) -> float:
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(p) - 1] \
        if p < 100 else ordered[-1]


class LedgerReader:
    """The client library's resuming client, tailing the ledger in a thread of its own."""

    def __init__(self, port: int, table: str, user: str, password: str) -> None:
        self.ids: list[int] = []
        self._client = SyncCdcClient("127.0.0.1", port, user, password, timeout=10.0,
                                     retry_delays=(0.2, 0.5, 1, 2))
        self._table = table
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ledger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:  # one stream for the whole soak: the library reconnects and resumes it
            for event in self._client.stream(self._table):
                if self._stop.is_set():
                    return
                if isinstance(event, ChangeRecord) and event.event_type == "insert":
                    self.ids.append(int(event.values["id"]))
        except BaseException as exc:  # noqa: BLE001 - reported by the soak
            self.error = exc

    def until(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(set(self.ids)) < count and time.monotonic() < deadline:
            if self.error is not None:
                return False
            time.sleep(0.1)
        return len(set(self.ids)) >= count

    def abandon(self) -> None:
        """Stop without waiting (a daemon thread: gone with the process)."""
        self._stop.set()

    def stop(self, wake: Callable[[], None]) -> None:
        """Stop at the next record, which ``wake`` makes."""
        self._stop.set()
        with contextlib.suppress(pymysql.err.MySQLError):
            wake()
        self._thread.join(30)


class Soak:
    def __init__(self, server: EmbeddedMariaDB, host: Host, database: str, data_dir: str,
                 users_file: str, user: str, password: str, seed: int, log_path: str,
                 kafka: ApacheKafka | None = None, kafka_host: Host | None = None,
                 fault_seconds: tuple[float, float] = (2.0, 8.0), pace: float = 0.0) -> None:
        self.server, self.host, self.database = server, host, database
        self.fault_seconds = fault_seconds  # how long each fault lasts, drawn between
        self.pace = pace  # the workload's steps per second during a fault (0: no limit)
        self.kafka, self.kafka_host = kafka, kafka_host
        self.user, self.password = user, password
        self.rng = random.Random(seed)
        self.figures = Figures(seed)
        self.port = free_port()
        url = f"mysql://{SOURCE_USER}:{SOURCE_PASSWORD}@{host.address}:{server.port}"
        args = chaos.service_args(url, data_dir, users_file, 6600 + seed % 1000)
        args[args.index("127.0.0.1:0")] = f"127.0.0.1:{self.port}"  # the client's to resume
        # the data directory's disk fails on the soak's word (tests/diskfault)
        self.disk = DiskFaults(data_dir, os.path.dirname(os.path.abspath(log_path)))
        if kafka is not None:
            config = os.path.join(os.path.dirname(os.path.abspath(log_path)), "kafka.toml")
            with open(config, "w") as f:
                f.write(kafka_config(kafka.bootstrap, database))
            args += ["--config", config]
        # a dead source noticed in 3 heartbeats of 1 s, as in the tests; a disk found
        # working again within a second
        self.faults_log = os.path.join(os.path.dirname(os.path.abspath(log_path)), "faults.log")
        self.service = chaos.Service([*args, "--heartbeat", "1"], log_path,
                                     env={**self.disk.env(),
                                          "CDCSERVER_STORE_DISK_FULL_RETRY": "1"})
        self.conn: Any = None
        self.migrations: chaos.Migrations | None = None
        self.ledger_next = 1

    # -- the workload ----------------------------------------------------------------------

    def _connect(self) -> Any:
        return self.server.connect(self.database)

    def setup(self) -> None:
        self.conn = self._connect()
        self.migrations = chaos.Migrations(self.conn, self.database, self.figures.seed)
        self.migrations.setup()
        with self.conn.cursor() as cur:
            cur.execute("CREATE TABLE _ledger (id INT PRIMARY KEY)")  # not drawn by chaos

    def step(self) -> None:
        assert self.migrations is not None
        self.migrations.step()
        self.ledger_row()

    def ledger_row(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"INSERT INTO _ledger VALUES ({self.ledger_next})")
        self.ledger_next += 1

    def timed_step(self) -> None:
        """A step, noting how long the source held it (a lock the service's session held
        when it was cut off holds the application's statement until the source lets go)."""
        started = time.monotonic()
        self.step()
        took = time.monotonic() - started
        self.figures.slowest_step = max(self.figures.slowest_step, took)
        if took > HELD:
            self.figures.held_steps += 1
        if self.pace:
            time.sleep(max(0.0, started + 1 / self.pace - time.monotonic()))

    def _steps_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.timed_step()

    def _steps_for(self, seconds: float) -> None:
        """Workload steps for ``seconds`` (the source is not faulted: none is held)."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.timed_step()

    def _reconnected(self) -> None:
        """After the source restarted: the workload's session again (its settings too)."""
        assert self.migrations is not None
        with contextlib.suppress(pymysql.err.MySQLError):
            self.conn.close()
        self.conn = self.migrations.conn = self._connect()
        for sql in chaos.SESSION:
            with self.conn.cursor() as cur:
                cur.execute(sql)

    # -- the faults --------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        """One fault, from its start to its end (the workload going on where it can)."""
        seconds = self.rng.uniform(*self.fault_seconds)
        if kind == "service-kill":
            self.note_memory()
            self.service.kill()
            self.service.start()
            self.service.wait_ready(RECOVERY_LIMIT)
        elif kind in ("source-partition", "source-silent", "service-silent", "source-loss",
                      "source-slow"):
            if kind == "source-partition":
                self.host.partition()
            elif kind == "source-loss":
                self.host.lossy(self.rng.choice((10, 25, 40)))
            elif kind == "source-slow":
                self._slow(self.host)
            else:  # the packets into the source's host dropped: the service goes unheard
                self.host.half_open(inbound=kind == "service-silent")
            # the workload in a thread of its own: the fault ends on time even when the
            # source holds a statement meanwhile
            stop = threading.Event()
            workload = threading.Thread(target=self._steps_until, args=(stop,), daemon=True)
            workload.start()
            time.sleep(seconds)
            self.host.heal()
            stop.set()
            workload.join(RECOVERY_LIMIT)
            if workload.is_alive():
                raise RuntimeError(f"a statement stayed held {RECOVERY_LIMIT:.0f} s after "
                                   f"the {kind} ended")
        elif kind in DISK_FAULTS or kind == "disk-slow":
            if kind == "disk-slow":
                self.disk.slow_fsync(1.0)
            else:
                self.disk.inject(DISK_FAULTS[kind])
            self._steps_for(seconds)
            self.disk.heal()
        elif kind in KAFKA_KINDS:
            if self.kafka_host is None:
                raise ValueError(f"{kind} needs a Kafka broker in a Host of its own")
            if kind == "kafka-partition":
                self.kafka_host.partition()
            elif kind == "kafka-slow":
                self._slow(self.kafka_host)
            else:  # the broker hears the service; its answers are lost
                self.kafka_host.half_open(inbound=False)
            self._steps_for(seconds)
            self.kafka_host.heal()
        elif kind in ("source-kill", "source-restart"):
            if kind == "source-kill":
                self.server.kill()
            else:
                self.server.stop()
            time.sleep(self.rng.uniform(0.0, 2.0))
            self.server.start()
            self._reconnected()
        else:
            raise ValueError(kind)
        self.figures.faults[kind] += 1

    def _slow(self, host: Host) -> None:
        """``host``'s link holding each packet up to 300 ms, a quarter let through at once."""
        delay = self.rng.choice((40, 100, 160))
        host.slow(delay, jitter_ms=delay * 0.8, reorder=25, seed=self.rng.randrange(1 << 30))

    def recovered(self) -> float | None:
        """Seconds until the service applied everything the source logged (None: not
        within RECOVERY_LIMIT)."""
        started = time.monotonic()
        if self.service.exited() is not None:
            self.figures.exits.append(self.service.text()[-2000:])
            self.service.start()
            self.service.wait_ready(RECOVERY_LIMIT)
        caught_up = chaos.caught_up(self.service, self.conn, RECOVERY_LIMIT)
        self.note_memory()
        return time.monotonic() - started if caught_up else None

    def note_fault(self, n: int, kind: str, began: float, ended: float,
                   took: float | None) -> None:
        """A line in ``faults.log`` beside the service's log: when each fault began and ended
        (local time, as the service logs), to read that log by."""
        def at(t: float) -> str:
            return datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]

        recovery = "not recovered" if took is None else f"recovered in {took:.1f} s"
        with open(self.faults_log, "a") as f:
            f.write(f"{n} {kind} {at(began)}-{at(ended)} {recovery}\n")

    def note_memory(self) -> None:
        self.figures.peak_rss_mib = max(self.figures.peak_rss_mib, self.service.peak_rss_mib())


async def run(server: EmbeddedMariaDB, host: Host, database: str, data_dir: str,
              users_file: str, user: str, password: str, *, seed: int, faults: int,
              steps_between: tuple[int, int] = (10, 40), log_path: str,
              kinds: tuple[str, ...] = KINDS, every_kind: bool = False,
              check_every: int = 0, kafka: ApacheKafka | None = None,
              kafka_host: Host | None = None,
              fault_seconds: tuple[float, float] = (2.0, 8.0), pace: float = 0.0,
              progress: Callable[[str], None] | None = None,
              checked: Callable[[Figures], None] | None = None) -> Figures:
    """``faults`` faults drawn from ``kinds`` (seeded; with ``every_kind`` each kind once
    first, in a seeded order), ``steps_between`` workload steps before each (and during
    each, at most ``pace`` a second, or as fast as the source takes them); then the
    checks (see the module's description), also after every ``check_every`` faults (0:
    only at the end), each telling ``checked`` the figures so far: a long run cut short
    still has checked figures. With ``kafka`` (in ``kafka_host``, for its kinds of fault)
    the service publishes exactly once, and a read_committed consumer is checked too."""
    soak = Soak(server, host, database, data_dir, users_file, user, password, seed, log_path,
                kafka, kafka_host, fault_seconds, pace)
    figures = soak.figures
    await asyncio.to_thread(soak.setup)
    soak.service.start()
    await asyncio.to_thread(soak.service.wait_ready, RECOVERY_LIMIT)
    await asyncio.to_thread(soak.ledger_row)  # the ledger stored before its reader asks
    if not await asyncio.to_thread(chaos.caught_up, soak.service, soak.conn, 120):
        raise RuntimeError("the service did not catch up with the workload's setup")
    ledger = LedgerReader(soak.port, f"{database}._ledger", user, password)
    try:
        first = soak.rng.sample(kinds, len(kinds)) if every_kind else []
        for n in range(faults):
            for _ in range(soak.rng.randint(*steps_between)):
                await asyncio.to_thread(soak.step)
            kind = first[n] if n < len(first) else soak.rng.choice(kinds)
            began = time.time()
            await asyncio.to_thread(soak.inject, kind)
            ended = time.time()
            took = await asyncio.to_thread(soak.recovered)
            soak.note_fault(n + 1, kind, began, ended, took)
            if took is None:
                figures.unrecovered.append(f"{kind} (fault {n + 1})")
            else:
                figures.recoveries.setdefault(kind, []).append(took)
            if progress is not None and (n + 1) % 10 == 0:
                progress(f"{n + 1} faults")
            if check_every and (n + 1) % check_every == 0 and n + 1 < faults:
                await _check(soak, ledger, figures)
                if checked is not None:
                    checked(figures)
        await _check(soak, ledger, figures)
        await asyncio.to_thread(ledger.stop, soak.ledger_row)  # while the service serves
        soak.note_memory()
        code = soak.service.stop()
        if code != 0:
            figures.exits.append(f"exit code {code} at the end: {soak.service.text()[-2000:]}")
    finally:
        ledger.abandon()
        if soak.service.exited() is None:
            soak.service.kill()
        with contextlib.suppress(pymysql.err.MySQLError):
            soak.conn.close()
    return figures


async def _check(soak: Soak, ledger: LedgerReader, figures: Figures) -> None:
    """Every table against ``SELECT``, the stream's before-images, and the resuming
    client's ledger, from the start of the run until now (the figures are replaced, not
    added to: each check covers the whole run so far)."""
    assert soak.migrations is not None
    await asyncio.to_thread(soak.migrations.complete_prepared)
    figures.statements = len(soak.migrations.log)
    figures.refused = sum(1 for e in soak.migrations.log if e.error)
    if not await asyncio.to_thread(chaos.settled, soak.service, soak.conn, 180):
        figures.unsettled.append(f"after {sum(figures.faults.values())} faults: "
                                 + soak.service.text()[-2000:])
    else:
        audit = chaos.Outcome(figures.seed)
        figures.differences = await chaos.differences(soak.service.port, soak.conn,
                                                      soak.database, soak.user,
                                                      soak.password, audit)
        figures.inconsistencies = audit.inconsistencies
        figures.examples = audit.inconsistency_examples
    figures.ledger_rows = soak.ledger_next - 1
    await asyncio.to_thread(ledger.until, figures.ledger_rows, 60)
    failed = f"the resuming client failed: {ledger.error!r}"
    if ledger.error is not None and failed not in figures.exits:
        figures.exits.append(failed)
    ids = list(ledger.ids)
    with soak.conn.cursor() as cur:
        cur.execute("SELECT id FROM _ledger")
        stored = {int(r[0]) for r in cur.fetchall()}
    figures.duplicates = len(ids) - len(set(ids))
    figures.gaps = len(stored - set(ids)) + len(set(ids) - stored)
    figures.out_of_order = sum(1 for a, b in itertools.pairwise(ids) if b <= a)
    if soak.kafka is not None:
        await _check_kafka(soak.kafka.bootstrap, soak.database, stored, figures)
    figures.checked_after = sum(figures.faults.values())


async def _check_kafka(bootstrap: str, database: str, stored: set[int],
                       figures: Figures) -> None:
    """The ledger's rows as a read_committed consumer reads the database's topic: each stored
    number once, in order within its partition (read to the topic's end, again until every
    one arrived, or a minute)."""
    deadline = time.monotonic() + KAFKA_WAIT
    while True:
        reader = KafkaChangeReader(bootstrap, [database], format="databus",
                                   schema_topic=f"{database}.schemas",
                                   isolation_level="read_committed")
        changes = [c async for c in reader.changes(to_end=True) if c.table == "_ledger"]
        ids = [int(c.after["id"]) for c in changes if c.after is not None]
        if stored <= set(ids) or time.monotonic() > deadline:
            break
    figures.kafka_rows = len(set(ids))
    figures.kafka_duplicates = len(ids) - len(set(ids))
    figures.kafka_gaps = len(stored - set(ids)) + len(set(ids) - stored)
    by_partition: dict[int, list[int]] = {}
    for c in sorted(changes, key=lambda c: (c.partition, c.offset)):
        if c.after is not None:
            by_partition.setdefault(c.partition, []).append(int(c.after["id"]))
    figures.kafka_out_of_order = sum(1 for p in by_partition.values()
                                     for a, b in itertools.pairwise(p) if b <= a)
    counts = Counter(ids)
    figures.kafka_examples = [
        f"ledger row {c.after['id']} again at {c.gtid} (partition {c.partition} offset "
        f"{c.offset})" for c in sorted(changes, key=lambda c: (c.partition, c.offset))
        if c.after is not None and counts[int(c.after["id"])] > 1][:10]


def kafka_config(bootstrap: str, database: str) -> str:
    """The service's [kafka] section: every change exactly once, one topic for the database.
    (A topic per table made one per name the migrations rename a table to: about 6,600
    topics, 19,800 partition directories, by fault 226, and the broker ran out of open
    files; docs/guarantees.md says so to users.)"""
    return "\n".join([
        "[kafka]", f'bootstrap = "{bootstrap}"', 'delivery = "exactly-once"',
        f'schema_topic = "{database}.schemas"', f'state_topic = "{database}.state"',
        'topic = "{db}"', "partitions = 3", "linger_ms = 5", "request_timeout = 5.0",
        ""])


def source_in(host: Host, base_dir: str) -> EmbeddedMariaDB:
    """A MariaDB server listening only inside ``host``, with the service's account."""
    server = EmbeddedMariaDB(base_dir, port=3306, host=host.address, launcher=host.launcher,
                             die_with_parent=True)
    server.start()
    server.execute(f"CREATE USER IF NOT EXISTS {SOURCE_USER} IDENTIFIED BY '{SOURCE_PASSWORD}'",
                   f"GRANT ALL ON *.* TO {SOURCE_USER}")
    return server


def describe(figures: Figures) -> list[tuple[str, str]]:
    """The soak's figures as (label, value) lines."""
    times = figures.recovery_seconds()
    rows = [("faults injected (checked after)",
             f"{sum(figures.faults.values()):,} ({figures.checked_after:,})")]
    rows += [(f"  {kind}", f"{count:,}") for kind, count in sorted(figures.faults.items())]
    rows += [("statements (refused by the source)", f"{figures.statements:,} "
                                                    f"({figures.refused:,})"),
             ("exits of the service by itself (goal 0)", f"{len(figures.exits)}"),
             ("faults not recovered from within 180 s (goal 0)", f"{len(figures.unrecovered)}"),
             ("checks the service did not catch up for within 180 s (goal 0)",
              f"{len(figures.unsettled)}")]
    rows += [("  not recovered from", u) for u in figures.unrecovered[:5]]
    rows += [("tables different from SELECT (goal 0)", f"{len(figures.differences)}")]
    rows += [(f"  {table}", why[:300]) for table, why in list(figures.differences.items())[:5]]
    rows += [("stream inconsistencies (goal 0)", f"{sum(figures.inconsistencies.values())}")]
    rows += [("  e.g.", e[:300]) for e in figures.examples[:5]]
    rows += [(f"workload steps held over {HELD:.0f} s during a fault; the longest (s)",
              f"{figures.held_steps}; {figures.slowest_step:.1f}"),
             ("the service's peak memory, the highest of its runs (RSS, MiB)",
              f"{figures.peak_rss_mib:,.0f}"),
             ("resuming client: ledger rows", f"{figures.ledger_rows:,}"),
             ("  duplicates, gaps, out of order (goal 0)",
              f"{figures.duplicates}, {figures.gaps}, {figures.out_of_order}")]
    if figures.kafka_rows is not None:
        rows += [("read_committed Kafka consumer: ledger rows", f"{figures.kafka_rows:,}"),
                 ("  duplicates, gaps, out of order (goal 0)",
                  f"{figures.kafka_duplicates}, {figures.kafka_gaps}, "
                  f"{figures.kafka_out_of_order}")]
        rows += [("    e.g.", e) for e in figures.kafka_examples[:5]]
    if times:
        rows.append(("recovery after a fault ends: p50 / p99 / max (s)",
                     f"{percentile(times, 50):.1f} / {percentile(times, 99):.1f} / "
                     f"{times[-1]:.1f}"))
        for kind, seconds in sorted(figures.recoveries.items()):
            seconds = sorted(seconds)
            rows.append((f"  {kind}: p50 / max (s)",
                         f"{percentile(seconds, 50):.1f} / {seconds[-1]:.1f}"))
    return rows
