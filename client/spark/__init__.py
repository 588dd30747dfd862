"""A PySpark data source over the CDC service (Python Data Source API, Spark 4).

    from client.spark import register
    register(spark)
    df = (spark.readStream.format("cdc")
          .option("host", "127.0.0.1").option("port", 4001)
          .option("user", "cdcuser").option("password", "cdcpass")
          .option("tables", "shop.orders").option("startingPosition", "earliest")
          .load())

Needs the ``spark`` extra (pyspark, pyarrow). See the README's "Spark" section.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("cdc")`` available in this Spark session."""
    from client.spark.source import CdcDataSource

    spark.dataSource.register(CdcDataSource)
