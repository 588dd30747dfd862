"""Spark's Python workers, and the interpreter they run.

Spark runs a Python data source in worker processes it starts with ``PYSPARK_PYTHON``
(default: ``python3`` on the PATH), not with the driver's interpreter. A driver in a virtualenv
then has workers that cannot import this package, and all Spark says is ``No module named
'mariadb_cdc_client'``. So:

- a session this package creates (``python -m mariadb_cdc_client.spark.mirror``) runs its
  workers with the driver's interpreter unless ``PYSPARK_PYTHON`` names one (``spark-submit``
  passes ``spark.pyspark.python`` to the driver there): :func:`default_to_driver_python`,
  called before the session starts;
- in a session the user created, :func:`register_source` registers this module's
  :class:`CdcDataSource`, which cloudpickle sends to the workers by value, so it loads there
  without the package. It imports the source proper (:mod:`mariadb_cdc_client.spark.source`)
  only there, and when that fails it says which interpreter to set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

WORKER_PYTHON = "PYSPARK_PYTHON"


def default_to_driver_python(environ: MutableMapping[str, str] = os.environ) -> None:
    """For a session about to start: its workers run this interpreter, unless one is set."""
    if not environ.get(WORKER_PYTHON):
        environ[WORKER_PYTHON] = sys.executable


def register_source(spark: Any) -> None:
    """``format("cdc")`` in ``spark``, loadable by workers that cannot import this package."""
    from pyspark import cloudpickle  # the one Spark pickles the data source with

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(CdcDataSource)


class CdcDataSource(DataSource):
    """The ``cdc`` source as the workers receive it: it hands each call to the source proper,
    :class:`mariadb_cdc_client.spark.source.CdcDataSource`, which it imports there."""

    driver_python = sys.executable  # evaluated on the driver, pickled with the class

    @classmethod
    def name(cls) -> str:
        return "cdc"

    def schema(self) -> StructType:
        schema: StructType = self._source().schema()
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        reader: DataSourceReader = self._source().reader(schema)
        return reader

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader: DataSourceStreamReader = self._source().streamReader(schema)
        return reader

    def _source(self) -> Any:
        try:
            source = importlib.import_module("mariadb_cdc_client.spark.source")
        except ImportError as exc:
            raise ImportError(
                f"this Spark worker's Python ({sys.executable}) cannot load the cdc data source "
                f"({exc}): set PYSPARK_PYTHON={self.driver_python} (the driver's Python) "
                "before the Spark session starts, or install mariadb-cdc[spark] into the "
                "workers' Python") from exc
        return source.CdcDataSource(self.options)
