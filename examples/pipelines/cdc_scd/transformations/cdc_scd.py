"""One MariaDB table through the ``cdc`` source into three tables:

- ``changes``: every change record, appended (the source's columns and ``_position``);
- ``<table>_scd1``: the table as it is now (SCD type 1), by Spark's Auto CDC;
- ``<table>_scd2``: every version of every row (SCD type 2), valid from ``__START_AT`` to
  ``__END_AT`` (null: the current version), both a ``_position``.

``_position`` orders the changes in the order the service stored them (the binlog's), also in
a GTID domain whose sequence numbers go down (no ``gtid_strict_mode``), where
``(domain, sequence, event_number)`` would not. A ``delete`` deletes, and so does an
``update_before`` (the row before an update), at its own position: a primary key change is an
``update_before`` of the old key then an ``update_after`` of the new, and only so does the old
key's row go. An update of the same key closes its SCD2 version at the ``update_before``'s
position and opens the next at the ``update_after``'s, the one after it.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import functions as F

from mariadb_cdc_client.format.names import parse_table
from mariadb_cdc_client.spark.mirror import primary_key
from mariadb_cdc_client.spark.pipelines import POSITION, register
from mariadb_cdc_client.spark.types import METADATA

spark = globals()["spark"]  # the pipeline's session, set by spark-pipelines
register(spark)


def setting(name: str, default: str | None = None) -> str:
    value = spark.conf.get(f"cdc.{name}", default)
    if value is None:
        raise ValueError(f"set cdc.{name} in spark-pipeline.yml's configuration")
    return value


table = setting("table")
options = {"host": setting("host", "127.0.0.1"), "port": setting("port", "4001"),
           "user": setting("user"), "password": os.environ.get("CDC_PASSWORD") or
           setting("password"), "auth": setting("auth", "auto")}
keys = primary_key(options, table)
name = parse_table(table).table
metadata = [*METADATA.fieldNames(), POSITION]


@dp.temporary_view(name="cdc_changes")
def cdc_changes():
    return (spark.readStream.format("cdc").options(**options).option("tables", table)
            .option("startingPosition", setting("startingPosition", "earliest")).load())


@dp.table(name="changes", comment=f"Every change record of {table}")
def changes():
    return spark.readStream.table("cdc_changes")


DELETES = "event_type IN ('delete', 'update_before')"


for scd in (1, 2):
    target = f"{name}_scd{scd}"
    dp.create_streaming_table(target, comment=f"{table}, SCD type {scd}")
    dp.create_auto_cdc_flow(
        target=target, source="cdc_changes", keys=keys, sequence_by=POSITION,
        apply_as_deletes=F.expr(DELETES), except_column_list=metadata,
        stored_as_scd_type=scd)
