"""Spark's Python workers, and the interpreter they run.

Spark runs a Python data source in worker processes it starts with ``PYSPARK_PYTHON``
(default: ``python3`` on the PATH), not with the driver's interpreter. A driver in a virtualenv
then has workers that cannot import this package, and all Spark says is ``No module named
'mariadb_cdc_client'``. So:

- a session this package creates (``python -m mariadb_cdc_client.spark.mirror``) runs its
  workers with the driver's interpreter unless ``PYSPARK_PYTHON`` names one (``spark-submit``
  passes ``spark.pyspark.python`` to the driver there): :func:`default_to_driver_python`,
  called before the session starts;
- on a cluster, executors run the interpreter of a packed environment shipped with
  ``--archives env.tar.gz#environment`` (:mod:`mariadb_cdc_client.spark.pack`):
  ``spark.pyspark.python=./environment/bin/python``, a path in each executor's working
  directory. Spark also runs a Python data source on the driver's side (the schema, the
  partitions, the stream's offsets) with that same setting, from the driver's working
  directory, where in client mode nothing is unpacked: ``Cannot run program
  "./environment/bin/python"``. :func:`driver_side_environment` makes that path run the
  driver's own interpreter there (a two-line script, created only where nothing is), so the planning
  runs with the driver's Python and the tasks with the archive's;
- in a session the user created, :func:`register_source` registers this module's
  :class:`CdcDataSource`, which cloudpickle sends to the workers by value, so it loads there
  without the package. It imports the source proper (:mod:`mariadb_cdc_client.spark.source`)
  only there, and when that fails it says which interpreter to set.
"""

from __future__ import annotations

import importlib
import os
import shlex
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
    driver_side_environment(_worker_python(spark))


def _worker_python(spark: Any) -> str | None:
    try:  # not under Spark Connect, which has no SparkContext here
        setting: str | None = spark.sparkContext.getConf().get("spark.pyspark.python")
    except Exception:  # noqa: BLE001 (any failure: fall back to the environment)
        setting = None
    return setting or os.environ.get(WORKER_PYTHON)


def driver_side_environment(worker_python: str | None, cwd: str | None = None) -> str | None:
    """When the workers' Python is a relative path (a packed environment's) that does not
    exist in the driver's working directory, make it start the driver's interpreter;
    returns the script made (None: nothing to do)."""
    if not worker_python or os.path.isabs(worker_python):
        return None
    path = os.path.join(cwd or os.getcwd(), worker_python)
    top = os.path.join(cwd or os.getcwd(), worker_python.lstrip("./").split("/", 1)[0])
    if os.path.lexists(path) or os.path.lexists(top):
        return None  # unpacked here (cluster mode), or something of the user's
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # a script, not a link: a virtualenv's
        # interpreter knows its packages from the path it is started by
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


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
