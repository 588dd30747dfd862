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
import itertools
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
from tests.spark_cluster import Cluster, batches_begun, running, why_failed

# a worker of their own, beside the spark-cluster one: the two groups of cluster tests are
# the suite's longest (8 and 7 minutes in one, it was its critical path on four workers)
pytestmark = [pytest.mark.mariadb, pytest.mark.spark,
              pytest.mark.xdist_group("delta-cluster")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark" / "merge_into_delta.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    python = delta_lake.bin_dir() / "python"
    with running(tmp_path_factory.mktemp("delta-cluster"), delta_lake.spark_home(),
                 python) as started:
        yield started


def _submit(cluster: Cluster, cdc: RunningService, table: str, root: Path, *, once: bool,
            scd: int = 1) -> list[str]:
    args = [*delta_lake.spark_args(), str(EXAMPLE), "--table", table,
            "--path", str(root / "orders.delta"), "--checkpoint", str(root / "checkpoint"),
            "--host", cdc.host, "--port", str(cdc.port), "--user", USER, "--scd", str(scd),
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


def _why(path: Path) -> str:
    return why_failed(path.read_text(errors="replace") if path.exists() else "")


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
            begun = batches_begun(tmp_path / "checkpoint")
            write(30)
            await until(lambda: batches_begun(tmp_path / "checkpoint") > begun, timeout=120)
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
    assert ran.returncode == 0, why_failed(ran.stdout + ran.stderr)

    columns = ("id", "name", "qty", "note")
    assert _delta_rows(tmp_path, list(columns)) == table(columns)
    assert len(table()) > 40
    transactions = _transactions(tmp_path)
    assert transactions, "the MERGEs carry no application transaction"
    assert len(transactions) == len(set(transactions)), "a batch was committed twice"
    assert len({app for app, _ in transactions}) == 1


@pytest.mark.timeout(900)
async def test_scd2_keeps_every_version_in_the_sources_commit_order_across_two_domains(
        cluster: Cluster, cdc: RunningService, source: Source, tmp_path: Path):
    """``--scd 2``: each row's versions, in the order the source committed them in two GTID
    domains, over two applications (two runs of batches); each version ends where the key's
    next change is, the current ones equal ``SELECT``."""
    t = f"`{source.database}`.orders"
    table = f"{source.database}.orders"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(20))")
    versions: dict[int, list[str]] = {}  # per key, the values it took, in commit order

    def commit(domain: int, *statements: str, took: dict[int, str] | None = None) -> None:
        source.execute(f"SET SESSION gtid_domain_id = {domain}", *statements)
        for key, value in (took or {}).items():
            versions.setdefault(key, []).append(value)

    commit(0, f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')", took={1: "a", 2: "b"})
    commit(2, f"UPDATE {t} SET v = 'a2' WHERE id = 1", took={1: "a2"})
    commit(2, f"INSERT INTO {t} VALUES (3, 'c')", took={3: "c"})
    commit(0, f"DELETE FROM {t} WHERE id = 2")
    commit(0, f"UPDATE {t} SET v = 'c2' WHERE id = 3", took={3: "c2"})
    await cdc.caught_up(source)

    async def run() -> None:
        command = _submit(cluster, cdc, table, tmp_path, once=True, scd=2)
        ran = await asyncio.to_thread(subprocess.run, command, env=_environment(cluster),
                                      cwd=tmp_path, capture_output=True, text=True,
                                      timeout=400, check=False)
        assert ran.returncode == 0, why_failed(ran.stdout + ran.stderr)

    await run()
    commit(2, f"UPDATE {t} SET id = 10 WHERE id = 1", took={10: "a2"})  # a key change
    commit(0, f"INSERT INTO {t} VALUES (2, 'b3')", took={2: "b3"})
    commit(2, f"UPDATE {t} SET v = 'c3' WHERE id = 3", f"UPDATE {t} SET v = 'c4' WHERE id = 3",
           took={3: "c3"})
    versions[3].append("c4")
    commit(0, f"UPDATE {t} SET v = 'b4' WHERE id = 2", took={2: "b4"})
    await cdc.caught_up(source)
    await run()

    from deltalake import DeltaTable

    rows = DeltaTable(str(tmp_path / "orders.delta")).to_pyarrow_table().to_pylist()
    found: dict[int, list[dict[str, object]]] = {}
    for row in sorted(rows, key=lambda r: r["__START_AT"]):
        found.setdefault(row["id"], []).append(row)
    assert {k: [r["v"] for r in rs] for k, rs in found.items()} == versions
    present = dict(source.query(f"SELECT id, v FROM {t}"))
    for key, its in found.items():
        for older, newer in itertools.pairwise(its):
            assert older["__START_AT"] < older["__END_AT"] <= newer["__START_AT"], (key, its)
        last = its[-1]
        assert (last["__END_AT"] is None) == (key in present), (key, its)
    current = {r["id"]: r["v"] for r in rows if r["__END_AT"] is None}
    assert current == present
    transactions = _transactions(tmp_path)
    assert len(transactions) == len(set(transactions)) >= 2
