"""The one way the listener writes to a client (``cdcserver/protocol/outbox.py``), on real
sockets on 127.0.0.1, under asyncio's own loop and under uvloop (the service's): a stored
file arrives byte for byte over plain TCP and over TLS, from any offset; a client that takes
nothing loses the transfer after the stall timeout while another client on the same loop is
served meanwhile; a client that leaves ends it; a file shorter than promised says so."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from cdcserver.protocol.outbox import FileEnded, Outbox, Traffic, TransferStalled

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def _run(loop: str, body: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(body())


def _file(tmp_path: Any, size: int) -> str:
    path = str(tmp_path / "stored.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return path


async def _serve(handler: Callable[[Outbox], Awaitable[Any]], tls: ssl.SSLContext | None = None
                 ) -> tuple[asyncio.Server, int, asyncio.Future[Any]]:
    """A listener whose one connection ``handler`` gets as an outbox; its outcome (result or
    exception) in the future."""
    outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            outcome.set_result(await handler(Outbox(writer, Traffic())))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome.set_exception(exc)
        finally:
            writer.close()

    server = await asyncio.start_server(connected, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1], outcome


async def _receive(port: int, tls: ssl.SSLContext | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                   server_hostname="localhost" if tls else None)
    data = await reader.read()
    writer.close()
    return data


def _certificate(directory: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])
def test_a_stored_file_arrives_byte_for_byte_from_any_offset(tmp_path, loop: str,
                                                              secure: bool):
    path = _file(tmp_path, 24 << 20)
    with open(path, "rb") as f:
        stored = f.read()
    server_tls = client_tls = None
    if secure:
        cert, key = _certificate(str(tmp_path))
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        client_tls = ssl.create_default_context(cafile=cert)

    async def body() -> tuple[bytes, int, int]:
        traffic = Traffic()

        async def handler(out: Outbox) -> int:
            out.traffic = traffic
            await out.send(b"header\n")  # written before: it must arrive first
            fd = os.open(path, os.O_RDONLY)
            try:
                return await out.send_file(fd, 1000, len(stored) - 1000, stall_timeout=30)
            finally:
                os.close(fd)

        server, port, outcome = await _serve(handler, server_tls)
        async with server:
            received = await _receive(port, client_tls)
            return received, await outcome, traffic.bytes_sent

    received, sent, counted = _run(loop, body)
    assert received == b"header\n" + stored[1000:]
    assert sent == len(stored) - 1000
    assert counted == len(received)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_takes_nothing_loses_the_transfer_and_others_are_served(
        tmp_path, loop: str):
    path = _file(tmp_path, 64 << 20)

    async def body() -> tuple[BaseException | None, float, bytes]:
        async def stalling(out: Outbox) -> int:
            fd = os.open(path, os.O_RDONLY)
            try:
                return await out.send_file(fd, 0, 64 << 20, stall_timeout=1.0)
            finally:
                os.close(fd)

        server, port, outcome = await _serve(stalling)
        sleeper = socket.create_connection(("127.0.0.1", port))  # connects, never reads
        sleeper.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        started = time.monotonic()
        other, other_port, _ = await _serve(lambda out: out.send(b"x" * 100_000))
        async with server, other:
            meanwhile = await _receive(other_port)  # the loop serves others during the wait
            try:
                await asyncio.wait_for(outcome, 30)
                error = None
            except TransferStalled as exc:
                error = exc
            took = time.monotonic() - started
        sleeper.close()
        return error, took, meanwhile

    error, took, meanwhile = _run(loop, body)
    assert isinstance(error, TransferStalled), error
    assert took >= 1.0  # (cut by stall_timeout: the outer 30 s wait would not raise this)
    assert meanwhile == b"x" * 100_000


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_leaves_ends_the_transfer(tmp_path, loop: str):
    path = _file(tmp_path, 64 << 20)

    async def body() -> BaseException | None:
        async def handler(out: Outbox) -> int:
            fd = os.open(path, os.O_RDONLY)
            try:
                return await out.send_file(fd, 0, 64 << 20, stall_timeout=30)
            finally:
                os.close(fd)

        server, port, outcome = await _serve(handler)
        async with server:
            leaving = socket.create_connection(("127.0.0.1", port))
            await asyncio.sleep(0.5)  # the transfer fills the socket meanwhile
            leaving.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00"
                               b"\x00\x00\x00")  # close with a reset
            leaving.close()
            try:
                await asyncio.wait_for(outcome, 30)
            except ConnectionError as exc:
                return exc
        return None

    assert isinstance(_run(loop, body), ConnectionError)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_file_shorter_than_promised_says_so(tmp_path, loop: str):
    path = _file(tmp_path, 1000)

    async def body() -> tuple[BaseException | None, bytes]:
        async def handler(out: Outbox) -> int:
            fd = os.open(path, os.O_RDONLY)
            try:
                return await out.send_file(fd, 0, 5000, stall_timeout=30)
            finally:
                os.close(fd)

        server, port, outcome = await _serve(handler)
        async with server:
            received = await _receive(port)
            try:
                await outcome
            except FileEnded as exc:
                return exc, received
        return None, received

    error, received = _run(loop, body)
    assert isinstance(error, FileEnded) and "after 1000 of 5000 bytes" in str(error)
    assert len(received) == 1000


async def _read_slowly(port: int) -> bytes:
    """Everything the server sends, through a small receive buffer read a little at a time:
    the server's socket is full most of the transfer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)  # before connecting
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    received = bytearray()
    with sock:
        while data := await loop.sock_recv(sock, 32 << 10):
            received += data
            await asyncio.sleep(0.001)
    return bytes(received)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_transfer_to_a_full_socket_takes_no_descriptor_of_its_own(tmp_path, loop: str,
                                                                    monkeypatch):
    # Thousands of streams send at once: a descriptor per transfer (a duplicate of the
    # socket to wait on) would count against the process's limit like a connection.
    path = _file(tmp_path, 4 << 20)
    with open(path, "rb") as f:
        stored = f.read()
    spills = []
    spill = Outbox._spill

    async def counted(self: Outbox, fd: int, offset: int, count: int,
                      stall_timeout: float | None) -> int:
        spills.append(count)
        return await spill(self, fd, offset, count, stall_timeout)

    monkeypatch.setattr(Outbox, "_spill", counted)

    async def body() -> tuple[bytes, int]:
        most = 0

        async def handler(out: Outbox) -> int:
            nonlocal most
            fd = os.open(path, os.O_RDONLY)
            before = len(os.listdir("/proc/self/fd"))
            transfer = asyncio.create_task(out.send_file(fd, 0, len(stored), stall_timeout=30))
            try:
                while not transfer.done():  # looks whenever the transfer waits
                    most = max(most, len(os.listdir("/proc/self/fd")) - before)
                    await asyncio.sleep(0.001)
                return await transfer
            finally:
                os.close(fd)

        server, port, outcome = await _serve(handler)
        async with server:
            received = await _read_slowly(port)
            assert await outcome == len(stored)
        return received, most

    received, most = _run(loop, body)
    assert received == stored
    assert spills, "the socket was never full: the test proves nothing"
    assert most <= 0, f"{most} more descriptors during the transfer"
