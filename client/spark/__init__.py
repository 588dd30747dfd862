"""A PySpark data source over the CDC service (Python Data Source API, Spark 4).

    from mariadb_cdc_client.spark import register
    register(spark)
    df = (spark.readStream.format("cdc")
          .option("host", "127.0.0.1").option("port", 4001)
          .option("user", "cdcuser").option("password", "cdcpass")
          .option("tables", "shop.orders").option("startingPosition", "earliest")
          .load())

Needs the ``spark`` extra (pyspark, pyarrow). See docs/spark.md.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("cdc")`` available in this Spark session. Its Python workers need an
    interpreter that can import this package (``PYSPARK_PYTHON``); when theirs cannot, the
    read fails saying what to set (:mod:`mariadb_cdc_client.spark.workers`)."""
    from mariadb_cdc_client.format.extras import require

    require("spark", "the Spark source")
    from mariadb_cdc_client.spark.workers import register_source

    register_source(spark)
