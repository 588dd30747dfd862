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
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdcserver.app.embedded import free_port
from tests import artifacts
from tests.conftest import RunningService, Source
from tests.helpers import JVM_OPTIONS, PASSWORD, USER, until, wait_until

# one worker for the module: its tests share the cluster (eight JVMs or more per test)
pytestmark = [pytest.mark.mariadb, pytest.mark.spark,
              pytest.mark.xdist_group("spark-cluster")]

SPARK_HOME = Path(__import__("pyspark").__file__).parent


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' environment, as docs/spark.md says to build it (once per run)."""
    return artifacts.packed_environment(tmp_path_factory)


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        bare = root / "bare"  # the workers' own Python: cannot import this package
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "JAVA_HOME":
                    os.environ.get("JAVA_HOME", ""), "SPARK_HOME": str(SPARK_HOME),
                    "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(bare / "bin/python"),
                    "SPARK_WORKER_DIR": str(root / "work"), "SPARK_LOG_DIR": str(root / "logs"),
                    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                    "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(free_port()))
        # One worker, so one executor per application: every JVM of the cluster costs the
        # two cores the other test workers share, and what is tested (executors that cannot
        # import the package, one lost mid-batch and replaced) needs no second one.
        self._spawn("worker", "org.apache.spark.deploy.worker.Worker", "--host",
                    "127.0.0.1", "--webui-port", str(free_port()), "--cores", "1",
                    "--memory", "1g", self.url)
        wait_until(lambda: self._registered() >= 1, timeout=90,
                   what="the worker registered with the master")

    def _spawn(self, name: str, main: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (closed by the process)
        self.processes.append(subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), main, *args], stdout=log,
            stderr=subprocess.STDOUT, env=self.env, start_new_session=True))
        log.close()

    def _registered(self) -> int:
        text = (self.root / "master.log").read_text(errors="replace") \
            if (self.root / "master.log").exists() else ""
        return text.count("Registering worker")

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def submit(self, packed: Path | None, *args: str) -> list[str]:
        """The spark-submit command line of an application on this cluster."""
        command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url,
                   "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
                   "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS}",
                   "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
                   "--conf", "spark.task.maxFailures=4",
                   "--conf", "spark.python.worker.reuse=false",
                   "--conf", f"spark.pyspark.driver.python={sys.executable}"]
        if packed is not None:
            command += ["--archives", f"{packed}#environment",
                        "--conf", "spark.pyspark.python=./environment/bin/python"]
        return command + list(args)

    def executor_of(self, pid: int) -> int | None:
        """The executor (its JVM, CoarseGrainedExecutorBackend) a Python worker runs under."""
        while pid > 1:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return None
            if b"CoarseGrainedExecutorBackend" in cmdline:
                return pid
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent
        return None

    def executors(self) -> list[int]:
        """The pids of the executors' Python workers now running (with
        spark.python.worker.reuse=false, only while a task runs)."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(self.root / "work")) and any(
                    b"pyspark.daemon" in a or b"pyspark.worker" in a for a in cmdline):
                found.append(int(pid))
        return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


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


def _batches_begun(root: Path) -> int:
    """The micro-batches whose offsets the query has written to its checkpoint."""
    offsets = root / "checkpoint" / "offsets"
    return sum(1 for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else 0


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
    return _why(ran.stdout + ran.stderr)


def _why(output: str) -> str:
    lines = output.splitlines()
    return "\n".join(line for line in lines if " INFO " not in line and
                     not line.lstrip().startswith("at "))[-6000:]


async def _until_mirrored(root: Path, table: Callable[[], list[tuple[object, ...]]],
                          driver: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for the running mirror (``driver``) to equal the table; failing, say why from
    the driver's log, at once if the driver has exited."""
    def mirrored() -> bool:
        if driver.poll() is not None:
            raise AssertionError(f"the mirror exited ({driver.returncode}):\n{log()}")
        return _mirrored(root) == table()

    def log() -> str:
        return _why((root / "driver.log").read_text(errors="replace"))

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
        await until(lambda: any(cluster.executor_of(p) for p in cluster.executors()),
                    timeout=60)
        executor = next(e for p in cluster.executors() if (e := cluster.executor_of(p)))
        os.kill(executor, signal.SIGKILL)
        await cdc.caught_up(source)
        await _until_mirrored(tmp_path, table, driver, timeout=180)
        assert b"Lost executor" in (tmp_path / "driver.log").read_bytes()
        # the driver killed with -9 once a batch of the new rows has begun (its offsets are
        # in the checkpoint); restarted from its checkpoint
        logged = _batches_begun(tmp_path)
        write(40)
        await until(lambda: _batches_begun(tmp_path) > logged, timeout=120)
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
