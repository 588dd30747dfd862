"""Delta Lake inside Spark, for the test of Spark's own MERGE INTO a Delta table
(tests/integration/test_spark_delta_merge.py), which runs in an environment of its own.

Delta's newest release, 4.4, is built for Spark 4.2, and its MERGE fails on the Spark 4.3 of
this project's test environment (``NoSuchMethodError: LogicalRDD.<init>``). So
``tests/run.sh`` makes ``.venv-delta`` (PySpark 4.2 and this project, as a user of Delta
installs them) and ``tests/jvm/delta`` holds Delta's two jars, given to Spark with ``--jars``.
The test starts that environment's Spark (a standalone cluster, ``spark-submit``) as
processes of their own; the test itself runs in the main environment. ``CDC_DELTA_VENV``
names another such environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.jvm import MissingComponent, classpath

ROOT = Path(__file__).resolve().parents[1]
SPARK_VERSION = "4.2"  # the newest Spark a Delta release is built for (tests/jvm/delta)
CONF = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}


def venv() -> Path:
    path = Path(os.environ.get("CDC_DELTA_VENV") or ROOT / ".venv-delta")
    if not (path / "bin" / "python").exists():
        raise MissingComponent(f"no Spark {SPARK_VERSION} environment for Delta Lake at {path}: "
                               "tests/run.sh makes it (python3 -m venv .venv-delta; "
                               ".venv-delta/bin/pip install -e '.[spark]' "
                               f"'pyspark=={SPARK_VERSION}.0')")
    return path


def bin_dir() -> Path:
    """The environment's commands: python, spark-submit."""
    return venv() / "bin"


def spark_home() -> Path:
    found = sorted((venv() / "lib").glob("python3*/site-packages/pyspark/bin"))
    if not found:
        raise MissingComponent(f"no PySpark in {venv()}")
    return found[-1].parent


def spark_args(*more_jars: str) -> list[str]:
    """What a ``spark-submit`` command line needs for Delta tables (and ``more_jars``)."""
    jars = [*classpath("delta").split(os.pathsep), *more_jars]
    # --jars for the executors, and on the driver's own class path as well
    args = ["--jars", ",".join(jars), "--driver-class-path", os.pathsep.join(jars)]
    for key, value in CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args
