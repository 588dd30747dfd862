"""The mirror's cost per micro-batch: a Delta Lake table, an Iceberg table, Parquet snapshots.

    .venv/bin/python bench/bench_lakehouse.py [--rows N] [--batches 1000,10000,100000]
        [--runs R] [--formats delta,iceberg,parquet] [--keys random,recent] [--file-mb M]

Path measured: the mirror's ``foreachBatch`` functions, called directly with Spark DataFrames
(``spark.createDataFrame`` of Arrow tables) of generated change records in the ``cdc``
source's schema (its metadata columns, then the table's): ``lakehouse.apply_batch`` with a
``DeltaSink`` or an ``IcebergSink`` (ordering, last change per key, Arrow to the driver, one
MERGE commit), and ``mirror.apply_changes`` (the Parquet snapshot). Not measured: MariaDB, the
service and the source's reads, which do not depend on the format (``bench/bench_spark.py``
measures the source); each batch still goes through Spark, as in the query.

The table: N rows (default 1,000,000; ``--rows 10000000`` for issue 39's 10M) of ``id BIGINT``
(the primary key), ``big BIGINT``, ``name VARCHAR``, ``amount DECIMAL(12,2)``, ``created
DATETIME``, ``score DOUBLE``, written as the first batch (the dump: a new table is written in
bulk). Then R batches (default 3) of each size of row changes: 80% updates (an update_before
and an update_after record), 10% deletes, 10% inserts of new keys. ``--keys random``: the
updated and deleted keys are anywhere in the table, so with copy on write (the only write
delta-rs and pyiceberg have) every data file holding one is rewritten; ``recent``: they are
among the newest keys, as in a table of orders. Each format runs in its own process (the peak
memory is its own), with the same changes.

Prints, per format and key pattern: the bulk load's seconds, then for each batch size the
median seconds per batch and the table after the batches: its current version's data files
(count and size) and everything on disk (Delta and Iceberg keep the files earlier versions
need: no vacuum or snapshot expiry runs). ``--file-mb``: the target data file size of Delta
and Iceberg (the mirror's default, 32 MiB; pyiceberg counts it in Arrow bytes, so its files
come out smaller), which decides how much of the table a batch rewrites. And the peak RSS of
the driver's Python process (where the Arrow tables, delta-rs and pyiceberg work) and of
Spark's JVM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa

from bench.common import OUT, line, peak_rss_mb
from tests.helpers import memory_mib

KEY = ["id"]
SEED = 20261139


class Changes:
    """Generated change records in the source's schema, the same in every process."""

    def __init__(self, rows: int, keys: str) -> None:
        self.rng = np.random.default_rng(SEED)
        self.alive = np.ones(rows + 1, dtype=bool)
        self.alive[0] = False
        self.next_id = rows + 1
        self.keys = keys
        self.sequence = 1

    def dump(self) -> pa.Table:
        ids = np.flatnonzero(self.alive)
        return self._records(ids, ["insert"] * len(ids), ids)

    def batch(self, size: int) -> pa.Table:
        updates, deletes = size * 8 // 10, size // 10
        inserts = size - updates - deletes
        live = self._candidates(updates + deletes)
        chosen = self.rng.choice(live, updates + deletes, replace=False)
        updated, deleted = chosen[:updates], chosen[updates:]
        new = np.arange(self.next_id, self.next_id + inserts)
        self.next_id += inserts
        self.alive = np.concatenate([self.alive, np.ones(inserts, dtype=bool)])
        self.alive[deleted] = False
        ids = np.concatenate([np.repeat(updated, 2), deleted, new])
        types = ["update_before", "update_after"] * updates + ["delete"] * deletes + \
            ["insert"] * inserts
        return self._records(ids, types, ids + self.sequence)

    def _candidates(self, count: int) -> np.ndarray:
        live = np.flatnonzero(self.alive)
        if self.keys == "recent":
            return live[-max(2 * count, 1000):]
        return live

    def _records(self, ids: np.ndarray, types: list[str], salt: np.ndarray) -> pa.Table:
        n = len(ids)
        sequence, self.sequence = self.sequence, self.sequence + 1
        return pa.table({
            "domain": pa.array(np.zeros(n, np.int32)),
            "server_id": pa.array(np.ones(n, np.int64)),
            "sequence": pa.array(np.full(n, sequence, np.int64)),
            "event_number": pa.array(np.arange(1, n + 1, dtype=np.int32)),
            "timestamp": pa.array(np.full(n, 1_800_000_000 + sequence, np.int64)),
            "event_type": pa.array(types, pa.string()),
            "_table": pa.array(["bench.orders"] * n, pa.string()),
            "_version": pa.array(np.ones(n, np.int32)),
            "id": pa.array(ids.astype(np.int64)),
            "big": pa.array((salt * 104729) % 10**15, pa.int64()),
            "name": pa.array([f"customer-{i}" for i in salt.tolist()], pa.string()),
            "amount": pa.array((salt * 7919) % 10**9, pa.int64()).cast(pa.decimal128(19, 0))
            .cast(pa.decimal128(12, 2)),
            "created": pa.array(salt * 1_000_000, pa.timestamp("us")),
            "score": pa.array((salt % 1000) / 7.0),
        })


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("bench-lakehouse")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", os.environ.get("BENCH_DRIVER_MEMORY", "3g"))
             # the bulk load brings the whole table to the driver as Arrow (the mirror's
             # first batch does too): at 10M rows that is over the 1 GiB default
             .config("spark.driver.maxResultSize", "0")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def applier(spark: Any, format: str, where: str, file_size: int) -> tuple[Any, Any, str]:
    """The format's foreachBatch function, a function giving the data files of the table's
    current version (count, bytes), and the directory the table is in."""
    from mariadb_cdc_client.spark.lakehouse import (
        DeltaSink,
        IcebergSink,
        apply_batch,
        iceberg_catalog,
    )
    from mariadb_cdc_client.spark.mirror import apply_changes, current_snapshot

    path = os.path.join(where, format)
    os.makedirs(path)
    if format == "parquet":
        def snapshot() -> tuple[int, int]:
            files = [os.path.join(folder, f) for folder, _, names in
                     os.walk(current_snapshot(path) or path) for f in names
                     if f.endswith(".parquet")]
            return len(files), sum(os.path.getsize(f) for f in files)
        return (lambda df, batch_id: apply_changes(spark, df, batch_id, path, KEY)), \
            snapshot, path
    if format == "delta":
        from deltalake import DeltaTable

        sink: Any = DeltaSink(path, KEY, "bench", file_size=file_size)

        def live() -> tuple[int, int]:
            files = [f.removeprefix("file://") for f in DeltaTable(path).file_uris()]
            return len(files), sum(os.path.getsize(f) for f in files)
    else:
        catalog = iceberg_catalog("sqlite:///" + os.path.join(path, "catalog.db"), path)
        sink = IcebergSink(catalog, ("bench", "orders"), KEY, "bench", file_size)

        def live() -> tuple[int, int]:
            tasks = list(catalog.load_table(("bench", "orders")).scan().plan_files())
            return len(tasks), sum(t.file.file_size_in_bytes for t in tasks)
    return (lambda df, batch_id: apply_batch(sink, df, batch_id, KEY)), live, path


def size_mb(path: str) -> float:
    total = 0
    for folder, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total / 1e6


def jvm_peak_mb(spark: Any) -> float | None:
    """VmHWM of the JVM the session started (a child of this process), if it can be seen."""
    try:
        pid = spark.sparkContext._gateway.proc.pid  # spark-submit execs the JVM
    except AttributeError:
        return None
    return memory_mib(pid, "VmHWM") or None


def run_one(format: str, keys: str, rows: int, sizes: list[int], runs: int, file_mb: int
            ) -> None:
    where = os.path.join(OUT, "lakehouse")
    shutil.rmtree(os.path.join(where, format), ignore_errors=True)
    spark = spark_session()
    apply, live, path = applier(spark, format, where, file_mb * 2**20)
    changes = Changes(rows, keys)
    label = f"{format}, {keys} keys"
    dump = spark.createDataFrame(changes.dump())
    start = time.perf_counter()
    apply(dump, 0)
    seconds = time.perf_counter() - start
    files, size = live()
    line(f"{label}: bulk load of {rows:,} rows (s)",
         f"{seconds:.2f}   table {files} data files, {size / 1e6:,.0f} MB")
    batch_id = 1
    for size in sizes:
        seconds = []
        for _ in range(runs):
            df = spark.createDataFrame(changes.batch(size))
            start = time.perf_counter()
            apply(df, batch_id)
            seconds.append(time.perf_counter() - start)
            batch_id += 1
        files, live_bytes = live()
        line(f"{label}: {size:,} changes, s/batch (median of {runs})",
             f"{statistics.median(seconds):.2f}   table {int(changes.alive.sum()):,} rows in "
             f"{files} data files, {live_bytes / 1e6:,.0f} MB ({size_mb(path):,.0f} MB on "
             "disk with older versions' files)")
    jvm = jvm_peak_mb(spark)
    line(f"{label}: peak RSS, driver Python / JVM (MB)",
         f"{peak_rss_mb():,.0f} / {'?' if jvm is None else f'{jvm:,.0f}'}")
    spark.stop()
    shutil.rmtree(os.path.join(where, format), ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", default="delta,iceberg,parquet")
    parser.add_argument("--keys", default="random,recent")
    parser.add_argument("--file-mb", type=int, default=32,
                        help="delta, iceberg: target data file size (the mirror's default: 32)")
    parser.add_argument("--one", nargs=2, metavar=("FORMAT", "KEYS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    if args.one:
        run_one(*args.one, args.rows, sizes, args.runs, args.file_mb)
        return
    import deltalake
    import pyiceberg
    import pyspark

    line("path measured", "foreachBatch functions called directly with DataFrames of "
         "generated changes (no MariaDB, no service)")
    line("target data file size (delta, iceberg)", f"{args.file_mb} MiB")
    line("versions", f"pyspark {pyspark.__version__}, deltalake {deltalake.__version__}, "
         f"pyiceberg {pyiceberg.__version__}, pyarrow {pa.__version__}")
    for keys in args.keys.split(","):
        for format in args.formats.split(","):
            subprocess.run([sys.executable, __file__, "--one", format, keys, "--rows",
                            str(args.rows), "--batches", args.batches, "--runs",
                            str(args.runs), "--file-mb", str(args.file_mb)], check=True)


if __name__ == "__main__":
    main()
