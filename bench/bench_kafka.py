"""The Kafka sink's messages/s beside a bare aiokafka producer sending the same messages.

    .venv/bin/python bench/bench_kafka.py [--runs N] [--format databus|dip|debezium|maxscale]

The standard workload (bench/common.py) is read from the binlog once by the real replicator
into memory (untimed). Then, against a local Apache Kafka broker (tests/apache_kafka.py;
``bash tests/jvm/fetch.sh kafka`` fetches it once), each run times:
- the sink: ``KafkaSink.apply`` over every transaction (turning changes into messages in the
  chosen format, partitioning, keeping them until acknowledged) and the final ``flush``
  (every message acknowledged, the checkpoint written);
- the reference: one ``AIOKafkaProducer`` with the same settings sending the very messages the
  sink sent (topic, partition, key, value, headers), then waiting for every acknowledgement.
Each gets a fresh topic of its own. A first, untimed round warms both up (the first pass
over a fresh heap ran at 0.6 of the later ones). Prints both rates (medians) and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (
    OUT,
    ROW_CHANGES,
    announce_code_path,
    line,
    peak_rss_mb,
    workload_server,
)
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.app.service import Service
from cdcserver.core.changes import Change
from cdcserver.core.config import (
    Config,
    ListenerConfig,
    MetricsConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import BinlogPosition, GtidState
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.protocol.users import UsersFile
from cdcserver.sinks.base import SinkStatus, SourceInfo
from cdcserver.sinks.kafka import connect
from cdcserver.sinks.kafka.accumulator import Message
from cdcserver.sinks.kafka.sink import KafkaSink
from tests.apache_kafka import ApacheKafka


class Recorder:
    """A sink that keeps every batch of changes the pipeline hands it."""

    name = "recorder"
    after: tuple[str, ...] = ()
    durable: BinlogPosition | None = None
    applied: BinlogPosition | None = None

    def __init__(self) -> None:
        self.batches: list[list[Change]] = []

    async def open(self, source: SourceInfo) -> None:
        pass

    def starting_at(self, position: BinlogPosition) -> None:
        pass

    async def close(self) -> None:
        pass

    async def apply(self, changes: list[Change]) -> None:
        self.batches.append(list(changes))

    async def flush(self) -> BinlogPosition | None:
        return None

    active = True

    def status(self) -> SinkStatus:
        return SinkStatus(self.name)


async def read_changes(server: EmbeddedMariaDB) -> list[list[Change]]:
    data_dir = os.path.join(OUT, "kafka-data")
    shutil.rmtree(data_dir, ignore_errors=True)
    users = os.path.join(OUT, "cdcusers")
    UsersFile(users).add("bench", "bench")
    config = Config(source=SourceConfig(url=server.url(), server_id=9200, start_gtid="oldest"),
                    store=StoreConfig(data_dir=data_dir),
                    listener=ListenerConfig(listen="127.0.0.1:0", users_file=users),
                    metrics=MetricsConfig(listen="127.0.0.1:0"))
    recorder = Recorder()
    service = Service(config, more_sinks=[recorder])
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    await service.wait_caught_up(GtidState.parse(
        str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])))
    stop.set()
    await task
    return recorder.batches


class RecordingSink(KafkaSink):
    """The sink, also keeping what it sent (a list append per message) for the reference."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Message] = []
        hold = self.sender.hold

        async def recording(message: Message) -> None:  # each message the router makes
            self.sent.append(message)
            await hold(message)

        self.sender.hold = recording  # type: ignore[method-assign]


async def sink_run(config: KafkaConfig, batches: list[list[Change]]) -> tuple[float, list[Any]]:
    with tempfile.TemporaryDirectory(dir=OUT) as data_dir:
        sink = RecordingSink(config, data_dir, "bench:1")
        await sink.open(SourceInfo(mariadb=True))
        for topic in ("bench.orders", config.schema_topic, config.state_topic):
            await sink.router.partition_count(topic)  # topic creation is not what is measured
        start = time.perf_counter()
        for batch in batches:
            await sink.apply(batch)
        await sink.flush()
        seconds = time.perf_counter() - start
        await sink.close()
    return seconds, sink.sent


async def bare_run(config: KafkaConfig, messages: list[Message], topic: str) -> float:
    """The same messages to a topic of as many partitions as the sink's had (each format
    partitions its own way: by key, by table, or one)."""
    partitions = max([config.partitions or 1, *(m.partition + 1 for m in messages)])
    await connect.create_topics(config, [topic], partitions)
    producer = connect.producer(config)
    await producer.start()
    await producer.partitions_for(topic)
    try:
        start = time.perf_counter()
        futures = [await producer.send(topic, m.value, key=m.key, partition=m.partition,
                                       headers=m.headers) for m in messages]
        await asyncio.gather(*futures)
        return time.perf_counter() - start
    finally:
        await producer.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians are shown)")
    parser.add_argument("--format", default="databus",
                        choices=("databus", "dip", "debezium", "maxscale"))
    args = parser.parse_args()
    announce_code_path()
    with workload_server() as server:
        batches = asyncio.run(read_changes(server))
    # The whole workload held in memory is this script's doing (the service streams it):
    # keep the garbage collector from walking it again and again during the timed runs.
    gc.collect()
    gc.freeze()
    kafka_dir = tempfile.mkdtemp(prefix="kafka-", dir=OUT)
    broker = ApacheKafka(kafka_dir)  # (its JVM dies with this process, even on kill -9)
    broker.start()
    try:
        sink_rates, bare_rates = [], []
        for run in range(-1, args.runs):  # run -1 warms up (heap, broker) and is not shown
            config = KafkaConfig(bootstrap=broker.bootstrap, format=args.format,
                                 topic=f"run{run}.{{table}}",
                                 schema_topic=f"run{run}.schemas",
                                 state_topic=f"run{run}.state")
            seconds, sent = asyncio.run(sink_run(config, batches))
            data = [m for m in sent if m.topic == f"run{run}.orders"]
            bare = asyncio.run(bare_run(config, data, f"bare{run}.orders"))
            count, bare_count = len(sent), len(data)
            del sent, data
            gc.collect()
            if run < 0:
                continue
            sink_rates.append(count / seconds)
            bare_rates.append(bare_count / bare)
            line(f"run {run + 1}", f"sink {sink_rates[-1]:,.0f} msg/s ({count:,} messages "
                                   f"for {ROW_CHANGES:,} row changes), bare producer "
                                   f"{bare_rates[-1]:,.0f} msg/s")
        sink, bare_rate = statistics.median(sink_rates), statistics.median(bare_rates)
        line(f"bare aiokafka producer (reference), messages/s [{args.format}]",
             f"{bare_rate:,.0f}")
        line("Kafka sink, messages/s", f"{sink:,.0f}")
        line("ratio sink / bare producer", f"{sink / bare_rate:.3f}")
        line("peak RSS of this process, MB", f"{peak_rss_mb():.0f}")
    finally:
        broker.close()
        shutil.rmtree(kafka_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
