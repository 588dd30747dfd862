"""A raw protocol client for wire-level tests, and small helpers."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import fastavro
import pytest

from cdcserver.store.avrofile import compress
from mariadb_cdc_client.format.avro import (
    SYNC_SIZE,
    block_at,
    container_header,
    parse_header,
    write_varint,
)
from mariadb_cdc_client.format.wire import auth_message
from mariadb_cdc_client.ranges import Blocks

T = TypeVar("T")

USER, PASSWORD = "cdcuser", "cdcpass"

# For the JVMs the tests start (Spark's drivers, executors, master and workers): compiled
# by C1 alone and collected by one thread, a JVM that lives seconds to minutes costs a
# fraction of the CPU the optimising compiler and the parallel collector spend warming up,
# on two cores the other test workers share. Spark's behaviour is the same.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"


class RawClient:
    """Bytes in, bytes out, with a timeout on every read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> RawClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        """A ``ConnectionError`` once the connection is closed, by either end: uvloop's
        transport raises ``RuntimeError`` for a write after our own close (``closed()``
        running beside, say), where asyncio's ignores it."""
        if self.writer.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self.writer.write(data)
        await self.writer.drain()

    async def line(self, timeout: float = 10.0) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), timeout)

    async def json_line(self, timeout: float = 10.0) -> dict[str, Any]:
        line = await self.line(timeout)
        assert line, "the server closed the connection"
        data: dict[str, Any] = json.loads(line)
        return data

    async def read_exactly(self, n: int, timeout: float = 10.0) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(n), timeout)

    async def closed(self, timeout: float = 10.0) -> bytes:
        """Everything until the server closes the connection (then closes our end too)."""
        data = await asyncio.wait_for(self.reader.read(), timeout)
        await self.close()
        return data

    async def login(self, fmt: str = "JSON", user: str = USER, password: str = PASSWORD,
                    dialect: str | None = None, timeout: float = 10.0) -> None:
        """Authenticate and register the way MaxScale's cdc.py does: one write each, no newline
        (``dialect``: ask for a JSON dialect, an extension; None: the server's default;
        ``timeout``: for each answer)."""
        await self.send(auth_message(user, password))
        answer = await self.line(timeout)
        assert answer == b"OK\n", f"the login was answered {answer!r}"
        extension = f", DIALECT={dialect}" if dialect else ""
        await self.send(f"REGISTER UUID=test-client, TYPE={fmt}{extension}".encode())
        answer = await self.line(timeout)
        assert answer == b"OK\n", f"REGISTER was answered {answer!r}"

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def lines_until(port: int, request: str, until: object, dialect: str | None = "EXACT",
                      timeout: float = 60.0) -> list[bytes]:
    """The lines of ``request`` (a REQUEST-DATA) bounded by ``UNTIL until`` (a GTID state
    the test's source has logged: the service waits until it has stored it), without the
    end line, which must come: a read that ends when the server is quiet for a moment takes
    a loaded machine's pause for the end."""
    client = await RawClient.connect(port)
    try:
        await client.login(dialect=dialect)
        await client.send(f"{request} UNTIL {until}\n".encode())
        lines = []
        while not (line := await client.line(timeout=timeout)).startswith(b'{"end"'):
            assert line and not line.startswith(b"ERR"), line
            lines.append(line)
        return lines
    finally:
        await client.close()


async def reply_to(port: int, command: str) -> bytes:
    """The first line a logged-in client (exact dialect) gets for ``command``."""
    client = await RawClient.connect(port)
    try:
        await client.login(dialect="EXACT")
        await client.send(command.encode() + b"\n")
        return await client.line()
    finally:
        await client.close()


def write_secret(path: os.PathLike[str] | str, text: str) -> str:
    """A file only its owner may read (a salt, a token), as the service requires."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return str(path)


def files_holding(directory: str, needle: bytes) -> list[str]:
    """The files under ``directory`` whose bytes hold ``needle``."""
    found = []
    for dirpath, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                if needle in f.read():
                    found.append(path)
    return found


def records_only(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "namespace" not in line]


ZERO_DATE_ROWS = ("(1, '0000-00-00', '2024-00-10 10:00:00'), "
                  "(2, '2024-01-02', '2024-01-02 03:04:05')")


def zero_dates_table(source: Any, name: str) -> str:
    """``source``'s table ``name`` (id, d DATE, dtm DATETIME), its first row holding MariaDB's
    zero and partial dates (written under an empty sql_mode), its second real ones; the
    quoted name."""
    table = f"`{source.database}`.{name}"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, d DATE, dtm DATETIME)",
                   "SET SESSION sql_mode = ''", f"INSERT INTO {table} VALUES {ZERO_DATE_ROWS}")
    return table


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``condition`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or condition}")
        pause.wait(0.02)


def joined(thread: threading.Thread, timeout: float = 120.0) -> None:
    """Wait for ``thread`` to end, failing if it has not after ``timeout`` seconds. A
    writer told to stop whose ``join(30)`` gave up on a loaded machine would commit after
    the test's last row, and the table would hold a change the stream, read up to that
    row, cannot have: one way to get what test_dump's concurrent-writes test once found
    beside two soaks (one update missing; not reproduced since in 380 runs under load)."""
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"{thread.name} did not stop within {timeout:g} s")


def kill_when(process: subprocess.Popen[Any], record: str, reached: Callable[[str], bool],
              timeout: float = 60.0) -> None:
    """SIGKILL ``process`` once the text of its progress file ``record`` says ``reached``,
    looking only while the process is stopped (SIGSTOP), so it cannot finish between the
    look and the kill. Fails if it finishes first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        process.send_signal(signal.SIGSTOP)
        try:
            with open(record) as f:
                if reached(f.read()):
                    process.send_signal(signal.SIGKILL)
                    return
        except (FileNotFoundError, ValueError):
            pass
        assert process.poll() is None, "the process finished before it could be killed"
        assert time.monotonic() < deadline, f"{record} never reached the point to kill at"
        process.send_signal(signal.SIGCONT)
        threading.Event().wait(0.002)


async def eventually(check: Callable[[], Awaitable[T]], done: Callable[[T], bool],
                     timeout: float = 30.0, what: str = "") -> T:
    """Call ``check`` until ``done`` holds for what it returns (which is returned),
    failing after ``timeout`` seconds: an async ``wait_until`` for conditions that are read
    over a connection."""
    deadline = time.monotonic() + timeout
    while not done(found := await check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or done}: last {found!r}")
        await pace(0.02)
    return found


async def until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll a condition on this process's own state (a writer's count, the service's
    attributes) on the event loop until it holds, failing after ``timeout`` seconds."""
    async def holds() -> bool:
        return condition()

    await eventually(holds, bool, timeout, what)


async def pace(seconds: float) -> None:
    """Wait on the event loop's clock, to act like a slow client (not to synchronise)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_later(seconds, done.set_result, None)
    await done


class TcpProxy:
    """A TCP relay on 127.0.0.1 port 0 whose connections can be cut (reset) and refused,
    to stand for a network that drops: the real MariaDB sits behind it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.refuse = False
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)
        for w in (writer, up_writer):
            self._open.discard(w)
            w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.transport.abort()


@contextlib.contextmanager
def small_tmpfs(mount_point: str, size: str) -> Iterator[str]:
    """A real file system of ``size`` (``1m``, ``64m``) mounted at ``mount_point``, to fill up.
    Mounting needs root, which the suite's machines give; elsewhere the test is skipped and
    says so."""
    os.makedirs(mount_point, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             mount_point], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], check=False)


def fill(path: str) -> None:
    """Take every free byte of a file system (a ballast file at ``path``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


def stored_blocks(schema: Any, records: list[dict[str, Any]], codec: str = "null",
                  sync_interval: int = 4000) -> tuple[Any, Blocks]:
    """``records`` written by fastavro under ``schema`` (parsed) in blocks of about
    ``sync_interval`` bytes, framed and compressed the way the store writes ``codec``: the
    version's container header, and its blocks as a bounded read hands them over."""
    out = io.BytesIO()
    fastavro.writer(out, schema, records, sync_interval=sync_interval)
    data = out.getvalue()
    written = parse_header(data)
    body, pos = bytearray(), written.size
    while (block := block_at(data, pos, written.sync)) is not None:
        count, start, pos = block
        packed = compress(codec, data[start:pos - SYNC_SIZE])
        body += write_varint(count) + write_varint(len(packed)) + packed + written.sync
    header = parse_header(container_header(written.schema_json, codec, written.sync))
    return header, Blocks(bytes(body), len(records))


def memory_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A process's resident memory now (``VmRSS``) or at its peak so far (``VmHWM``), in MiB;
    0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def read_descriptors_of(path: str, pid: int | str = "self") -> list[int]:
    """The read-only descriptors a process (this one by default) holds of ``path``'s file,
    even deleted (a writer's descriptors are not counted)."""
    target = os.path.realpath(path)
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(f"/proc/{pid}/fd/{name}") not in (target, f"{target} (deleted)"):
                continue
            with open(f"/proc/{pid}/fdinfo/{name}") as info:
                flags = next(int(line.split()[1], 8) for line in info
                             if line.startswith("flags:"))
            if flags & os.O_ACCMODE == os.O_RDONLY:
                found.append(int(name))
    return found


def self_signed_certificate(directory: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files in ``directory``)."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def binary_decimal(fmt: Any, unscaled: int) -> bytes:
    """MariaDB's binary DECIMAL (strings/decimal.cc, decimal2bin) of ``unscaled * 10 **
    -scale`` in the layout ``fmt`` (a ``replication.values.DecimalFormat``): what the binlog
    holds, written here from the format's definition, not from the decoder."""
    rest, parts = abs(unscaled), []
    for nbytes, digits in reversed(fmt.groups):
        parts.append((rest % 10 ** digits).to_bytes(nbytes, "big"))
        rest //= 10 ** digits
    raw = bytearray(b"".join(reversed(parts)))
    if unscaled < 0:
        raw = bytearray(b ^ 0xFF for b in raw)
    raw[0] ^= 0x80
    return bytes(raw)
