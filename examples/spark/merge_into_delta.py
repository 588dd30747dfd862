"""Keep a Delta Lake table equal to a MariaDB table with Spark's own MERGE INTO: a streaming
query reads the table's changes from the CDC service (the ``cdc`` source) and its
``foreachBatch`` MERGEs each micro-batch into the Delta table.

Run it with ``spark-submit`` and Delta Lake's jars (Delta 4.4 is built for Spark 4.2):

    spark-submit --jars delta-spark_4.2_2.13-4.4.0.jar,delta-storage-4.4.0.jar \\
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
        examples/spark/merge_into_delta.py --table shop.orders --path /data/orders \\
        --checkpoint /data/orders.checkpoint --host 127.0.0.1 --port 4001 --user cdcuser

(the password from ``CDC_PASSWORD``). Per micro-batch:

- **Last change per key wins.** The batch's records are numbered in the order the source read
  them (``in_stream_order``: the stored binlog order, also in a GTID domain whose sequence
  numbers went down), and for each primary key only the last one is merged.
- **Deletes applied.** A ``delete`` or ``update_before`` (the old key of a primary-key change)
  as a key's last change deletes its row; an ``insert`` or ``update_after`` updates or inserts.
- **Exactly once.** The MERGE carries the query's id and the batch id as a Delta application
  transaction (``spark.databricks.delta.write.txnAppId``/``txnVersion``): a batch Spark runs
  again after the driver was killed, which Delta already committed, is skipped.
- **New columns** (an ``ADD COLUMN`` on the source, once the stream holds them) are added to
  the table (``spark.databricks.delta.schema.autoMerge.enabled``).
"""

from __future__ import annotations

import argparse
import os

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from mariadb_cdc_client.spark import register
from mariadb_cdc_client.spark.lakehouse import POSITION, in_stream_order
from mariadb_cdc_client.spark.mirror import primary_key
from mariadb_cdc_client.spark.types import METADATA

REMOVED = "event_type IN ('delete', 'update_before')"


def merge_batch(path: str, key: list[str], app_id: str):
    """The ``foreachBatch`` function: one MERGE INTO the Delta table at ``path``."""
    def merge(changes: DataFrame, batch_id: int) -> None:
        spark = changes.sparkSession  # the batch's session: the MERGE's settings go on it
        # numbered on the scan, before the window's shuffle
        numbered = in_stream_order(changes)
        columns = [c for c in numbered.columns if c not in (*METADATA.fieldNames(), POSITION)]
        newest = Window.partitionBy(*key).orderBy(F.col(POSITION).desc())
        last = (numbered.withColumn("_n", F.row_number().over(newest)).filter("_n = 1")
                .select(*columns, F.expr(REMOVED).alias("_removed")))
        if not _exists(spark, path):  # the first batch makes the table (its schema)
            last.filter("NOT _removed").drop("_removed").limit(0).write.format("delta") \
                .save(path)
        last.createOrReplaceTempView("cdc_last_changes")
        names = ", ".join(f"`{c}`" for c in columns)
        spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            spark.sql(f"""
                MERGE INTO delta.`{path}` AS t USING cdc_last_changes AS s
                ON {" AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)}
                WHEN MATCHED AND s._removed THEN DELETE
                WHEN MATCHED THEN UPDATE SET {", ".join(f"`{c}` = s.`{c}`" for c in columns)}
                WHEN NOT MATCHED AND NOT s._removed THEN
                    INSERT ({names}) VALUES ({", ".join(f"s.`{c}`" for c in columns)})""")
        finally:
            spark.conf.unset("spark.databricks.delta.write.txnAppId")
            spark.conf.unset("spark.databricks.delta.write.txnVersion")
    return merge


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
    running = query.foreachBatch(merge_batch(args.path, key, app_id)).start()
    running.awaitTermination()


if __name__ == "__main__":
    main()
