"""Kafka Connect, standalone, for the tests that run Debezium's own code on this service's
messages (tests/integration/test_debezium_jdbc_sink.py), and for Debezium's own source
connector beside the service (bench/bench_peers.py, tests/debezium_source.py).

One worker process (``org.apache.kafka.connect.cli.ConnectStandalone``) with everything on
its classpath (a component of tests/jvm: ``debezium-jdbc`` by default, connect-runtime,
Debezium's JDBC sink and transforms, Apicurio Registry 2.6's AvroConverter, the MariaDB
driver; ``debezium-mariadb``, Debezium's binlog source connector), plugins found by
their ServiceLoader manifests (``plugin.discovery=service_load``: no scan of the jars), its
offsets in a file in the test's directory, its REST API on a free port of 127.0.0.1, its
output in ``connect.log`` (named in every error). It dies with the thread that started it
(``die_with_parent``), so a test process killed with -9 leaves no worker behind.
``worker`` settings go over the defaults: a source connector's producer is the worker's
(``producer.*``, :func:`producer_settings`).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from cdcserver.core.lifetime import die_with_parent
from tests import jvm
from tests.apache_kafka import free_port

_STANDALONE = "org.apache.kafka.connect.cli.ConnectStandalone"
# slf4j-simple: INFO with times; neither the classpath scanner's complaints about jars
# nor a line per REST request
_LOGGING = ("-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.log.org.reflections=error",
            "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.connect.runtime.rest=warn")


def _properties(values: Mapping[str, object]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


class ConnectFailed(AssertionError):
    pass


def producer_settings(acks: str, compression: str, batch_bytes: int, linger_ms: int
                      ) -> dict[str, object]:
    """The worker settings giving its source connectors' producer these (Connect's own
    defaults otherwise: acks all, max.in.flight.requests.per.connection 1, batch.size
    16384, Kafka 4 clients' linger.ms 5, no compression)."""
    return {"producer.acks": acks, "producer.compression.type": compression,
            "producer.batch.size": batch_bytes, "producer.linger.ms": linger_ms}


class KafkaConnect:
    def __init__(self, directory: str | os.PathLike[str], bootstrap: str, *,
                 component: str = "debezium-jdbc", heap: str = "384m",
                 tuning: tuple[str, ...] = jvm.JVM_OPTIONS,
                 worker: Mapping[str, object] | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.bootstrap = bootstrap
        self.component, self.heap, self.tuning = component, heap, tuning
        self.worker = dict(worker or {})
        self.port = free_port()
        self.log_path = self.directory / "connect.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def _worker_properties(self) -> dict[str, object]:
        return {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": self.directory / "offsets",
            "offset.flush.interval.ms": 1000,
            "listeners": f"http://127.0.0.1:{self.port}",
            "plugin.discovery": "service_load",
            # the sink's consumers: from the topics' start, and fetches answered at once
            "consumer.auto.offset.reset": "earliest",
            "consumer.fetch.max.wait.ms": 100,
            "consumer.metadata.max.age.ms": 2000,
            **self.worker,
        }

    def start(self, connectors: Mapping[str, Mapping[str, object]]) -> None:
        """The worker with these connectors (name -> its configuration)."""
        worker = self.directory / "worker.properties"
        worker.write_text(_properties(self._worker_properties()))
        files = []
        for name, config in connectors.items():
            path = self.directory / f"{name}.properties"
            path.write_text(_properties({"name": name, **config}))
            files.append(str(path))
        command = jvm.command(self.component, _STANDALONE, str(worker), *files,
                              heap=self.heap, options=_LOGGING, tuning=self.tuning)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.directory,
                                         preexec_fn=die_with_parent)

    @property
    def pid(self) -> int:
        """The worker's process id (it runs every connector's tasks)."""
        if self._process is None:
            raise ConnectFailed("Kafka Connect is not running")
        return self._process.pid

    def _get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def _alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise ConnectFailed(f"Kafka Connect exited ({self._process.returncode}); see "
                                f"{self.log_path}:\n{self.log_tail()}")

    def status(self, name: str) -> dict[str, Any] | None:
        """The connector's status from the REST API; None while the worker is not serving."""
        self._alive()
        try:
            status: dict[str, Any] = self._get(f"/connectors/{name}/status")
            return status
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def check_running(self, name: str) -> bool:
        """Whether the connector and its tasks run; raises when one of them failed."""
        status = self.status(name)
        if status is None:
            return False
        states = [status["connector"]["state"], *(t["state"] for t in status["tasks"])]
        if "FAILED" in states:
            traces = [t.get("trace", "") for t in status["tasks"] if t["state"] == "FAILED"]
            raise ConnectFailed(f"connector {name} failed (log: {self.log_path}):\n"
                                + "\n".join(traces or [status["connector"].get("trace", "")]))
        return bool(status["tasks"]) and all(s == "RUNNING" for s in states)

    def wait_running(self, names: list[str], timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        pause = threading.Event()  # never set: the polling interval
        while not all(self.check_running(n) for n in names):
            if time.monotonic() > deadline:
                raise ConnectFailed(f"connectors {names} not running after {timeout:.0f} s "
                                    f"(log: {self.log_path}):\n{self.log_tail()}")
            pause.wait(0.2)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
