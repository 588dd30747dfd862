"""Keep a Parquet mirror of a MariaDB table: the example pipeline of the Spark source.

    python -m mariadb_cdc_client.spark.mirror --table shop.orders --path /data/orders \\
        --checkpoint /data/orders.checkpoint --user cdcuser --password cdcpass

A streaming query reads the table's changes (``startingPosition=dump`` builds it from the
newest dump, then follows) and, per micro-batch (``foreachBatch``), applies them: for each
primary key the batch's last change decides, an insert or update_after puts the row, a delete
or update_before removes it. Each batch writes a new snapshot directory ``<path>/batch=<id>``
and then moves the pointer file ``<path>/CURRENT`` to it (an atomic rename), so a reader, or
a crash, only ever sees a whole snapshot; a batch Spark runs again after a crash writes the
same snapshot again. Read the mirror with :func:`read_mirror`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from mariadb_cdc_client.format.extras import MissingExtra, require
from mariadb_cdc_client.format.names import parse_table

CURRENT = "CURRENT"


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


def apply_changes(spark: Any, changes: Any, batch_id: int, path: str, key: list[str]
                  ) -> None:
    """Apply one micro-batch of change records to the mirror at ``path``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from mariadb_cdc_client.spark.types import METADATA

    snapshot = current_snapshot(path)
    done = int(os.path.basename(snapshot).partition("=")[2]) if snapshot else -1
    if batch_id <= done:
        return  # applied before a crash; Spark runs the batch again
    changes = changes.persist()  # used three times below: read the range once
    columns = [c for c in changes.columns if c not in METADATA.fieldNames()]
    order = Window.partitionBy(*key).orderBy(F.col("domain").desc(), F.col("sequence").desc(),
                                             F.col("event_number").desc())
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
        shutil.rmtree(snapshot, ignore_errors=True)


def _point_to(path: str, name: str) -> None:
    temporary = os.path.join(path, CURRENT + ".tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, os.path.join(path, CURRENT))


def primary_key(spark_options: dict[str, str], table: str) -> list[str]:
    """The table's primary key (its newest version's), as field names."""
    from mariadb_cdc_client.spark.plan import Options

    wanted = parse_table(table)
    conn = Options.parse({**spark_options, "tables": table}, streaming=True).connect()
    try:
        tables = conn.query("LIST-TABLES")["tables"]
    finally:
        conn.close()
    for t in tables:
        if (t["database"], t["table"]) == (wanted.database, wanted.table):
            avsc = t["versions"][-1]
            names = {f.get("column", f["name"]): f["name"] for f in avsc["fields"]}
            key = [names[c] for c in avsc.get("primary_key", [])]
            if key:
                return key
            raise ValueError(f"{table} has no primary key: a mirror needs one")
    raise ValueError(f"{table} is not a stored table")


def start(spark: Any, options: dict[str, str], table: str, path: str, checkpoint: str,
          trigger: dict[str, Any] | None = None) -> Any:
    """Start the mirror's streaming query; returns the StreamingQuery."""
    key = primary_key(options, table)
    os.makedirs(path, exist_ok=True)
    changes = spark.readStream.format("cdc").options(**options).option("tables", table).load()
    writer = (changes.writeStream.option("checkpointLocation", checkpoint)
              .foreachBatch(lambda df, batch_id: apply_changes(spark, df, batch_id, path, key)))
    return writer.trigger(**(trigger or {"processingTime": "2 seconds"})).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mariadb_cdc_client.spark.mirror",
                                     description="Keep a Parquet mirror of a table")
    parser.add_argument("--table", required=True,
                        help="db.table (a name with a space or a dot quoted: `my db`.t)")
    parser.add_argument("--path", required=True, help="the mirror's directory")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
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
    args = parser.parse_args(argv)
    if not args.password:
        parser.error("--password or CDC_PASSWORD is required")
    try:
        require("spark", "the mirror")
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
    query = start(spark, options, args.table, args.path, args.checkpoint, trigger)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
