"""Keep a copy of a MariaDB table: the example pipeline of the Spark source.

    python -m mariadb_cdc_client.spark.mirror --table shop.orders --path /data/orders \\
        [--format parquet|delta|iceberg] [--catalog URI] [--checkpoint DIR] \\
        --user cdcuser --password cdcpass

A streaming query reads the table's changes (``startingPosition=dump`` builds it from the
newest dump, then follows) and, per micro-batch (``foreachBatch``), applies them: for each
primary key the batch's last change (in the order the source read them,
:func:`mariadb_cdc_client.spark.lakehouse.in_stream_order`) decides, an insert or
update_after puts the row, a delete or update_before removes it.

``--format parquet`` (the default) writes each batch as a new snapshot directory
``<path>/batch=<id>`` and then moves the pointer file ``<path>/CURRENT`` to it (an atomic
rename), so a reader, or a crash, only ever sees a whole snapshot; a batch Spark runs again
after a crash writes the same snapshot again. A replaced snapshot stays ``--keep-replaced``
seconds (60) for the readers that opened it before, then a later batch removes it. Read it
with :func:`read_mirror`. Each batch rewrites the whole table.

``--format delta`` (a Delta Lake table at ``--path``) and ``--format iceberg`` (an Iceberg
table ``database.table`` in a SQL catalog, ``--catalog``, default SQLite in ``--path``, with
its data under ``--path``) commit each batch as one MERGE, exactly once
(:mod:`mariadb_cdc_client.spark.lakehouse`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

from mariadb_cdc_client.format.extras import MissingExtra, require
from mariadb_cdc_client.format.names import parse_table, table_ref

log = logging.getLogger(__name__)

CURRENT = "CURRENT"
# Spark gives the Python worker of a Python streaming source a fixed 10 s to connect back
# (PythonWorkerFactory.createSimpleWorker; no setting changes it): on a busy machine the
# query can fail that way as it starts, before its first batch
CONNECT_BACK = "Python worker failed to connect back"
STARTS = 5  # starts in a row that may fail so before the mirror gives up
KEEP_REPLACED = 60.0  # seconds a replaced Parquet snapshot stays for readers that opened it


def current_snapshot(path: str) -> str | None:
    """The directory of the mirror's newest complete snapshot (None: nothing applied yet)."""
    try:
        with open(os.path.join(path, CURRENT), encoding="utf-8") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(path, name)


def read_mirror(spark: Any, path: str) -> Any:
    """The mirror as a DataFrame of the table's columns."""
    snapshot = current_snapshot(path)
    if snapshot is None:
        raise FileNotFoundError(f"{path} holds no mirror yet")
    return spark.read.parquet(snapshot)


def apply_changes(spark: Any, changes: Any, batch_id: int, path: str, key: list[str],
                  keep_replaced: float = KEEP_REPLACED) -> None:
    """Apply one micro-batch of change records to the mirror at ``path``: a new snapshot,
    then ``CURRENT`` moved to it; the one it replaces is removed by a batch at least
    ``keep_replaced`` seconds later (a reader that read ``CURRENT`` before the move reads
    on)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from mariadb_cdc_client.spark.lakehouse import POSITION, in_stream_order
    from mariadb_cdc_client.spark.types import METADATA

    snapshot = current_snapshot(path)
    done = int(os.path.basename(snapshot).partition("=")[2]) if snapshot else -1
    if batch_id <= done:
        return  # applied before a crash; Spark runs the batch again
    # numbered on the scan, before the window's shuffle; persisted: used three times below
    changes = in_stream_order(changes).persist()
    columns = [c for c in changes.columns if c not in (*METADATA.fieldNames(), POSITION)]
    order = Window.partitionBy(*key).orderBy(F.col(POSITION).desc())
    last = changes.withColumn("_n", F.row_number().over(order)).filter("_n = 1")
    present = last.filter(F.col("event_type").isin("insert", "update_after")).select(*columns)
    if snapshot is not None:
        kept = spark.read.parquet(snapshot).join(last.select(*key), on=key, how="left_anti")
        present = kept.unionByName(present, allowMissingColumns=True)
    name = f"batch={batch_id}"
    present.write.mode("overwrite").parquet(os.path.join(path, name))
    _point_to(path, name)
    changes.unpersist()
    if snapshot is not None:
        now = time.time()  # when it was replaced: what remove_replaced counts from
        os.utime(snapshot, (now, now))
    remove_replaced(path, keep_replaced)


def remove_replaced(path: str, keep: float) -> list[str]:
    """Remove the snapshots at ``path`` that were replaced more than ``keep`` seconds ago
    (a snapshot's directory's modification time is when ``CURRENT`` left it), and any other
    ``batch=N`` directory as old: one a crash left half written. Returns their names."""
    current = current_snapshot(path)
    before = time.time() - keep
    removed = []
    for entry in os.scandir(path):
        if entry.name.startswith("batch=") and entry.path != current and \
                entry.stat(follow_symlinks=False).st_mtime < before:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _point_to(path: str, name: str) -> None:
    temporary = os.path.join(path, CURRENT + ".tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, os.path.join(path, CURRENT))


def primary_key(spark_options: dict[str, str], table: str) -> list[str]:
    """The table's primary key (its newest version's), as field names: of its stored versions,
    or, when the query starts from a dump and the table has no stored change yet (a table
    the service has only dumped), of its newest dump."""
    from mariadb_cdc_client.spark.plan import Catalog, OptionError, Options

    wanted = parse_table(table)
    options = Options.parse({**spark_options, "tables": table}, streaming=True)
    conn = options.connect()
    try:
        catalog = Catalog.load(conn, options)
    except OptionError:
        raise ValueError(f"{table} is not a stored table") from None
    finally:
        conn.close()
    ref = table_ref(wanted.database, wanted.table)
    versions, dumps = catalog.versions.get(ref) or [], catalog.dumps.get(ref) or []
    if not versions and not dumps:
        raise ValueError(f"{table} is not a stored table")
    avsc = versions[-1] if versions else dumps[-1]["schema"]
    names = {f.get("column", f["name"]): f["name"] for f in avsc["fields"]}
    key = [names[c] for c in avsc.get("primary_key", [])]
    if not key:
        raise ValueError(f"{table} has no primary key: a mirror needs one")
    return key


def start(spark: Any, options: dict[str, str], table: str, path: str, checkpoint: str,
          trigger: dict[str, Any] | None = None, format: str = "parquet",
          catalog: str | None = None, file_size: int | None = None,
          keep_replaced: float = KEEP_REPLACED) -> Any:
    """Start the mirror's streaming query; returns the StreamingQuery. ``format``: parquet
    (snapshots; ``keep_replaced``: seconds a replaced one stays), delta or iceberg
    (``catalog``: the Iceberg SQL catalog's URI; ``file_size``: a new lakehouse table's target
    data file size, bytes)."""
    from mariadb_cdc_client.spark.lakehouse import FILE_SIZE, FORMATS, Batches

    if format not in FORMATS:
        raise ValueError(f"format is one of {', '.join(FORMATS)}, not {format!r}")
    key = primary_key(options, table)
    os.makedirs(path, exist_ok=True)
    changes = spark.readStream.format("cdc").options(**options).option("tables", table).load()
    batches: Callable[[Any, int], None]
    if format == "parquet":
        def batches(df: Any, batch_id: int) -> None:
            apply_changes(spark, df, batch_id, path, key, keep_replaced)
    else:
        ref = parse_table(table)
        batches = Batches(spark, format, path, checkpoint, (ref.database, ref.table), key,
                          catalog, file_size or FILE_SIZE)
    writer = changes.writeStream.option("checkpointLocation", checkpoint).foreachBatch(batches)
    return writer.trigger(**(trigger or {"processingTime": "2 seconds"})).start()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mariadb_cdc_client.spark.mirror",
                                     description="Keep a copy of a table: Parquet snapshots, "
                                                 "or a Delta Lake or Iceberg table")
    parser.add_argument("--table", required=True,
                        help="db.table (a name with a space or a dot quoted: `my db`.t)")
    parser.add_argument("--path", required=True,
                        help="the mirror's directory (iceberg: the warehouse directory)")
    parser.add_argument("--format", default="parquet", choices=["parquet", "delta", "iceberg"],
                        help="parquet (default): a snapshot per batch; delta or iceberg: a "
                             "lakehouse table, one MERGE per batch")
    parser.add_argument("--catalog",
                        help="iceberg: the SQL catalog's URI (default: "
                             "sqlite:///PATH/catalog.db)")
    parser.add_argument("--file-size-mb", type=int, default=32,
                        help="delta, iceberg: a new table's target data file size (a MERGE "
                             "rewrites every file holding a changed key; default 32)")
    parser.add_argument("--keep-replaced", type=float, default=KEEP_REPLACED,
                        metavar="SECONDS",
                        help="parquet: how long a replaced snapshot stays for the readers "
                             f"that opened it before (default {KEEP_REPLACED:g})")
    parser.add_argument("--checkpoint",
                        help="the query's checkpoint directory (default: PATH.checkpoint)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("-P", "--port", default="4001")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", default=os.environ.get("CDC_PASSWORD"))
    parser.add_argument("--auth", default="auto", choices=["auto", "scram", "legacy"],
                        help="the login: auto (SCRAM-SHA-256 when the server offers it), "
                             "scram or legacy (MaxScale's)")
    parser.add_argument("--starting-position", default="dump",
                        help="dump (default), earliest, latest or a GTID state")
    parser.add_argument("--once", action="store_true",
                        help="apply what is stored now and exit (trigger availableNow)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.password:
        parser.error("--password or CDC_PASSWORD is required")
    if args.catalog and args.format != "iceberg":
        parser.error("--catalog is for --format iceberg")
    checkpoint = args.checkpoint or args.path.rstrip("/") + ".checkpoint"
    try:
        require("spark", "the mirror")
        if args.format != "parquet":
            from mariadb_cdc_client.spark.lakehouse import require_lakehouse

            require_lakehouse(f"a {args.format} mirror",
                              "deltalake" if args.format == "delta" else "pyiceberg")
    except MissingExtra as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")

    from pyspark.sql import SparkSession

    from mariadb_cdc_client.spark import register
    from mariadb_cdc_client.spark.workers import default_to_driver_python

    default_to_driver_python()  # before the session starts its workers
    spark = SparkSession.builder.appName(f"cdc-mirror {args.table}").getOrCreate()
    register(spark)
    options = {"host": args.host, "port": args.port, "user": args.user,
               "password": args.password, "auth": args.auth,
               "startingPosition": args.starting_position}
    trigger = {"availableNow": True} if args.once else None
    run(lambda: start(spark, options, args.table, args.path, checkpoint, trigger, args.format,
                      args.catalog, args.file_size_mb * 2**20, args.keep_replaced))
    return 0


def run(start_query: Callable[[], Any], starts: int = STARTS) -> None:
    """Run the mirror's query until it ends. One whose Python worker missed Spark's deadline
    to connect back (``CONNECT_BACK``) is started again from its checkpoint, which makes it
    the same query, up to ``starts`` times in a row; any other failure is raised."""
    for attempt in range(1, starts + 1):
        query = start_query()
        try:
            query.awaitTermination()
            return
        except Exception as exc:
            if CONNECT_BACK not in str(exc) or attempt == starts:
                raise
            log.warning("the query's Python worker missed Spark's 10 s to connect back "
                        "(start %d of %d); starting it again from its checkpoint", attempt,
                        starts)


if __name__ == "__main__":
    sys.exit(main())
