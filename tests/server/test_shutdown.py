"""SIGTERM in every phase of the service (``cdcserver run`` as its own process): it exits 0
within the grace period, the checkpoint it wrote covers its files exactly (the next start
repairs nothing), and the tables verify against the source afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from cdcserver.app.embedded import free_port
from cdcserver.core.gtid import GtidState
from cdcserver.ops.status import fetch_health
from cdcserver.store.checkpoint import covered_state
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.wire import auth_message
from tests.conftest import Source
from tests.helpers import PASSWORD, USER, wait_until
from tests.server.test_crash import TABLES, Load, _assert_exact, _verify_all

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

EXIT_WITHIN = 30.0


class Service:
    """``cdcserver run`` with known ports, its log in a file."""

    def __init__(self, tmp_path, source_url: str, users: str, *extra: str) -> None:
        self.data_dir = str(tmp_path / "data")
        self.log = str(tmp_path / "service.log")
        self.port, self.metrics = free_port(), free_port()
        exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
        self.args = [exe, "run", "--source", source_url, "--data-dir", self.data_dir,
                     "--listen", f"127.0.0.1:{self.port}", "--metrics-listen",
                     f"127.0.0.1:{self.metrics}", "--users-file", users, "--server-id", "6101",
                     "--flush-interval", "0.05", "--start-gtid", "oldest", "--log-level",
                     "info", *extra]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log)
        wait_until(self._answers, what="the monitoring endpoint")

    def _answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log_text()
        return self.health()["status"] != "unreachable"

    def health(self) -> dict:
        return fetch_health(f"http://127.0.0.1:{self.metrics}")[1]

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics",
                                    timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError(name)

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(EXIT_WITHIN)

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()


def _complete_dumps(data_dir: str) -> int:
    return sum(1 for name in os.listdir(os.path.join(data_dir, "dump"))
               if name.endswith(".dump"))


def _checkpoint_state(data_dir: str) -> GtidState:
    return covered_state(DataDir(data_dir).checkpoint)


def _covers(data_dir: str, source: Source) -> bool:
    checkpoint = _checkpoint_state(data_dir)
    return all(checkpoint.covers(g) for g in source.gtid_state())


def _restart_repairs_nothing(service: Service, source: Source, dumps_completed: int = 0
                             ) -> None:
    """After a clean stop, a new start finds the files exactly as the checkpoint says (and
    finishes the interrupted dumps, when asked to wait for them)."""
    before = service.log_text()
    service.start()
    wait_until(lambda: service.health()["replication"]["connected"], what="replication")
    wait_until(lambda: _covers(service.data_dir, source), timeout=120,
               what="the checkpoint to cover the source")
    if dumps_completed:
        wait_until(lambda: _complete_dumps(service.data_dir) >= dumps_completed, timeout=120,
                   what="the interrupted dumps to finish")
    assert service.terminate() == 0
    new_lines = service.log_text()[len(before):]
    assert "recovery:" not in new_lines, new_lines


def test_sigterm_while_waiting_for_an_unreachable_source(tmp_path, users_file: str):
    service = Service(tmp_path, "mysql://cdc@127.0.0.1:1", users_file)
    service.start()
    assert service.health()["status"] == "degraded"
    assert service.terminate() == 0


def test_sigterm_while_catching_up_under_load(tmp_path, source: Source, users_file: str):
    load = Load(source, seed=11, big=2000)
    load.create()
    load.start()
    try:
        wait_until(lambda: load.transactions > 300, what="some load")
        service = Service(tmp_path, source.url, users_file)
        service.start()
        wait_until(lambda: service.metric("cdc_transactions_total") > 50, what="catching up")
        assert service.terminate() == 0
    finally:
        load.finish()
    _restart_repairs_nothing(service, source)
    _assert_exact(_verify_all(source, service.data_dir))


def test_sigterm_while_streaming_to_clients_and_sending_a_dump(tmp_path, source: Source,
                                                              users_file: str):
    load = Load(source, seed=12, big=3000, pause=0.0)
    load.create()
    load.start()
    wait_until(lambda: load.transactions > 400, what="a table worth streaming")
    load.finish()
    dump = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "cdcserver"), "dump",
         f"{source.database}.orders", "--source", source.url, "--data-dir",
         str(tmp_path / "data")], capture_output=True, check=True)
    assert dump.returncode == 0
    service = Service(tmp_path, source.url, users_file)
    service.start()
    wait_until(lambda: _covers(service.data_dir, source), timeout=120, what="caught up")
    streaming = _reader(service.port, f"REQUEST-DATA {source.database}.orders")
    sending = _reader(service.port, f"REQUEST-DUMP {source.database}.orders")
    wait_until(lambda: service.metric("cdc_clients_connected") == 2, what="two clients")
    assert service.terminate() == 0
    for sock in (streaming, sending):
        sock.close()
    _restart_repairs_nothing(service, source)
    _assert_exact(_verify_all(source, service.data_dir))


def test_sigterm_while_taking_a_scheduled_dump(tmp_path, source: Source, users_file: str):
    load = Load(source, seed=13, big=5000, pause=0.0)
    load.create()
    load.start()
    wait_until(lambda: load.transactions > 400, what="a table worth dumping")
    load.finish()
    service = Service(tmp_path, source.url, users_file, "--config",
                      _dump_config(tmp_path, source))
    service.start()
    dumps = os.path.join(service.data_dir, "dump")
    unfinished = (".partial", ".chunked", ".spool")  # a single-read or a chunked dump's

    def writing() -> bool:
        return os.path.isdir(dumps) and \
            any(name.endswith(unfinished) for name in os.listdir(dumps))

    # (cdc_dump_running says the pass began: it may still be at the source's row estimate,
    # before any file, and a SIGTERM then leaves nothing to resume)
    wait_until(writing, what="the dump to be writing")
    assert service.terminate() == 0
    assert writing()  # stopped mid-way
    _restart_repairs_nothing(service, source, dumps_completed=len(TABLES))
    assert not any(name.endswith(unfinished) for name in os.listdir(dumps))  # resumed
    _assert_exact(_verify_all(source, service.data_dir))


def _dump_config(tmp_path, source: Source) -> str:
    path = tmp_path / "dump.toml"
    tables = ", ".join(f"{source.database}.{t}" for t in TABLES)
    path.write_text(f'[dump]\ntables = "{tables}"\ninterval = "1h"\nchunk_rows = 200\n')
    return str(path)


def _reader(port: int, command: str) -> socket.socket:
    """A client that sends a request and reads slowly (a small receive buffer, no reads)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(auth_message(USER, PASSWORD) + b"\nREGISTER UUID=t, TYPE=JSON\n"
                 + command.encode() + b"\n")
    return sock
