"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and one worker (one core,
1 GiB), started from a PySpark install as ``spark-class org.apache.spark.deploy.master.Master``
/ ``...worker.Worker``; applications are ``spark-submit`` processes of their own, as a user
runs them (tests/integration/test_spark_cluster.py, test_spark_delta_merge.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cdcserver.app.embedded import free_port
from tests.helpers import JVM_OPTIONS, wait_until

SPARK_HOME = Path(__import__("pyspark").__file__).parent


class Cluster:
    """A master and one worker of the Spark at ``spark_home`` (this environment's PySpark by
    default), whose Python workers run ``python`` (default: a bare virtualenv, which cannot
    import this package)."""

    def __init__(self, root: Path, spark_home: Path = SPARK_HOME,
                 python: Path | None = None, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cores, self.memory = cores, memory
        self.spark_home = spark_home
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        if python is None:
            bare = root / "bare"  # the workers' own Python: cannot import this package
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)],
                           check=True)
            python = bare / "bin/python"
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "JAVA_HOME":
                    os.environ.get("JAVA_HOME", ""), "SPARK_HOME": str(spark_home),
                    "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(python),
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
                    "127.0.0.1", "--webui-port", str(free_port()), "--cores", str(self.cores),
                    "--memory", self.memory, self.url)
        wait_until(lambda: self._registered() >= 1, timeout=90,
                   what="the worker registered with the master")

    def _spawn(self, name: str, main: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (closed by the process)
        self.processes.append(subprocess.Popen(
            [str(self.spark_home / "bin" / "spark-class"), main, *args], stdout=log,
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

    def submit(self, packed: Path | None, *args: str, driver_python: Path | None = None
               ) -> list[str]:
        """The spark-submit command line of an application on this cluster (its driver runs
        ``driver_python``, by default this process's)."""
        command = [str(self.spark_home / "bin" / "spark-submit"), "--master", self.url,
                   "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
                   "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS}",
                   "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
                   "--conf", "spark.task.maxFailures=4",
                   "--conf", "spark.python.worker.reuse=false",
                   "--conf", f"spark.pyspark.driver.python={driver_python or sys.executable}"]
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


@contextlib.contextmanager
def running(root: Path, spark_home: Path = SPARK_HOME, python: Path | None = None,
            cores: int = 1, memory: str = "1g") -> Iterator[Cluster]:
    cluster = Cluster(root, spark_home, python, cores, memory)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def batches_begun(checkpoint: Path) -> int:
    """The micro-batches whose offsets a streaming query has written to its checkpoint."""
    offsets = checkpoint / "offsets"
    return sum(1 for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else 0


def why_failed(output: str) -> str:
    """The lines of an application's output that say why it failed (no INFO, no stack
    frames)."""
    return "\n".join(line for line in output.splitlines() if " INFO " not in line and
                     not line.lstrip().startswith("at "))[-6000:]
