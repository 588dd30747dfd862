"""examples/spark/merge_into_delta.py, the ``foreachBatch`` MERGE INTO a Delta Lake table, run
as a user runs it: ``spark-submit`` with Delta's jars on a Spark standalone cluster of the
Spark Delta is built for (4.2, the environment of tests/delta_lake.py). Its Delta table is
read with delta-rs (``deltalake``, which shares no code with Spark or the example) and
compared with ``SELECT``: after inserts, updates, deletes and a primary-key change, after the
driver killed with -9 once a batch had begun, and after an ``ADD COLUMN`` read by the query
started again from its checkpoint. Every batch is committed once: Delta's log holds each
(application, batch) transaction one time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import delta_lake
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, until
from tests.spark_cluster import Cluster, running

# the spark-cluster worker: one cluster at a time on the suite's two cores
pytestmark = [pytest.mark.mariadb, pytest.mark.spark,
              pytest.mark.xdist_group("spark-cluster")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark" / "merge_into_delta.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    python = delta_lake.bin_dir() / "python"
    with running(tmp_path_factory.mktemp("delta-cluster"), delta_lake.spark_home(),
                 python) as started:
        yield started


def _submit(cluster: Cluster, cdc: RunningService, table: str, root: Path, *, once: bool
            ) -> list[str]:
    args = [*delta_lake.spark_args(), str(EXAMPLE), "--table", table,
            "--path", str(root / "orders.delta"), "--checkpoint", str(root / "checkpoint"),
            "--host", cdc.host, "--port", str(cdc.port), "--user", USER,
            "--starting-position", "earliest", *(["--once"] if once else [])]
    return cluster.submit(None, *args, driver_python=delta_lake.bin_dir() / "python")


def _environment(cluster: Cluster) -> dict[str, str]:
    return {**cluster.env, "CDC_PASSWORD": PASSWORD}


def _delta_rows(root: Path, columns: list[str]) -> list[tuple[object, ...]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(root / "orders.delta")).to_pyarrow_table()
    except TableNotFoundError:
        return []
    return sorted(tuple(r.get(c) for c in columns) for r in table.to_pylist())


def _transactions(root: Path) -> list[tuple[str, int]]:
    """The (application, version) transactions of the Delta table's commits."""
    found = []
    for commit in sorted((root / "orders.delta" / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((action["txn"]["appId"], action["txn"]["version"]))
    return found


def _batches_begun(root: Path) -> int:
    offsets = root / "checkpoint" / "offsets"
    return sum(1 for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else 0


def _why(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(line for line in lines if " INFO " not in line and
                     not line.lstrip().startswith("at "))[-6000:]


@pytest.mark.timeout(900)
async def test_foreach_batch_merge_keeps_a_delta_table_equal_to_the_source_exactly_once(
        cluster: Cluster, cdc: RunningService, source: Source, tmp_path: Path):
    """(Two spark-submit applications on a cluster of their own, one killed: 2-4 minutes on
    two cores.)"""
    t = f"`{source.database}`.orders"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
    written = 0

    def write(count: int) -> None:
        nonlocal written
        for _ in range(count):
            written += 1
            source.execute(f"INSERT INTO {t} (id, name, qty) "
                           f"VALUES ({written}, 'n{written}', {written})",
                           f"UPDATE {t} SET qty = qty + 1 WHERE id = {max(1, written // 2)}")
            if written % 7 == 0:
                source.execute(f"DELETE FROM {t} WHERE id = {written - 3}")
            if written % 11 == 0:  # a primary-key change: the old key's row goes
                source.execute(f"UPDATE {t} SET id = id + 100000 WHERE id = {written - 1}")

    def table(columns: tuple[str, ...] = ("id", "name", "qty")) -> list[tuple[object, ...]]:
        return sorted(source.query(f"SELECT {', '.join(columns)} FROM {t}"))

    write(30)
    await cdc.caught_up(source)
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen(_submit(cluster, cdc, f"{source.database}.orders", tmp_path,
                                          once=False), env=_environment(cluster),
                                  cwd=tmp_path, start_new_session=True, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        def merged() -> bool:
            assert driver.poll() is None, f"the query exited ({driver.returncode}):\n{_why(log)}"
            return _delta_rows(tmp_path, ["id", "name", "qty"]) == table()

        try:
            await until(merged, timeout=240, what="the Delta table to equal the source")
            # the driver killed with -9 once a batch of new rows has begun
            begun = _batches_begun(tmp_path)
            write(30)
            await until(lambda: _batches_begun(tmp_path) > begun, timeout=120)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the driver's log:\n{_why(log)}") from exc
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()

    source.execute(f"ALTER TABLE {t} ADD COLUMN note VARCHAR(10)",
                   f"UPDATE {t} SET note = 'x' WHERE id % 2 = 0")
    write(10)
    await cdc.caught_up(source)
    ran = await asyncio.to_thread(
        subprocess.run, _submit(cluster, cdc, f"{source.database}.orders", tmp_path, once=True),
        env=_environment(cluster), cwd=tmp_path, capture_output=True, text=True, timeout=400,
        check=False)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-6000:]

    columns = ("id", "name", "qty", "note")
    assert _delta_rows(tmp_path, list(columns)) == table(columns)
    assert len(table()) > 40
    transactions = _transactions(tmp_path)
    assert transactions, "the MERGEs carry no application transaction"
    assert len(transactions) == len(set(transactions)), "a batch was committed twice"
    assert len({app for app, _ in transactions}) == 1
