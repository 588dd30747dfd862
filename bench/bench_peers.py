"""This service side by side with Debezium (issue 53): streaming throughput, CPU and memory.

    .venv/bin/python bench/bench_peers.py [--rows N] [--runs N] [--compression CODEC]
        [--latency [--latency-seconds S] [--rates R,R]]

One private MariaDB in bench/out and one Apache Kafka broker (tests/apache_kafka.py); the
standard workload (bench/common.py: 200,000 rows inserted into a table of 8 mixed columns,
then 50,000 updated; ``--rows`` inserts that many and updates a quarter) is written first,
after ``RESET MASTER``. Then each tool in turn reads that binlog from its start and publishes
every change to topics of its own, one after the other so that they do not share the two
cores:

- this service: the installed ``cdcserver run``, its Kafka sink in the ``debezium`` format,
  keys and values with their Connect schemas (``key_schema``, ``value_schema``: the same
  messages as Debezium's under Connect's ``JsonConverter``), at least once;
- Debezium 3.6.1's MySQL connector in Kafka Connect standalone (tests/debezium_source.py,
  the JVM as ``connect-standalone.sh`` runs it), at least once (Connect's only delivery for a
  source connector without exactly-once support).

Both producers: ``acks=all``, the same compression, batch size and linger; both tables' topics
created beforehand with the same partitions. For each tool: the time from its start until the
first change is in Kafka (start-up: a JVM's or an interpreter's start, the connection, the
schema; reported apart), then until the last is (the count of messages on its table's topic,
the brokers' high watermarks, polled every 50 ms); changes/s and the process's CPU seconds
(``/proc/<pid>/stat``: user and system, children included) per million changes over that
streaming window; peak RSS (``VmHWM``; the JVM's is the whole worker's). Prints a table and
the ratios service/Debezium with issue 53's goals (throughput at least 3 times Debezium's,
memory at most a quarter of it), each met or not; with ``--runs`` above 1, each tool's run
of median throughput. With ``--latency``, then the time from commit to a consumer's receipt
at fixed rates (bench/peers_latency.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import INSERTS, OUT, announce_code_path, fresh_server, line, load_workload
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from cdcserver.sinks.kafka import connect
from tests import debezium_source
from tests.apache_kafka import ApacheKafka
from tests.kafka_connect import producer_settings

SERVICE, DEBEZIUM = "cdcserver", "Debezium"
THROUGHPUT_GOAL, MEMORY_GOAL = 3.0, 0.25  # issue 53: >= 3x the changes/s, <= 1/4 the RSS
POLL = 0.05
_TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Producer:
    """What both tools' producers are given."""

    compression: str = "lz4"
    batch_bytes: int = 256 * 1024  # the service's max_batch_bytes default
    linger_ms: int = 5  # the service's default, and Kafka 4 clients'
    partitions: int = 3  # of each table topic (the service's default for debezium)


@dataclasses.dataclass(frozen=True)
class Result:
    tool: str
    changes: int  # messages on the tool's table topic at the end
    startup: float  # seconds from the process's start to the first change in Kafka
    streaming: float  # seconds from then to the last change in Kafka
    streamed: int  # changes acknowledged in that window
    cpu: float  # CPU seconds of the process (children included) in that window
    rss_mb: float  # peak RSS of the process

    @property
    def rate(self) -> float:
        return self.streamed / self.streaming if self.streaming > 0 else float("inf")

    @property
    def cpu_per_million(self) -> float:
        return self.cpu / self.streamed * 1e6 if self.streamed else float("nan")


class Stopped(RuntimeError):
    """A tool's process ended, or did not deliver every change in time."""


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` and its waited-for children (proc(5): fields 14-17)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / _TICK


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for row in f:
            if row.startswith("VmHWM:"):
                return int(row.split()[1]) / 1024
    raise Stopped(f"no VmHWM for process {pid}")


def write_workload(server: EmbeddedMariaDB, database: str, rows: int = INSERTS) -> int:
    """``rows`` inserted into ``database``.orders, a quarter of them updated (after ``RESET
    MASTER``: the binlog both tools read from its start). Returns the row changes."""
    return load_workload(server, inserts=rows, database=database)


def create_topics(bootstrap: str, topics: list[str], producer: Producer) -> None:
    config = KafkaConfig(bootstrap=bootstrap)
    asyncio.run(connect.create_topics(config, topics, producer.partitions))


async def _watch(bootstrap: str, topic: str, partitions: int, expected: int, pid: int,
                 started: float, alive: Callable[[], None], timeout: float) -> Result:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    # (the partitions are known: create_topics made them; the client's own metadata of a new
    # topic waits for metadata_max_age_ms, 5 minutes by default)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, metadata_max_age_ms=1000)
    await consumer.start()
    try:
        deadline = started + timeout
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        first: tuple[float, int, float] | None = None
        while True:
            alive()
            count = sum((await consumer.end_offsets(assigned)).values())
            now, cpu = time.monotonic(), cpu_seconds(pid)
            if first is None and count:
                first = (now, count, cpu)
            if count >= expected and first is not None:
                return Result("", count, first[0] - started, now - first[0],
                              count - first[1], cpu - first[2], peak_rss_mb(pid))
            if now > deadline:
                raise Stopped(f"{count:,} of {expected:,} changes on {topic} after "
                              f"{timeout:.0f} s")
            await asyncio.sleep(POLL)
    finally:
        await consumer.stop()


def watch(bootstrap: str, topic: str, partitions: int, expected: int, pid: int,
          started: float, alive: Callable[[], None], timeout: float) -> Result:
    """Poll ``topic``'s message count until ``expected`` are there; the figures of ``pid``."""
    return asyncio.run(_watch(bootstrap, topic, partitions, expected, pid, started, alive,
                              timeout))


# -- this service -----------------------------------------------------------------------------

def service_config(server: EmbeddedMariaDB, bootstrap: str, directory: Path,
                   producer: Producer, server_id: int, prefix: str) -> str:
    """The TOML of ``cdcserver run``: from the oldest binlog, Kafka sink ``debezium``."""
    users = directory / "cdcusers"
    UsersFile(str(users)).add("bench", "bench")
    return f"""[source]
url = "{server.url()}"
server_id = {server_id}
start_gtid = "oldest"

[store]
data_dir = "{directory / 'data'}"

[listener]
listen = "127.0.0.1:0"
users_file = "{users}"

[metrics]
listen = "127.0.0.1:0"

[kafka]
bootstrap = "{bootstrap}"
format = "debezium"
client_id = "{prefix}"
topic = "{prefix}.{{db}}.{{table}}"
schema_topic = "{prefix}.schemas"
state_topic = "{prefix}.state"
key_schema = true
value_schema = true
delivery = "at-least-once"
acks = "all"
compression = "{producer.compression}"
max_batch_bytes = {producer.batch_bytes}
linger_ms = {producer.linger_ms}
partitions = {producer.partitions}
"""


def service_command() -> list[str]:
    """The installed ``cdcserver`` beside this interpreter (the venv's)."""
    installed = Path(sys.executable).parent / "cdcserver"
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "cdcserver"]


@dataclasses.dataclass(frozen=True)
class Running:
    """A tool started: its process, when it was started, and a check that raises
    :class:`Stopped` when it is not running any more."""

    pid: int
    started: float  # time.monotonic() just before the process's start
    alive: Callable[[], None]


@contextlib.contextmanager
def service_running(server: EmbeddedMariaDB, bootstrap: str, directory: Path,
                    producer: Producer, *, server_id: int, prefix: str,
                    topics: list[str]) -> Iterator[Running]:
    """``cdcserver run`` reading ``server``'s binlog from its start (``topics`` created
    before), stopped after."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    config = directory / "cdcserver.toml"
    config.write_text(service_config(server, bootstrap, directory, producer, server_id,
                                     prefix))
    create_topics(bootstrap, topics, producer)
    log_path = directory / "cdcserver.log"
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen([*service_command(), "run", "--config", str(config)],
                                   stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

        def alive() -> None:
            if process.poll() is not None:
                raise Stopped(f"cdcserver exited ({process.returncode}); see {log_path}")
        try:
            yield Running(process.pid, started, alive)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_service(server: EmbeddedMariaDB, database: str, bootstrap: str, directory: Path,
                changes: int, producer: Producer = Producer(), *, server_id: int = 9301,
                prefix: str = "svc", timeout: float = 600.0) -> Result:
    """This service from the binlog's start until every change of ``database``.orders is
    acknowledged by Kafka, on ``<prefix>.<database>.orders`` (its schema change topic:
    ``prefix``, as Debezium's)."""
    topic = f"{prefix}.{database}.orders"
    with service_running(server, bootstrap, directory, producer, server_id=server_id,
                         prefix=prefix, topics=[topic]) as running:
        result = watch(bootstrap, topic, producer.partitions, changes, running.pid,
                       running.started, running.alive, timeout)
    return dataclasses.replace(result, tool=SERVICE)


# -- Debezium ---------------------------------------------------------------------------------

# Debezium 3.6's MySQL connector asks a server whose SELECT VERSION() reads 8.4 or newer for
# SHOW BINARY LOG STATUS (MySqlConnection.resolveBinaryLogStatusStatement), which MariaDB
# 10.11 does not know ("10.11.19-MariaDB" is "newer"), and fails its validation. Its MariaDB
# connector, which knows better, is not to be had here (tests/jvm/debezium-mariadb/pom.xml).
# So Debezium reads the same data directory and binlog from the same server restarted with
# MariaDB's --version saying 8.0 first: it then asks SHOW MASTER STATUS, which MariaDB
# answers. This service's preflight would refuse that version (it needs MariaDB 10.x), so it
# runs before, on the server as it is.
MYSQL_8_0 = "8.0.0"


@contextlib.contextmanager
def version_for_debezium(server: EmbeddedMariaDB) -> Iterator[None]:
    """``server`` restarted with a version string Debezium's MySQL connector reads as 8.0
    (the real one after it), and restarted as it was after."""
    version = str(server.query("SELECT VERSION()")[0][0]).removesuffix("-log")
    plain = server.extra_args
    server.stop()
    server.extra_args = (*plain, f"--version={MYSQL_8_0}-{version}")
    server.start()
    try:
        yield
    finally:
        server.stop()
        server.extra_args = plain
        server.start()


@contextlib.contextmanager
def debezium_running(server: EmbeddedMariaDB, database: str, bootstrap: str,
                     directory: Path, producer: Producer, *, server_id: int, prefix: str,
                     tuned: bool, topics: list[str]) -> Iterator[Running]:
    """Debezium's connector in Connect standalone reading ``server`` (restarted for it:
    :func:`version_for_debezium`) from the binlog's start, the tables of ``database``
    (``topics`` created before), stopped after; a :class:`Stopped` raised inside names the
    worker's log and its tail."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    debezium_source.create_user(server)
    create_topics(bootstrap, topics, producer)
    worker = debezium_source.worker(
        directory, bootstrap, tuned=tuned,
        producer=producer_settings("all", producer.compression, producer.batch_bytes,
                                   producer.linger_ms))
    connector = debezium_source.connector_config(server, directory, prefix=prefix,
                                                 databases=database, server_id=server_id)
    with version_for_debezium(server):
        started = time.monotonic()
        worker.start({prefix: connector})

        def alive() -> None:
            worker.check_running(prefix)  # raises when the worker or a task failed
        try:
            yield Running(worker.pid, started, alive)
        except Stopped as e:
            raise Stopped(f"{e} (Kafka Connect log: {worker.log_path}):\n"
                          f"{worker.log_tail()}") from None
        finally:
            worker.stop()


def run_debezium(server: EmbeddedMariaDB, database: str, bootstrap: str, directory: Path,
                 changes: int, producer: Producer = Producer(), *, server_id: int = 9302,
                 prefix: str = "dbz", tuned: bool = True, timeout: float = 600.0) -> Result:
    """Debezium's connector in Connect standalone from the binlog's start until every change
    of ``database``.orders is acknowledged by Kafka, on ``<prefix>.<database>.orders``
    (``tuned``: the JVM of connect-standalone.sh, else the tests' small one)."""
    topic = f"{prefix}.{database}.orders"
    with debezium_running(server, database, bootstrap, directory, producer,
                          server_id=server_id, prefix=prefix, tuned=tuned,
                          topics=[topic]) as running:
        result = watch(bootstrap, topic, producer.partitions, changes, running.pid,
                       running.started, running.alive, timeout)
    return dataclasses.replace(result, tool=DEBEZIUM)


# -- the comparison ---------------------------------------------------------------------------

def median(results: list[Result]) -> Result:
    """The run of median throughput (its other figures with it: one real run, not a mix)."""
    ordered = sorted(results, key=lambda r: r.rate)
    return ordered[(len(ordered) - 1) // 2]


def _ratio(a: float, b: float) -> float:
    """a / b; nan when b is 0 (a window too short for a poll to see, in a tiny run)."""
    return a / b if b else float("nan")


def report(service: Result, debezium: Result) -> dict[str, bool]:
    """Print the table and the ratios; returns issue 53's goals, met or not."""
    print(f"{'tool':<12} {'changes':>9} {'start-up s':>10} {'changes/s':>11} "
          f"{'CPU-s per M changes':>20} {'peak RSS MB':>12}", flush=True)
    for r in (service, debezium):
        print(f"{r.tool:<12} {r.changes:>9,} {r.startup:>10.1f} {r.rate:>11,.0f} "
              f"{r.cpu_per_million:>20.1f} {r.rss_mb:>12.0f}", flush=True)
    throughput = _ratio(service.rate, debezium.rate)
    cpu = _ratio(service.cpu_per_million, debezium.cpu_per_million)
    memory = _ratio(service.rss_mb, debezium.rss_mb)
    goals = {"throughput": throughput >= THROUGHPUT_GOAL, "memory": memory <= MEMORY_GOAL}
    line("ratio changes/s, service / Debezium",
         f"{throughput:.2f} (goal >= {THROUGHPUT_GOAL:g}: "
         f"{'met' if goals['throughput'] else 'not met'})")
    line("ratio CPU-s per M changes, service / Debezium", f"{cpu:.2f}")
    line("ratio peak RSS, service / Debezium",
         f"{memory:.2f} (goal <= {MEMORY_GOAL:g}: {'met' if goals['memory'] else 'not met'})")
    return goals


@contextlib.contextmanager
def kafka_broker() -> Iterator[ApacheKafka]:
    """One broker in bench/out, removed after (its JVM dies with this process)."""
    kafka_dir = tempfile.mkdtemp(prefix="kafka-", dir=OUT)
    broker = ApacheKafka(kafka_dir)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
        shutil.rmtree(kafka_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=INSERTS,
                        help="rows inserted (a quarter of them then updated)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each tool (medians)")
    parser.add_argument("--compression", default="lz4",
                        choices=("none", "gzip", "snappy", "lz4", "zstd"))
    parser.add_argument("--latency", action="store_true",
                        help="then commit-to-consumer latency at fixed rates (peers_latency.py)")
    parser.add_argument("--latency-seconds", type=float, default=20.0,
                        help="seconds of writing at each rate")
    parser.add_argument("--rates", type=_rates, default=(1_000, 10_000),
                        help="rows/s the latency writer keeps, comma-separated")
    args = parser.parse_args(argv)
    announce_code_path()
    producer = Producer(compression=args.compression)
    os.makedirs(OUT, exist_ok=True)
    with fresh_server("mariadb") as server, kafka_broker() as broker:
        changes = write_workload(server, "bench", args.rows)
        line("workload", f"{changes:,} row changes ({args.rows:,} inserts, "
                         f"{changes - args.rows:,} updates) in bench.orders")
        line("tools run", "one after the other, each from the binlog's start")
        line("producers", f"acks=all, {producer.compression}, batch {producer.batch_bytes:,} "
                          f"B, linger {producer.linger_ms} ms, {producer.partitions} "
                          "partitions, at least once")
        ours, theirs = [], []
        for run in range(args.runs):
            # each run's topics are new: the brokers' counts start at 0
            ours.append(run_service(server, "bench", broker.bootstrap,
                                    Path(OUT, "peers", f"service{run}"), changes, producer,
                                    server_id=9301 + 2 * run, prefix=f"svc{run}"))
            theirs.append(run_debezium(server, "bench", broker.bootstrap,
                                       Path(OUT, "peers", f"debezium{run}"), changes,
                                       producer, server_id=9302 + 2 * run,
                                       prefix=f"dbz{run}"))
        report(median(ours), median(theirs))
        if args.latency:
            latency(server, broker.bootstrap, producer, args.rates, args.latency_seconds)
    return 0


def _rates(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in text.split(","))


def latency(server: EmbeddedMariaDB, bootstrap: str, producer: Producer,
            rates: tuple[int, ...], seconds: float) -> None:
    # imported here: peers_latency builds on this module
    from bench import peers_latency

    ours, theirs = peers_latency.measure(server, bootstrap, Path(OUT, "peers", "latency"),
                                         producer, rates, seconds)
    peers_latency.report(ours, theirs, seconds)


if __name__ == "__main__":
    sys.exit(main())
