"""The Spark source on a Spark standalone cluster whose executors cannot import this package.

A master and a worker (one core and 1 GiB, on 127.0.0.1) are started from the PySpark
install, as ``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``. Each
application is a ``spark-submit`` in a process of its own, as a user runs one; its executors
are the workers' processes, whose Python is a bare virtualenv (no ``mariadb_cdc_client``, no
``fastavro``): what they need comes in the archive ``python -m
mariadb_cdc_client.spark.pack`` builds, shipped with ``--archives``. Without it the read
fails. With it: a batch read, the Parquet mirror as a streaming query, an executor killed
with -9 mid-batch, and the driver killed with -9 and restarted from its checkpoint, each
time the mirror equal to ``SELECT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import artifacts
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, until
from tests.spark_cluster import Cluster, batches_begun, running, why_failed

# one worker for the module: its tests share the cluster (eight JVMs or more per test)
pytestmark = [pytest.mark.mariadb, pytest.mark.spark,
              pytest.mark.xdist_group("spark-cluster")]



@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' environment, as docs/spark.md says to build it (once per run)."""
    return artifacts.packed_environment(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("cluster")) as started:
        yield started


BATCH_READ = """
import json, sys
from pyspark.sql import SparkSession
from mariadb_cdc_client.spark import register

spark = SparkSession.builder.appName("cdc batch read").getOrCreate()
register(spark)
host, port, user, password, table, out = sys.argv[1:]
rows = (spark.read.format("cdc").option("host", host).option("port", port)
        .option("user", user).option("password", password).option("tables", table).load()
        .select("id", "name", "event_type").collect())
with open(out, "w") as f:
    json.dump([r.asDict() for r in rows], f)
spark.stop()
"""


def _mirror_args(cdc: RunningService, table: str, root: Path, *, once: bool) -> list[str]:
    import mariadb_cdc_client.spark.mirror as mirror

    return [mirror.__file__, "--table", table, "--path", str(root / "mirror"),
            "--checkpoint", str(root / "checkpoint"), "--host", cdc.host, "-P", str(cdc.port),
            "--user", USER, "--password", PASSWORD, "--starting-position", "earliest",
            *(["--once"] if once else [])]


def _mirrored(root: Path) -> list[tuple[object, ...]]:
    import pyarrow.parquet as pq

    from mariadb_cdc_client.spark.mirror import current_snapshot

    snapshot = current_snapshot(str(root / "mirror"))
    if snapshot is None:
        return []
    return sorted(tuple(r.values()) for r in
                  pq.read_table(snapshot, columns=["id", "name", "qty"]).to_pylist())


def _errors(ran: subprocess.CompletedProcess[str]) -> str:
    """The lines of a failed application's output that say why."""
    return why_failed(ran.stdout + ran.stderr)


async def _until_mirrored(root: Path, table: Callable[[], list[tuple[object, ...]]],
                          driver: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for the running mirror (``driver``) to equal the table; failing, say why from
    the driver's log, at once if the driver has exited."""
    def mirrored() -> bool:
        if driver.poll() is not None:
            raise AssertionError(f"the mirror exited ({driver.returncode}):\n{log()}")
        return _mirrored(root) == table()

    def log() -> str:
        return why_failed((root / "driver.log").read_text(errors="replace"))

    try:
        await until(mirrored, timeout=timeout, what="the mirror to equal the table")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the mirror's log:\n{log()}") from exc


def _run(command: list[str], env: dict[str, str], cwd: Path
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


# The module's first test also carries its fixtures: the cluster's two JVMs, and the wheel and
# the packed environment built once per run (C extensions compiled; pack bounded by its own
# 900 s). On a loaded machine that setup alone took 221 s of the suite's 300 s guard against
# hangs; each step is bounded on its own, and their sum bounds the test.
@pytest.mark.timeout(900)
async def test_executors_without_the_package_read_with_the_packed_environment(
        cluster: Cluster, packed: Path, cdc: RunningService, source: Source, tmp_path: Path):
    t = f"`{source.database}`.stock"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), qty INT)",
                   f"INSERT INTO {t} VALUES (1, 'a', 10), (2, 'b', 20)",
                   f"DELETE FROM {t} WHERE id = 1")
    await cdc.caught_up(source)
    script = tmp_path / "read.py"
    script.write_text(BATCH_READ)
    out = tmp_path / "rows.json"
    args = [str(script), cdc.host, str(cdc.port), USER, PASSWORD, f"{source.database}.stock",
            str(out)]

    bare = await asyncio.to_thread(_run, cluster.submit(None, *args), cluster.env, tmp_path)
    assert bare.returncode != 0 and "mariadb_cdc_client" in bare.stdout + bare.stderr

    ran = await asyncio.to_thread(_run, cluster.submit(packed, *args), cluster.env, tmp_path)
    assert ran.returncode == 0, _errors(ran)
    rows = json.loads(out.read_text())
    assert sorted((r["id"], r["name"], r["event_type"]) for r in rows) == [
        (1, "a", "delete"), (1, "a", "insert"), (2, "b", "insert")], _errors(ran)


# Two applications one after the other (the mirror and its restart after -9), each launching
# executors on both workers, and an executor relaunched, on a machine whose other test workers
# load both cores: 86 s alone here, over 300 s in a CI run. Every wait below is bounded on its
# own; their sum (840 s), not the suite's 300 s guard against hangs, bounds the test.
@pytest.mark.timeout(900)
async def test_the_mirror_survives_an_executor_and_the_driver_killed(
        cluster: Cluster, packed: Path, cdc: RunningService, source: Source, tmp_path: Path):
    """(One of the suite's longest, about 2 minutes on 2 cores: a driver JVM started twice
    and an executor killed and replaced, each waited for as a user's job would be.)"""
    t = f"`{source.database}`.stock"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
    written = 0

    def write(count: int) -> None:
        nonlocal written
        for _ in range(count):
            written += 1
            source.execute(f"INSERT INTO {t} VALUES ({written}, 'n{written}', {written})",
                           f"UPDATE {t} SET qty = qty + 1 WHERE id = {max(1, written // 2)}")

    def table() -> list[tuple[object, ...]]:
        return sorted(source.query(f"SELECT id, name, qty FROM {t}"))

    write(50)
    await cdc.caught_up(source)
    command = cluster.submit(packed, *_mirror_args(cdc, f"{source.database}.stock", tmp_path,
                                                   once=False))
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen(command, env=cluster.env, cwd=tmp_path,
                                  start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        await _until_mirrored(tmp_path, table, driver, timeout=180)
        # the executor (its JVM, and so its Python worker) killed with -9 while it runs a
        # task of a batch: the worker starts a new executor, and Spark runs the task again
        # on it
        write(40)
        found: list[int] = []  # (kept from the check: the Python worker may end after it)

        def executor_running() -> bool:
            found[:] = [e for p in cluster.executors() if (e := cluster.executor_of(p))]
            return bool(found)

        await until(executor_running, timeout=60)
        os.kill(found[0], signal.SIGKILL)
        await cdc.caught_up(source)
        await _until_mirrored(tmp_path, table, driver, timeout=180)
        # (the batch may be mirrored before the driver logs the loss)
        await until(lambda: b"Lost executor" in (tmp_path / "driver.log").read_bytes(),
                    timeout=60, what="the driver to see its executor lost")
        # the driver killed with -9 once a batch of the new rows has begun (its offsets are
        # in the checkpoint); restarted from its checkpoint
        logged = batches_begun(tmp_path / "checkpoint")
        write(40)
        await until(lambda: batches_begun(tmp_path / "checkpoint") > logged, timeout=120)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        write(40)
        await cdc.caught_up(source)
        once = cluster.submit(packed, *_mirror_args(cdc, f"{source.database}.stock", tmp_path,
                                                    once=True))
        ran = await asyncio.to_thread(_run, once, cluster.env, tmp_path)
        assert ran.returncode == 0, _errors(ran)
        assert _mirrored(tmp_path) == table()
        assert len(table()) == written
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
