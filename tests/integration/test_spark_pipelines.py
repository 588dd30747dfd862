"""The ``cdc`` source in a Spark Declarative Pipeline: the example project
(examples/pipelines/cdc_scd) run with ``spark-pipelines`` as a user would, in a process of its
own, on a local Spark Connect server that the command starts.

Spark's Auto CDC flows write only into tables that support MERGE (Delta Lake, Iceberg), and
neither ships with Spark: set ``CDC_SDP_SPARK_ARGS`` to the ``spark-pipelines`` arguments that
bring one (``--packages ... --conf ...``) to run the SCD tables' test; without it, the
pipeline's ``changes`` table (a plain append) is run, and the Auto CDC flows are only
analysed (the graph resolves against the source's schema)."""

from __future__ import annotations

import asyncio
import itertools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import JVM_OPTIONS, PASSWORD, USER

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipelines" / "cdc_scd"
BIN = Path(sys.executable).parent


def _project(tmp_path: Path, cdc: RunningService, table: str) -> Path:
    """The example project, set to the test's service and table."""
    import yaml

    project = tmp_path / "cdc_scd"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec_path = project / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["storage"] = f"file://{tmp_path / 'storage'}"
    spec["configuration"].update({"cdc.host": cdc.host, "cdc.port": str(cdc.port),
                                  "cdc.user": USER, "cdc.table": table,
                                  "spark.sql.session.timeZone": "UTC",
                                  "spark.sql.shuffle.partitions": "2"})
    spec_path.write_text(yaml.safe_dump(spec))
    return project


def _spark_pipelines(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import pyspark

    env = {**os.environ, "SPARK_HOME": os.path.dirname(pyspark.__file__),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "CDC_PASSWORD": PASSWORD,
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    command = [str(BIN / "spark-pipelines"), *args,
               "--conf", f"spark.sql.warehouse.dir={project / 'spark-warehouse'}",
               "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS}",
               *shlex.split(os.environ.get("CDC_SDP_SPARK_ARGS", ""))]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True,
                          timeout=240, check=False)


def _read_table(project: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    path = project / "spark-warehouse" / name
    if (path / "_delta_log").is_dir():  # a Delta Lake table: its files are not all current
        from deltalake import DeltaTable

        return DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return pq.read_table(path).to_pylist()


def _changes(source: Source) -> str:
    t = f"`{source.database}`.customers"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), city VARCHAR(20))",
                   f"INSERT INTO {t} VALUES (1, 'ann', 'Oslo'), (2, 'bob', 'Rome'), "
                   "(3, 'cid', 'Nice')",
                   f"UPDATE {t} SET city = 'Bergen' WHERE id = 1",
                   f"DELETE FROM {t} WHERE id = 3",
                   f"UPDATE {t} SET city = 'Tromso' WHERE id = 1",
                   f"INSERT INTO {t} VALUES (4, 'dan', NULL)")
    return t


@pytest.mark.timeout(900)  # 230-280 s on an idle machine: the suite's 300 s is no guard here
async def test_the_changes_table_holds_every_change_in_stream_order(
        cdc: RunningService, source: Source, tmp_path: Path):
    """(One of the suite's longest, 1.5-3 minutes on 2 cores: ``spark-pipelines`` is run twice,
    a dry run and a run, each a JVM of its own; that is what a user runs.)"""
    _changes(source)
    await cdc.caught_up(source)
    project = _project(tmp_path, cdc, f"{source.database}.customers")

    # the whole graph, Auto CDC flows included, resolves against the source's schema
    dry = await asyncio.to_thread(_spark_pipelines, project, "dry-run")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-5000:]
    assert "Run is COMPLETED" in dry.stdout + dry.stderr
    ran = await asyncio.to_thread(_spark_pipelines, project, "run", "--refresh", "changes")

    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
    assert "Run is COMPLETED" in ran.stdout + ran.stderr
    rows = sorted(_read_table(project, "changes"), key=lambda r: r["_position"])
    assert [(r["event_type"], r["id"], r["city"]) for r in rows] == [
        ("insert", 1, "Oslo"), ("insert", 2, "Rome"), ("insert", 3, "Nice"),
        ("update_before", 1, "Oslo"), ("update_after", 1, "Bergen"),
        ("delete", 3, "Nice"),
        ("update_before", 1, "Bergen"), ("update_after", 1, "Tromso"),
        ("insert", 4, None)]
    assert len({r["_position"] for r in rows}) == len(rows)


@pytest.mark.skipif(not os.environ.get("CDC_SDP_SPARK_ARGS"),
                    reason="Auto CDC needs a MERGE-capable table format: set "
                           "CDC_SDP_SPARK_ARGS (e.g. Delta Lake's --packages and --conf)")
async def test_auto_cdc_keeps_the_table_and_its_history(
        cdc: RunningService, source: Source, tmp_path: Path):
    t = _changes(source)
    await cdc.caught_up(source)
    project = _project(tmp_path, cdc, f"{source.database}.customers")

    ran = await asyncio.to_thread(_spark_pipelines, project, "run")

    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
    scd1 = sorted((r["id"], r["name"], r["city"]) for r in _read_table(project, "customers_scd1"))
    assert scd1 == sorted(source.query(f"SELECT id, name, city FROM {t}"))
    scd2 = _read_table(project, "customers_scd2")
    versions = sorted(((r["id"], r["city"], r["__START_AT"], r["__END_AT"]) for r in scd2),
                      key=lambda v: (v[0], v[2]))
    assert [(i, city, end is None) for i, city, _, end in versions] == [
        (1, "Oslo", False), (1, "Bergen", False), (1, "Tromso", True),
        (2, "Rome", True), (3, "Nice", False), (4, None, True)]
    for older, newer in itertools.pairwise(versions):
        if older[0] == newer[0]:
            assert older[3] <= newer[2]  # a version ends where (or before) the next starts
