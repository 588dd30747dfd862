"""Record batches of a Spark query's schema, on executors: :class:`mariadb_cdc_client.arrow.
BatchMaker` with the schema Spark reads (a column widened for every version the query reads,
null where a version lacks it) and the constant columns ``_table`` and ``_version``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from mariadb_cdc_client import arrow
from mariadb_cdc_client.format.avro import Header
from mariadb_cdc_client.format.names import table_ref


class BatchMaker(arrow.BatchMaker):
    """Turns chunks of one version's blocks into record batches of the query's ``schema``."""

    def __init__(self, schema: StructType, avsc: dict[str, Any], header: Header,
                 zero_dates: str) -> None:
        # _table: the table as commands name it, the same text as the offsets' keys
        constants = {"_table": table_ref(avsc["database"], avsc["table"]),
                     "_version": int(avsc["version"])}
        super().__init__(to_arrow_schema(schema, timezone="UTC"), avsc, header, zero_dates,
                         constants)
