"""This service side by side with Debezium (issue 53): streaming throughput, CPU and memory.

    .venv/bin/python bench/bench_peers.py [--rows N] [--runs N] [--compression CODEC]
        [--workload standard|wide|both|none] [--latency [--latency-seconds S] [--rates R,R]]
        [--recovery [--kills N] [--recovery-rate R]] [--fidelity]

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
at fixed rates (bench/peers_latency.py). With ``--fidelity``, instead of all that, every
MariaDB type at its limits, each tool's values compared with the source's
(bench/peers_fidelity.py).

``--workload`` (default ``both``): the standard workload, the wide-row one
(bench/peers_wide.py: 40 columns, text and JSON among numbers; 60,000 inserts and 15,000
updates at full size, scaled with ``--rows``) or both, each measured and compared as above,
each with its peak RSS per phase (bench/peers_memory.py: the process tree's VmRSS sampled
every 50 ms, the max within start-up and streaming; the latency part's too). With
``--recovery``, then each tool killed with -9 mid-stream and restarted on its state
(bench/peers_recovery.py): the time to publish again, to catch up, the duplicates, and
that nothing is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import peers_fidelity, peers_latency, peers_memory, peers_recovery, peers_wide
from bench.common import INSERTS, OUT, announce_code_path, fresh_server, line
from bench.peers_memory import Peaks, record_streaming, sampling
from bench.peers_tools import (
    DEBEZIUM,
    SERVICE,
    Producer,
    Result,
    debezium_running,
    kafka_broker,
    ratio,
    service_running,
    watch,
    write_workload,
)
from cdcserver.app.embedded import EmbeddedMariaDB

DEFAULT_PRODUCER = Producer()
THROUGHPUT_GOAL, MEMORY_GOAL = 3.0, 0.25  # issue 53: >= 3x the changes/s, <= 1/4 the RSS


def run_service(server: EmbeddedMariaDB, database: str, bootstrap: str, directory: Path,
                changes: int, producer: Producer = DEFAULT_PRODUCER, *, server_id: int = 9301,
                prefix: str = "svc", timeout: float = 600.0, table: str = "orders",
                peaks: Peaks | None = None) -> Result:
    """This service from the binlog's start until every change of ``database``.``table`` is
    acknowledged by Kafka, on ``<prefix>.<database>.<table>`` (its schema change topic:
    ``prefix``, as Debezium's); ``peaks``: its RSS per phase recorded there."""
    topic = f"{prefix}.{database}.{table}"
    with service_running(server, bootstrap, directory, producer, server_id=server_id,
                         prefix=prefix, topics=[topic]) as running, \
            sampling(running.pid) as rss:
        result = watch(bootstrap, topic, producer.partitions, changes, running.pid,
                       running.started, running.alive, timeout)
    record_streaming(peaks, SERVICE, rss, running.started, result.startup, result.streaming)
    return dataclasses.replace(result, tool=SERVICE)


# -- Debezium ---------------------------------------------------------------------------------



def run_debezium(server: EmbeddedMariaDB, database: str, bootstrap: str, directory: Path,
                 changes: int, producer: Producer = DEFAULT_PRODUCER, *, server_id: int = 9302,
                 prefix: str = "dbz", tuned: bool = True, timeout: float = 600.0,
                 table: str = "orders", peaks: Peaks | None = None) -> Result:
    """Debezium's connector in Connect standalone from the binlog's start until every change
    of ``database``.``table`` is acknowledged by Kafka, on ``<prefix>.<database>.<table>``
    (``tuned``: the JVM of connect-standalone.sh, else the tests' small one; ``peaks``: its
    RSS per phase recorded there, the JVM's whole process)."""
    topic = f"{prefix}.{database}.{table}"
    with debezium_running(server, database, bootstrap, directory, producer,
                          server_id=server_id, prefix=prefix, tuned=tuned,
                          topics=[topic]) as running, sampling(running.pid) as rss:
        result = watch(bootstrap, topic, producer.partitions, changes, running.pid,
                       running.started, running.alive, timeout)
    record_streaming(peaks, DEBEZIUM, rss, running.started, result.startup, result.streaming)
    return dataclasses.replace(result, tool=DEBEZIUM)


# -- the comparison ---------------------------------------------------------------------------

def median(results: list[Result]) -> Result:
    """The run of median throughput (its other figures with it: one real run, not a mix)."""
    ordered = sorted(results, key=lambda r: r.rate)
    return ordered[(len(ordered) - 1) // 2]


def report(service: Result, debezium: Result) -> dict[str, bool]:
    """Print the table and the ratios; returns issue 53's goals, met or not."""
    print(f"{'tool':<12} {'changes':>9} {'start-up s':>10} {'changes/s':>11} "
          f"{'CPU-s per M changes':>20} {'peak RSS MB':>12}", flush=True)
    for r in (service, debezium):
        print(f"{r.tool:<12} {r.changes:>9,} {r.startup:>10.1f} {r.rate:>11,.0f} "
              f"{r.cpu_per_million:>20.1f} {r.rss_mb:>12.0f}", flush=True)
    throughput = ratio(service.rate, debezium.rate)
    cpu = ratio(service.cpu_per_million, debezium.cpu_per_million)
    memory = ratio(service.rss_mb, debezium.rss_mb)
    goals = {"throughput": throughput >= THROUGHPUT_GOAL, "memory": memory <= MEMORY_GOAL}
    line("ratio changes/s, service / Debezium",
         f"{throughput:.2f} (goal >= {THROUGHPUT_GOAL:g}: "
         f"{'met' if goals['throughput'] else 'not met'})")
    line("ratio CPU-s per M changes, service / Debezium", f"{cpu:.2f}")
    line("ratio peak RSS, service / Debezium",
         f"{memory:.2f} (goal <= {MEMORY_GOAL:g}: {'met' if goals['memory'] else 'not met'})")
    return goals


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
    parser.add_argument("--workload", choices=("standard", "wide", "both", "none"),
                        default="both", help="the throughput part's workloads (none: skip it)")
    parser.add_argument("--recovery", action="store_true",
                        help="then kill -9 each tool mid-stream and restart it "
                             "(peers_recovery.py)")
    parser.add_argument("--kills", type=int, default=3, help="kills per tool with --recovery")
    parser.add_argument("--recovery-rate", type=int, default=1_000,
                        help="rows/s the writer keeps with --recovery")
    parser.add_argument("--snapshot", action="store_true",
                        help="instead: a table's rows to Kafka, this service's initial "
                             "snapshot against Debezium's (peers_snapshot.py; --rows its rows)")
    parser.add_argument("--fidelity", action="store_true",
                        help="only the values of every type at its limits (peers_fidelity.py)")
    args = parser.parse_args(argv)
    if args.snapshot:
        from bench import peers_snapshot

        rows = args.rows if args.rows != INSERTS else peers_snapshot.ROWS
        return peers_snapshot.main(["--rows", str(rows)])
    announce_code_path()
    producer = Producer(compression=args.compression)
    if args.fidelity:
        return peers_fidelity.main(producer)
    os.makedirs(OUT, exist_ok=True)
    with fresh_server("mariadb") as server, kafka_broker() as broker:
        line("tools run", "one after the other, each from the binlog's start")
        line("producers", f"acks=all, {producer.compression}, batch {producer.batch_bytes:,} "
                          f"B, linger {producer.linger_ms} ms, {producer.partitions} "
                          "partitions, at least once")
        for workload in WORKLOADS[args.workload]:
            compare(server, broker.bootstrap, producer, workload, args.rows, args.runs)
        if args.latency:
            latency(server, broker.bootstrap, producer, args.rates, args.latency_seconds)
        if args.recovery:
            peers_recovery.report(*peers_recovery.measure(
                server, broker.bootstrap, Path(OUT, "peers", "recovery"), producer,
                kills=args.kills, rate=args.recovery_rate))
    return 0


WORKLOADS = {"standard": ("standard",), "wide": ("wide",), "both": ("standard", "wide"),
             "none": ()}


def compare(server: EmbeddedMariaDB, bootstrap: str, producer: Producer, workload: str,
            rows: int, runs: int) -> dict[str, bool]:
    """One workload written, then each tool ``runs`` times on it: the table, the ratios and
    the peak RSS per phase. Returns the goals, met or not."""
    if workload == "wide":
        database, table = peers_wide.DATABASE, peers_wide.TABLE
        inserts = peers_wide.inserts_for(rows)
        changes = peers_wide.write_wide(server, inserts)
    else:
        database, table, inserts = "bench", "orders", rows
        changes = write_workload(server, database, rows)
    line(f"workload {workload}", f"{changes:,} row changes ({inserts:,} inserts, "
                                 f"{changes - inserts:,} updates) in {database}.{table}")
    tag = "" if workload == "standard" else workload
    ours, theirs, peaks = [], [], Peaks()
    for run in range(runs):
        # each run's topics are new: the brokers' counts start at 0
        ours.append(run_service(server, database, bootstrap,
                                Path(OUT, "peers", f"service{tag}{run}"), changes, producer,
                                server_id=9301 + 2 * run, prefix=f"svc{tag}{run}", table=table,
                                peaks=peaks))
        theirs.append(run_debezium(server, database, bootstrap,
                                   Path(OUT, "peers", f"debezium{tag}{run}"), changes,
                                   producer, server_id=9302 + 2 * run, prefix=f"dbz{tag}{run}",
                                   table=table, peaks=peaks))
    goals = report(median(ours), median(theirs))
    memory = peers_memory.report(peaks, SERVICE, DEBEZIUM, f"{workload} workload")
    return {**goals, **{f"memory {phase}": met for phase, met in memory.items()}}


def _rates(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in text.split(","))


def latency(server: EmbeddedMariaDB, bootstrap: str, producer: Producer,
            rates: tuple[int, ...], seconds: float) -> None:
    peaks = Peaks()
    ours, theirs = peers_latency.measure(server, bootstrap, Path(OUT, "peers", "latency"),
                                         producer, rates, seconds, peaks=peaks)
    peers_latency.report(ours, theirs, seconds)
    peers_memory.report(peaks, SERVICE, DEBEZIUM, "latency")


if __name__ == "__main__":
    sys.exit(main())
