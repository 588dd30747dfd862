"""A raw protocol client for wire-level tests, and small helpers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from client.wire import auth_message

USER, PASSWORD = "cdcuser", "cdcpass"


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

    async def login(self, fmt: str = "JSON", user: str = USER, password: str = PASSWORD) -> None:
        """Authenticate and register the way MaxScale's cdc.py does: one write each, no newline."""
        await self.send(auth_message(user, password))
        assert await self.line() == b"OK\n"
        await self.send(f"REGISTER UUID=test-client, TYPE={fmt}".encode())
        assert await self.line() == b"OK\n"

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def records_only(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "namespace" not in line]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``condition`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or condition}")
        pause.wait(0.02)


async def pace(seconds: float) -> None:
    """Wait on the event loop's clock, to act like a slow client (not to synchronise)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_later(seconds, done.set_result, None)
    await done
