"""Apicurio Registry 3, a real schema registry with Confluent's REST API
(``/apis/ccompat/v7``), for the Kafka sink's Avro values.

Fetched by ``tests/jvm/fetch.sh`` (component ``apicurio``: its distribution, unpacked into
the cache; nothing is downloaded while a test runs) and run from its Quarkus runner jar on a
free port of the loopback interface, with its default in-memory storage: a restart forgets
every schema. The process dies with the test process that started it (``die_with_parent``);
its output goes to ``apicurio.log`` in the directory given, named in every error.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from typing import IO

from cdcserver.core.lifetime import die_with_parent
from tests.apache_kafka import free_port
from tests.helpers import wait_until
from tests.jvm import command

MAIN = "io.quarkus.runner.GeneratedMain"  # the runner jar's (its manifest names its lib/)
CCOMPAT = "/apis/ccompat/v7"


class Apicurio:
    def __init__(self, log_dir: str, port: int | None = None) -> None:
        self.log_path = os.path.join(log_dir, "apicurio.log")
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Confluent's REST API (what ``[kafka] schema_registry_url`` names)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/subjects", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 180.0) -> None:
        """Start it and wait until its API answers (about 10 s on an idle machine; the
        JVM compiles with C1 only, as the other test JVMs do)."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the JVM. From a thread that outlives it: ``die_with_parent`` kills it when
        the thread that started it ends (so not from an executor's thread)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            command("apicurio", MAIN, heap="384m", options=(
                f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
                "-Dquarkus.log.level=WARN", "-Dquarkus.http.access-log.enabled=false")),
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until its API answers (any thread may wait)."""
        process = self._process
        assert process is not None, "launch() first"
        wait_until(lambda: process.poll() is not None or self._ready(), timeout,
                   f"Apicurio Registry to answer on port {self.port} (log: {self.log_path})")
        if process.poll() is not None:
            raise RuntimeError(f"Apicurio Registry exited with {process.returncode}; see "
                               f"{self.log_path}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
