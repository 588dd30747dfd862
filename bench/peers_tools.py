"""The two tools bench_peers.py compares, and what it measures them with: this service
(``service_running``) and Debezium's connector in Kafka Connect standalone
(``debezium_running``, on a MariaDB whose version string Debezium's MySQL connector accepts,
``version_for_debezium``), each publishing with the same producer settings (:class:`Producer`)
to topics created beforehand; a process's CPU seconds and peak RSS; the brokers' high
watermarks polled until a topic holds the changes expected (``watch``); the broker
(``kafka_broker``). Used by the throughput part (bench_peers.py) and the latency part
(peers_latency.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import INSERTS, OUT, load_workload
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from cdcserver.sinks.kafka.topics import create_topics as create_kafka_topics
from tests import debezium_source
from tests.apache_kafka import ApacheKafka
from tests.kafka_connect import producer_settings

SERVICE, DEBEZIUM = "cdcserver", "Debezium"
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


def ratio(a: float, b: float) -> float:
    """a / b; nan when b is 0 (a window too short for a poll to see, in a tiny run)."""
    return a / b if b else float("nan")


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
    asyncio.run(create_kafka_topics(config, topics, producer.partitions))


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
                    topics: list[str], kafka: str = "") -> Iterator[Running]:
    """``cdcserver run`` reading ``server``'s binlog from its start (``topics`` created
    before; ``kafka``: more ``[kafka]`` settings, TOML lines), stopped after."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    config = directory / "cdcserver.toml"
    config.write_text(service_config(server, bootstrap, directory, producer, server_id,
                                     prefix) + kafka)
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
                     tuned: bool, topics: list[str],
                     options: Mapping[str, object] | None = None) -> Iterator[Running]:
    """Debezium's connector in Connect standalone reading ``server`` (restarted for it:
    :func:`version_for_debezium`) from the binlog's start, the tables of ``database``
    (``topics`` created before; ``options``: connector settings over the usual ones),
    stopped after; a :class:`Stopped` raised inside names the worker's log and its tail."""
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
    connector.update(options or {})
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


