"""Spark's Python workers and the ``cdc`` source, without ``PYSPARK_PYTHON``: docs/spark.md's
mirror command works as written, and in a session the user made, a read says what to set.

Each runs in a process of its own, as a user would, outside the source tree, with the
system's ``python3`` first on the PATH: the interpreter Spark's workers run by default, which
cannot import this package."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import JVM_OPTIONS, PASSWORD, USER

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]

SYSTEM_PATH = "/usr/bin:/bin"


@pytest.fixture
def without_pyspark_python(tmp_path: Path) -> dict[str, str]:
    """An environment without PYSPARK_PYTHON, whose ``python3`` cannot import
    ``mariadb_cdc_client``."""
    probe = subprocess.run(["python3", "-c", "import mariadb_cdc_client"], cwd=tmp_path,
                           check=False, env={"PATH": SYSTEM_PATH}, capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the system's python3 imports `mariadb_cdc_client`: the failure cannot "
                    "happen here")
    return {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", str(tmp_path)),
            "SPARK_LOCAL_IP": "127.0.0.1", "CDC_PASSWORD": PASSWORD,
            "SPARK_SUBMIT_OPTS": JVM_OPTIONS}  # the driver JVM's (tests/helpers.py)


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=240, check=False)


async def test_the_mirror_command_runs_its_workers_with_the_drivers_python(
        cdc: RunningService, source: Source, tmp_path: Path,
        without_pyspark_python: dict[str, str]):
    import pyarrow.parquet as pq

    from mariadb_cdc_client.spark.mirror import current_snapshot

    t = f"`{source.database}`.stock"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), qty INT)",
                   f"INSERT INTO {t} VALUES (1, 'a', 10), (2, 'b', 20), (3, 'c', 30)",
                   f"UPDATE {t} SET qty = 21 WHERE id = 2", f"DELETE FROM {t} WHERE id = 3")
    await cdc.caught_up(source)
    mirror = tmp_path / "mirror"
    command = [sys.executable, "-m", "mariadb_cdc_client.spark.mirror", "--table",
               f"{source.database}.stock", "--path", str(mirror), "--checkpoint",
               str(tmp_path / "checkpoint"), "--host", cdc.host, "-P", str(cdc.port),
               "--user", USER, "--starting-position", "earliest", "--once"]

    ran = await asyncio.to_thread(_run, command, without_pyspark_python, tmp_path)

    assert ran.returncode == 0, ran.stderr[-4000:]
    snapshot = current_snapshot(str(mirror))
    assert snapshot is not None
    rows = pq.read_table(snapshot, columns=["id", "name", "qty"]).to_pylist()
    assert sorted((r["id"], r["name"], r["qty"]) for r in rows) == \
        sorted(source.query(f"SELECT id, name, qty FROM {t}"))


USERS_OWN_SESSION = """
from pyspark.sql import SparkSession

from mariadb_cdc_client.spark import register

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
register(spark)
try:
    spark.read.format("cdc").options(port="1", user="u", password="p", tables="db.t").load()
except Exception as exc:
    print(exc)
finally:
    spark.stop()
"""


def test_a_session_the_user_made_says_which_python_its_workers_need(
        tmp_path: Path, without_pyspark_python: dict[str, str]):
    script = tmp_path / "own_session.py"
    script.write_text(USERS_OWN_SESSION)

    ran = _run([sys.executable, str(script)], without_pyspark_python, tmp_path)

    assert f"set PYSPARK_PYTHON={sys.executable} (the driver's Python)" in ran.stdout, \
        ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "cannot load the cdc data source (No module named 'mariadb_cdc_client')" \
        in ran.stdout
