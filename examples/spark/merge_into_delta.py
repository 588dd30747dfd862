"""Keep a Delta Lake table equal to a MariaDB table with Spark's own MERGE INTO: a streaming
query reads the table's changes from the CDC service (the ``cdc`` source) and its
``foreachBatch`` MERGEs each micro-batch into the Delta table.

Run it with ``spark-submit`` and Delta Lake's jars (Delta 4.4 is built for Spark 4.2):

    spark-submit --jars delta-spark_4.2_2.13-4.4.0.jar,delta-storage-4.4.0.jar \\
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
        examples/spark/merge_into_delta.py --table shop.orders --path /data/orders \\
        --checkpoint /data/orders.checkpoint --host 127.0.0.1 --port 4001 --user cdcuser

(the password from ``CDC_PASSWORD``). Per micro-batch, one MERGE:

- **SCD type 1** (``--scd 1``, the default), the table as it is. **Last change per key
  wins.** The batch's records are numbered in the order the source read them
  (``in_stream_order``: the stored binlog order, also in a GTID domain whose sequence numbers
  went down), and for each primary key only the last one is merged.
- **Deletes applied.** A ``delete`` or ``update_before`` (the old key of a primary-key change)
  as a key's last change deletes its row; an ``insert`` or ``update_after`` updates or inserts.
- **SCD type 2** (``--scd 2``), every version of every row, valid from ``__START_AT`` to
  ``__END_AT`` (null: the current version): places in the stream, in the order the source
  read the changes (see :func:`scd2`). A key's first change in the batch ends its current
  version; each ``insert``/``update_after`` opens one, which the key's next change ends.
- **Exactly once.** The MERGE carries the query's checkpoint and the batch id as a Delta
  application transaction (``spark.databricks.delta.write.txnAppId``/``txnVersion``): a batch
  Spark runs again after the driver was killed, which Delta already committed, is skipped.
- **New columns** (an ``ADD COLUMN`` on the source, once the stream holds them) are added to
  the table (``spark.databricks.delta.schema.autoMerge.enabled``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from mariadb_cdc_client.spark import register
from mariadb_cdc_client.spark.lakehouse import POSITION, in_stream_order
from mariadb_cdc_client.spark.mirror import primary_key
from mariadb_cdc_client.spark.types import METADATA

REMOVED = "event_type IN ('delete', 'update_before')"
PRESENT = "event_type IN ('insert', 'update_after')"
START, END = "__START_AT", "__END_AT"  # SCD type 2: a version's validity, as Auto CDC names it
TXN_APP_ID, TXN_VERSION = ("spark.databricks.delta.write.txnAppId",
                           "spark.databricks.delta.write.txnVersion")


def scd1(path: str, key: list[str], app_id: str) -> Callable[[DataFrame, int], None]:
    """SCD type 1, the table as it is: each key's last change in the batch is MERGEd."""
    def merge(changes: DataFrame, batch_id: int) -> None:
        spark = changes.sparkSession  # the batch's session: the MERGE's settings go on it
        numbered = in_stream_order(changes)  # on the scan, before the window's shuffle
        columns = _columns(numbered)
        newest = Window.partitionBy(*key).orderBy(F.col(POSITION).desc())
        last = (numbered.withColumn("_n", F.row_number().over(newest)).filter("_n = 1")
                .select(*columns, F.expr(REMOVED).alias("_removed")))
        _create(spark, path, last.select(*columns))
        last.createOrReplaceTempView("cdc_last_changes")
        _exactly_once(spark, app_id, batch_id, f"""
            MERGE INTO delta.`{path}` AS t USING cdc_last_changes AS s
            ON {_same(key)}
            WHEN MATCHED AND s._removed THEN DELETE
            WHEN MATCHED THEN UPDATE SET {", ".join(f"`{c}` = s.`{c}`" for c in columns)}
            WHEN NOT MATCHED AND NOT s._removed THEN {_insert(columns)}""")
    return merge


def scd2(path: str, key: list[str], app_id: str) -> Callable[[DataFrame, int], None]:
    """SCD type 2, every version of every row: an ``insert``/``update_after`` opens a version
    at its place in the stream (``__START_AT``), the key's next change (an ``update_before``,
    a ``delete``) ends it (``__END_AT``; null: the current version). A place in the stream is
    the batch id times 2^31 plus the change's number in its batch, so it follows the order the
    service streamed the changes in, across GTID domains, and across batches."""
    def merge(changes: DataFrame, batch_id: int) -> None:
        spark = changes.sparkSession
        numbered = in_stream_order(changes)
        columns = _columns(numbered)
        # the whole batch numbered in one window: the example's simplicity, not Spark's best
        at = numbered.withColumn(START, F.row_number().over(Window.orderBy(POSITION))
                                 + F.lit(batch_id) * F.lit(2**31))
        per_key = Window.partitionBy(*key).orderBy(START)
        at = at.withColumn(END, F.lead(START).over(per_key)) \
            .withColumn("_first", F.row_number().over(per_key) == 1)
        # one MERGE: each key's first change ends the table's current version of it, and
        # every version the batch opens is inserted (a null _close never matches)
        ends = at.filter("_first").select(*columns, F.col(START).alias(END),
                                          F.lit(None).cast("long").alias(START),
                                          F.lit(True).alias("_close"))
        opens = at.filter(PRESENT).select(*columns, END, START, F.lit(False).alias("_close"))
        _create(spark, path, opens.select(*columns, START, END))
        ends.unionByName(opens).createOrReplaceTempView("cdc_versions")
        _exactly_once(spark, app_id, batch_id, f"""
            MERGE INTO delta.`{path}` AS t USING cdc_versions AS s
            ON s._close AND {_same(key)} AND t.{END} IS NULL
            WHEN MATCHED THEN UPDATE SET t.{END} = s.{END}
            WHEN NOT MATCHED AND NOT s._close THEN {_insert([*columns, START, END])}""")
    return merge


def _columns(numbered: DataFrame) -> list[str]:
    """The table's columns: the source's, without its metadata."""
    return [c for c in numbered.columns if c not in (*METADATA.fieldNames(), POSITION)]


def _same(key: list[str]) -> str:
    return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)


def _insert(columns: list[str]) -> str:
    return (f"INSERT ({', '.join(f'`{c}`' for c in columns)}) "
            f"VALUES ({', '.join(f's.`{c}`' for c in columns)})")


def _create(spark: SparkSession, path: str, rows: DataFrame) -> None:
    """The first batch makes the table, with its rows' schema (no rows)."""
    if not _exists(spark, path):
        rows.limit(0).write.format("delta").save(path)


def _exactly_once(spark: SparkSession, app_id: str, batch_id: int, merge: str) -> None:
    """Run ``merge`` as the Delta transaction (``app_id``, ``batch_id``): one Delta already
    committed (the batch run again after a crash) is skipped."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(batch_id))
    try:
        spark.sql(merge)
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def _exists(spark: SparkSession, path: str) -> bool:
    try:
        spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()
    except AnalysisException:  # not a Delta table (yet)
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", required=True, help="db.table")
    parser.add_argument("--path", required=True, help="the Delta table's directory")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="4001")
    parser.add_argument("--user", required=True)
    parser.add_argument("--starting-position", default="dump",
                        help="dump (default), earliest, latest or a GTID state")
    parser.add_argument("--scd", type=int, choices=[1, 2], default=1,
                        help="1 (default): the table as it is; 2: every version of every row")
    parser.add_argument("--once", action="store_true", help="what is stored now, then exit")
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"merge {args.table} into Delta").getOrCreate()
    spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
    register(spark)
    options = {"host": args.host, "port": args.port, "user": args.user,
               "password": os.environ["CDC_PASSWORD"], "tables": args.table,
               "startingPosition": args.starting_position}
    key = primary_key(options, args.table)
    query = (spark.readStream.format("cdc").options(**options).load().writeStream
             .option("checkpointLocation", args.checkpoint)
             .trigger(**({"availableNow": True} if args.once else
                         {"processingTime": "2 seconds"})))
    app_id = f"mariadb-cdc {args.table} {os.path.abspath(args.checkpoint)}"
    merge = scd1 if args.scd == 1 else scd2
    running = query.foreachBatch(merge(args.path, key, app_id)).start()
    running.awaitTermination()


if __name__ == "__main__":
    main()
