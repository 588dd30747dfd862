"""The asyncio client.

    async with CdcClient("127.0.0.1", 4001, "cdcuser", "cdcpass") as cdc:
        async for event in cdc.stream("shop.orders"):
            ...   # SchemaChange or ChangeRecord

Commands go out one per write with no newline, as MaxScale's own clients send them, so the
client also works against MaxScale. ``stream()`` survives dropped connections: it reconnects
with backoff and continues right after the last record it delivered.
"""

from __future__ import annotations

import asyncio
import logging
import uuid as uuidlib
from collections.abc import AsyncIterator
from typing import Any

from client.stream import AvroStreamDecoder, Event, JsonStreamDecoder, Resume
from client.wire import Code, DataRequest, Format, ProtocolError, auth_message, parse_reply

log = logging.getLogger(__name__)

RETRIABLE = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError)


class CdcConnection:
    """One authenticated and registered connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 fmt: Format) -> None:
        self.reader = reader
        self.writer = writer
        self.format = fmt

    @classmethod
    async def open(cls, host: str, port: int, user: str, password: str, *,
                   format: str | Format = Format.JSON, uuid: str | None = None,
                   ssl: Any = None, timeout: float = 10.0) -> CdcConnection:
        fmt = Format(format)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ssl, limit=1 << 24), timeout)
        conn = cls(reader, writer, fmt)
        try:
            await conn.command(auth_message(user, password), timeout)
            await conn.command(
                f"REGISTER UUID={uuid or uuidlib.uuid4()}, TYPE={fmt.value}".encode(), timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def command(self, line: bytes, timeout: float = 10.0) -> str:
        """Send one command and return the text after ``OK``; raise ProtocolError on ERR."""
        self.writer.write(line)
        await self.writer.drain()
        reply = await asyncio.wait_for(self.reader.readline(), timeout)
        if not reply:
            raise ConnectionError("the server closed the connection")
        ok, code, message = parse_reply(reply)
        if not ok:
            raise ProtocolError(code or Code.INTERNAL, message)
        return message

    async def query(self, line: str, timeout: float = 10.0) -> dict[str, Any]:
        """QUERY-LAST-TRANSACTION / QUERY-TRANSACTION: a JSON line, or an ERR line."""
        import json

        self.writer.write(line.encode())
        await self.writer.drain()
        reply = await asyncio.wait_for(self.reader.readline(), timeout)
        if reply.startswith(b"ERR"):
            _, code, message = parse_reply(reply)
            raise ProtocolError(code or Code.INTERNAL, message)
        data: dict[str, Any] = json.loads(reply)
        return data

    async def request(self, request: DataRequest) -> AsyncIterator[Event]:
        self.writer.write(request.line().encode())
        await self.writer.drain()
        decoder = JsonStreamDecoder() if self.format == Format.JSON else AvroStreamDecoder()
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("the server closed the stream")
            for event in decoder.feed(data):
                yield event

    async def close(self) -> None:
        try:
            self.writer.write(b"CLOSE")
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError, RuntimeError):
            pass


class CdcClient:
    def __init__(self, host: str, port: int, user: str, password: str, *,
                 format: str | Format = Format.JSON, ssl: Any = None,
                 timeout: float = 10.0, retry_delays: tuple[float, ...] = (0.1, 0.5, 1, 2, 5),
                 max_retries: int | None = None) -> None:
        self.host, self.port = host, port
        self.user, self.password = user, password
        self.format = Format(format)
        self.ssl = ssl
        self.timeout = timeout
        self.retry_delays = retry_delays
        self.max_retries = max_retries

    async def __aenter__(self) -> CdcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def connect(self) -> CdcConnection:
        return await CdcConnection.open(self.host, self.port, self.user, self.password,
                                        format=self.format, ssl=self.ssl, timeout=self.timeout)

    async def stream(self, table: str, *, version: int | None = None,
                     gtid: str | None = None) -> AsyncIterator[Event]:
        """Every record of ``db.table`` from ``version`` (or the first) or ``gtid`` on, then new
        ones as they commit, forever; reconnects after a dropped connection."""
        database, _, name = table.partition(".")
        resume = Resume(version, gtid)
        failures = 0
        while True:
            try:
                conn = await self.connect()
            except RETRIABLE as exc:
                failures = await self._backoff(failures, exc)
                continue
            except ProtocolError as exc:
                if not exc.retriable:
                    raise
                failures = await self._backoff(failures, exc)
                continue
            try:
                request_version, request_gtid = resume.request()
                async for event in conn.request(DataRequest(database, name, request_version,
                                                            request_gtid)):
                    failures = 0
                    if resume.accept(event):
                        yield event
            except RETRIABLE as exc:
                failures = await self._backoff(failures, exc)
            except ProtocolError as exc:
                if not exc.retriable:
                    raise
                failures = await self._backoff(failures, exc)
            finally:
                await conn.close()

    async def _backoff(self, failures: int, exc: BaseException) -> int:
        if self.max_retries is not None and failures >= self.max_retries:
            raise exc
        delay = self.retry_delays[min(failures, len(self.retry_delays) - 1)]
        log.warning("CDC connection to %s:%d failed (%s); retrying in %.1fs", self.host,
                    self.port, exc, delay)
        await asyncio.sleep(delay)
        return failures + 1

    async def last_transaction(self) -> dict[str, Any]:
        conn = await self.connect()
        try:
            return await conn.query("QUERY-LAST-TRANSACTION", self.timeout)
        finally:
            await conn.close()

    async def transaction(self, gtid: str) -> dict[str, Any]:
        conn = await self.connect()
        try:
            return await conn.query(f"QUERY-TRANSACTION {gtid}", self.timeout)
        finally:
            await conn.close()
