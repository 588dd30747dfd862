"""A private MariaDB server set up for change data capture.

Used by ``cdcserver demo``, the test suite and the benchmarks: Debian's ``mariadb-server``
(installed with apt when missing and running as root), its own data directory, a Unix socket,
optionally a TCP port, and the binlog settings the service needs (``log_bin``,
``binlog_format=ROW``, ``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``,
``gtid_strict_mode``). Nothing here touches a system-wide MariaDB.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import pymysql

from cdcserver.core.errors import ConfigError
from cdcserver.core.lifetime import die_with_parent

CDC_SETTINGS = (
    "--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL",
    "--binlog-row-metadata=FULL", "--gtid-strict-mode=ON",
)
_SMALL_FOOTPRINT = (
    "--innodb-buffer-pool-size=128M", "--innodb-log-file-size=64M", "--max-connections=2000",
    "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
    "--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
)


def ensure_mariadb_installed(*extra: str) -> None:
    """Install Debian's mariadb-server if ``mariadbd`` is missing (root only), and the
    ``extra`` packages with it (a package name, or ``command=package`` to install it only
    where ``command`` is missing). Without root, a missing server is an error saying what to
    install, and a missing extra package is left to the caller."""
    packages = [] if shutil.which("mariadbd") or os.path.exists("/usr/sbin/mariadbd") else \
        ["mariadb-server", "mariadb-client"]
    if packages and (os.geteuid() != 0 or not shutil.which("apt-get")):
        raise ConfigError("MariaDB is not installed: run `apt-get install mariadb-server "
                          "mariadb-client` as root, then try again")
    install_missing(*packages, *extra)


def install_missing(*wanted: str) -> list[str]:
    """Install with apt, as root, the Debian packages ``wanted`` names: a package, or
    ``command=package`` for a package needed only where ``command`` is not on the PATH.
    Returns the packages still missing (all of them without root or apt)."""
    packages = [package for command, _, package in (w.rpartition("=") for w in wanted)
                if not (command and shutil.which(command))]
    if not packages or os.geteuid() != 0 or not shutil.which("apt-get"):
        return packages
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)
    return []


def kill_leftovers(datadir: str) -> list[int]:
    """Kill any ``mariadbd`` still serving ``datadir``: one left by a run that was itself
    killed (the server runs in its own session, so it outlives it). A new server on the same
    directory would otherwise wait on InnoDB's file locks. Returns the pids killed."""
    wanted = f"--datadir={os.path.abspath(datadir)}".encode()
    killed = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in args and os.path.basename(args[0]) in (b"mariadbd", b"mysqld"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    for pid in killed:
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
    return killed


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class EmbeddedMariaDB:
    """``port=None`` listens on the Unix socket only; ``port=0`` picks a free TCP port.
    ``die_with_parent``: the server is killed when the thread that started it ends (Linux's
    parent-death signal), so a process killed with -9 leaves no server behind; start it from
    a thread that lives as long as it should (the main thread), never from a worker.
    ``host``: the address it listens on; ``launcher``: a command it is started under (as
    ``ip netns exec NAME``, in a network namespace of a test's own)."""

    def __init__(self, base_dir: str, *, port: int | None = None, server_id: int = 1,
                 extra_args: Sequence[str] = (), die_with_parent: bool = False,
                 host: str = "127.0.0.1", launcher: Sequence[str] = ()) -> None:
        self.die_with_parent = die_with_parent
        self.host = host
        self.launcher = tuple(launcher)
        self.base_dir = os.path.abspath(base_dir)
        self.datadir = os.path.join(self.base_dir, "data")
        self.port = port
        self.server_id = server_id
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        # A Unix socket path must stay under ~100 bytes; test directories can be longer.
        run_dir = os.path.join(self.base_dir, "run")
        if len(run_dir) > 80:
            run_dir = tempfile.mkdtemp(prefix="cdc-mdb-")
        self.run_dir = run_dir
        self.socket = os.path.join(run_dir, "mysqld.sock")
        self.error_log = os.path.join(self.base_dir, "mysqld.err")

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> EmbeddedMariaDB:
        ensure_mariadb_installed()
        kill_leftovers(self.datadir)
        os.makedirs(self.run_dir, exist_ok=True)
        if not os.path.isdir(os.path.join(self.datadir, "mysql")):
            self._install_datadir()
        if self.port != 0:
            self._launch(self.port, timeout)
            return self
        # mariadbd cannot bind port 0 and report the port, so try free ports until one
        # stays free long enough for it to bind.
        for attempt in range(5):
            self.port = free_port()
            try:
                self._launch(self.port, timeout)
                return self
            except RuntimeError:
                if attempt == 4 or "Bind on TCP/IP port" not in self._error_tail():
                    raise
        return self

    def _launch(self, port: int | None, timeout: float) -> None:
        networking = [f"--port={port}", f"--bind-address={self.host}"] if port \
            else ["--skip-networking"]
        args = [*self.launcher, _binary("mariadbd"), "--no-defaults", f"--datadir={self.datadir}",
                f"--socket={self.socket}", f"--pid-file={os.path.join(self.run_dir, 'pid')}",
                f"--server-id={self.server_id}", "--user=root", f"--log-error={self.error_log}",
                f"--tmpdir={self._tmpdir()}",
                *networking, *CDC_SETTINGS, *_SMALL_FOOTPRINT, *self.extra_args]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent if self.die_with_parent else None)
        self._wait_ready(timeout)

    def _install_datadir(self) -> None:
        os.makedirs(self.datadir, exist_ok=True)
        result = subprocess.run(
            [_binary("mariadb-install-db"), "--no-defaults", f"--datadir={self.datadir}",
             f"--tmpdir={self._tmpdir()}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")

    def _tmpdir(self) -> str:
        """The server's own directory for temporary tables and files: servers started at
        once (the test suite's workers) do not share /tmp's names."""
        path = os.path.join(self.run_dir, "tmp")
        os.makedirs(path, exist_ok=True)
        return path

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {self.process.returncode}; see "
                                   f"{self.error_log}:\n{self._error_tail()}")
            if self._greets():
                return
            time.sleep(0.05)
        raise TimeoutError(f"mariadbd not ready after {timeout}s; see {self.error_log}")

    def _greets(self) -> bool:
        """True once the server sends its handshake (protocol version 10) on the socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(self.socket)
                packet = probe.recv(5)
            except OSError:
                return False
        return len(packet) == 5 and packet[4] == 10

    def _error_tail(self) -> str:
        try:
            with open(self.error_log, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """``kill -9``: the server dies without shutting down (crash tests)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> EmbeddedMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use -------------------------------------------------------------------------------

    def url(self, user: str = "root", password: str = "", *, tcp: bool | None = None) -> str:
        """The source URL; over TCP when the server has a port (or ``tcp=True``)."""
        auth = urllib.parse.quote(user) + (":" + urllib.parse.quote(password) if password else "")
        if self.port and tcp is not False:
            return f"mysql://{auth}@{self.host}:{self.port}"
        return f"mysql://{auth}@localhost?socket={urllib.parse.quote(self.socket)}"

    def connect(self, database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        # No TLS on the server's own Unix socket: without ssl_disabled pymysql 1.2 tries it
        # ("preferred") and builds a context per connection, loading the CA bundle (25 ms).
        kwargs.setdefault("ssl_disabled", True)
        return pymysql.connect(unix_socket=self.socket, user="root", database=database,
                               autocommit=True, charset="utf8mb4", **kwargs)

    def execute(self, *statements: str) -> None:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def query(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(sql, tuple(args) or None)
            return list(cur.fetchall())

    def create_replication_user(self, user: str, password: str) -> None:
        for host in ("localhost", "127.0.0.1"):
            self.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY "
                         f"'{password}'",
                         f"GRANT SELECT, LOCK TABLES, RELOAD, REPLICATION SLAVE, BINLOG MONITOR, "
                         f"REPLICATION MASTER ADMIN ON *.* TO '{user}'@'{host}'")


@contextlib.contextmanager
def running(base_dir: str, **kwargs: Any) -> Iterator[EmbeddedMariaDB]:
    server = EmbeddedMariaDB(base_dir, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking), for a server
    that cannot bind port 0 and say which it got, or that must restart on the same one.
    Below the kernel's ephemeral range: a port from the range (what a bind on port 0 gets)
    is also what the kernel gives any process's next outgoing connection, which may take it
    between this probe and the server's bind, or while the server restarts; one below it is
    taken only by a process that names it."""
    low, _ = _ephemeral_ports()
    first = _LOWEST_CHOSEN_PORT if low > _LOWEST_CHOSEN_PORT + 1000 else 1024
    chooser = random.Random()
    for _ in range(100 if low - first > 100 else 0):
        port = chooser.randrange(first, low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # a crowded range: the kernel's choice after all
        probe.bind(("127.0.0.1", 0))
        chosen: int = probe.getsockname()[1]
        return chosen


_LOWEST_CHOSEN_PORT = 10000  # above the well-known and the common service ports


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel gives ports from (``net.ipv4.ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
