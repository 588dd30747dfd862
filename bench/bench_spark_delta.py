"""A MariaDB table into a Delta Lake table on a Spark standalone cluster, the whole path: the
service's dump read by the ``cdc`` source and MERGEd by examples/spark/merge_into_delta.py,
beside Spark's own JDBC reader of the same table written to the same format.

    .venv/bin/python bench/bench_spark_delta.py [--rows 10000000] [--cores 2] [--runs 1]

Untimed: a fresh MariaDB (bench/out/spark-delta) with ``bench.big`` (``--rows`` rows of the
standard workload's columns, made with the sequence engine, not in the binlog), the service
(``cdcserver run``, its own process) replicating beside it and serving its listener, a chunked
dump of the table (``cdcserver``'s dumper, 2 readers), and a Spark 4.2 standalone cluster from
the environment tests/run.sh makes (.venv-delta: Delta Lake 4.4 is built for Spark 4.2) with
one worker of ``--cores`` cores and 4 GiB. Timed, each a ``spark-submit`` application on the
cluster, from its submission to its exit, into a new Delta table:

- ``cdc``: ``merge_into_delta.py --starting-position dump --once``: the dump read from the
  service in AVRO mode (the partitions the source plans), then one MERGE per micro-batch;
- ``jdbc``: ``spark.read.jdbc`` with MariaDB Connector/J 3.5, partitioned on the primary key
  into ``--cores`` ranges, written with ``format("delta")`` (no MERGE: a plain write of a
  table read once; the fastest way Spark has to copy it).

Prints rows/s and CPU-seconds for each (the cluster's: master, worker, and the executors with
their Python workers, sampled every 0.2 s; the driver's: the ``spark-submit`` process tree;
for ``cdc`` also the service's), and the ratio of the rates.
Both Delta tables are counted afterwards (delta-rs) and must hold every row.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_dump import big_table, our_dump, service_replicating
from bench.common import CREATE, fresh_server, line, process_cpu
from cdcserver.app.embedded import free_port
from tests import delta_lake
from tests.jvm import classpath
from tests.spark_cluster import Cluster, running, why_failed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "spark" / "merge_into_delta.py"
USER = PASSWORD = "bench"
# both applications as a user would size them on this worker, with the JVM's own defaults
# (not the tests' short-lived tuning, which tests/spark_cluster.py's submit gives)
SIZED = ("--conf", "spark.executor.memory=3g", "--conf", "spark.driver.memory=2g",
         "--conf", "spark.driver.extraJavaOptions=", "--conf",
         "spark.executor.extraJavaOptions=")

JDBC_COPY = """
import sys
from pyspark.sql import SparkSession

url, rows, partitions, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spark = SparkSession.builder.appName("jdbc copy into Delta").getOrCreate()
table = spark.read.jdbc(url, "big", column="id", lowerBound=1, upperBound=rows + 1,
                        numPartitions=partitions,
                        properties={"user": "root", "driver": "org.mariadb.jdbc.Driver"})
table.write.format("delta").mode("overwrite").save(path)
spark.stop()
"""


def executors(cluster: Cluster) -> list[int]:
    """The executors (JVMs under the worker's) running now."""
    worker = cluster.processes[-1].pid
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes() \
                    and worker in _ancestors(pid):
                found.append(pid)
    return found


def _ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        found.append(pid)
    return found


class ExecutorCpu(threading.Thread):
    """Samples the CPU time of each executor (with its reaped children: the Python workers)
    every 0.2 s while an application runs: an executor ends with it, and its time reaches
    the worker's only once reaped, so it is read from the executor itself (what it spent
    after the last sample, at most 0.2 s of it, is not counted)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.seen: dict[int, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            for pid in executors(self.cluster):
                with contextlib.suppress(OSError):
                    self.seen[pid] = max(self.seen.get(pid, 0.0), process_cpu(pid, children=True))

    def total(self) -> float:
        self.halt.set()
        self.join()
        return sum(self.seen.values())


def daemons_cpu(cluster: Cluster) -> float:
    """The master's and the worker's own CPU time (their children, the executors, apart)."""
    return sum(process_cpu(p.pid) for p in cluster.processes)


def timed(cluster: Cluster, command: list[str], env: dict[str, str], cwd: Path
          ) -> tuple[float, float, float]:
    """Run one application; its wall seconds, the cluster's CPU-seconds and the driver's."""
    before = daemons_cpu(cluster)
    sampler = ExecutorCpu(cluster)
    sampler.start()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    ran = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                         check=False)
    seconds = time.perf_counter() - start
    if ran.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {ran.returncode}\n"
                         f"{why_failed(ran.stdout + ran.stderr)}")
    deadline = time.monotonic() + 60  # the application's executor is stopped
    while executors(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    driver = (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime)
    return seconds, daemons_cpu(cluster) - before + sampler.total(), driver


def delta_rows(path: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_dataset().count_rows()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cores", type=int, default=2, help="the worker's cores")
    parser.add_argument("--runs", type=int, default=1, help="runs of each (medians)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-spark-delta-"))
    spark_python = delta_lake.bin_dir() / "python"
    line("path measured", f"cdc source and example from {ROOT}; Spark "
         f"{delta_lake.SPARK_VERSION} at {delta_lake.spark_home()}; Delta Lake "
         f"{Path(classpath('delta').split(os.pathsep)[0]).name}")
    try:
        with fresh_server("spark-delta") as server:
            server.execute("CREATE DATABASE bench", CREATE)  # big_table's model
            table = big_table(server, args.rows)
            port = free_port()
            with service_replicating(server, str(work / "data"), f"127.0.0.1:{port}",
                                     9310) as service_pid, \
                    running(work / "cluster", delta_lake.spark_home(), spark_python,
                            cores=args.cores, memory="4g") as cluster:
                our_dump(server, str(work / "data"), table, 2, args.rows)
                line("table", f"{table}: {args.rows:,} rows, dumped by the service")
                env = {**cluster.env, "CDC_PASSWORD": PASSWORD}
                results: dict[str, list[tuple[float, float, float, float]]] = {
                    "cdc": [], "jdbc": []}
                script = work / "jdbc_copy.py"
                script.write_text(JDBC_COPY)
                # Spark quotes names with "..." (its default JDBC dialect): ANSI_QUOTES
                url = (f"jdbc:mariadb://127.0.0.1:{server.port}/bench"
                       "?sessionVariables=sql_mode=ANSI_QUOTES")
                for run in range(args.runs):
                    target = work / f"cdc-{run}.delta"
                    command = cluster.submit(
                        None, *SIZED, *delta_lake.spark_args(), str(EXAMPLE), "--table",
                        str(table),
                        "--path", str(target), "--checkpoint", str(work / f"cdc-{run}.ckpt"),
                        "--port", str(port), "--user", USER, "--starting-position", "dump",
                        "--once", driver_python=spark_python)
                    served = process_cpu(service_pid, children=True)
                    seconds, on_cluster, driver = timed(cluster, command, env, work)
                    results["cdc"].append((seconds, on_cluster, driver,
                                           process_cpu(service_pid, children=True) - served))
                    assert delta_rows(target) == args.rows, (target, delta_rows(target))
                    target = work / f"jdbc-{run}.delta"
                    command = cluster.submit(
                        None, *SIZED, *delta_lake.spark_args(*classpath("mariadb-jdbc").split(
                            os.pathsep)), str(script), url, str(args.rows), str(args.cores),
                        str(target), driver_python=spark_python)
                    seconds, on_cluster, driver = timed(cluster, command, env, work)
                    results["jdbc"].append((seconds, on_cluster, driver, 0.0))
                    assert delta_rows(target) == args.rows, (target, delta_rows(target))
                report(results, args.rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, list[tuple[float, float, float, float]]], rows: int) -> None:
    medians = {name: [statistics.median(r[i] for r in runs) for i in range(4)]
               for name, runs in results.items()}
    for name, (seconds, on_cluster, driver, served) in medians.items():
        label = {"cdc": "cdc source + foreachBatch MERGE", "jdbc": "spark.read.jdbc + write"}
        line(f"{label[name]}", f"{rows / seconds:,.0f} rows/s ({seconds:.1f} s)")
        line("  CPU-seconds: cluster, driver" + (", service" if name == "cdc" else ""),
             f"{on_cluster:.1f}, {driver:.1f}" + (f", {served:.1f}" if name == "cdc" else ""))
    ratio = medians["jdbc"][0] / medians["cdc"][0]
    line("cdc rows/s / jdbc rows/s", f"{ratio:.2f}")


if __name__ == "__main__":
    main()
