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
from collections.abc import AsyncIterator, Callable
from typing import Any

from mariadb_cdc_client.dump import SavedDump
from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.dump import DumpDecoder, DumpHeader, DumpRows, dump_reply
from mariadb_cdc_client.format.keepalive import DEAD_SERVER_TIMEOUT, end_silent_peers
from mariadb_cdc_client.format.names import Table, TableRef, as_table
from mariadb_cdc_client.format.wire import (
    CLIENT_DIALECT,
    REPLY_MAX,
    Code,
    DataRequest,
    DumpRequest,
    Format,
    ProtocolError,
    auth_message,
    json_answer,
    objects,
    parse_reply,
    register_line,
)
from mariadb_cdc_client.login import Auth, ScramLogin, scram_login
from mariadb_cdc_client.reconnect import DELAYS, FAILURES, Reconnect
from mariadb_cdc_client.resume import Resume
from mariadb_cdc_client.stream import (
    AvroStreamDecoder,
    Event,
    JsonStreamDecoder,
    holds_records,
)

log = logging.getLogger(__name__)



class CdcConnection:
    """One authenticated and registered connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 fmt: Format, timeout: float = 10.0) -> None:
        self.reader = reader
        self.writer = writer
        self.format = fmt
        self.timeout = timeout

    @classmethod
    async def open(cls, host: str, port: int, user: str, password: str, *,
                   format: str | Format = Format.JSON, uuid: str | None = None,
                   ssl: Any = None, timeout: float = 10.0, auth: str | Auth = Auth.AUTO
                   ) -> CdcConnection:
        """Log in (``auth``: see :mod:`mariadb_cdc_client.login`) and register."""
        fmt, auth = Format(format), Auth(auth)
        login = scram_login(user, password, auth)
        if login is not None:
            conn = await cls._connected(host, port, fmt, ssl, timeout)
            try:
                if await conn._scram(login):
                    await conn._register(uuid)
                    return conn
            except BaseException:
                await conn.close()
                raise
            await conn.close()
            log.info("SCRAM login as %s not accepted: trying MaxScale's login", user)
        conn = await cls._connected(host, port, fmt, ssl, timeout)
        try:
            await conn.command(auth_message(user, password), timeout)
            await conn._register(uuid)
        except BaseException:
            await conn.close()
            raise
        return conn

    @classmethod
    async def _connected(cls, host: str, port: int, fmt: Format, ssl: Any, timeout: float
                         ) -> CdcConnection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ssl, limit=REPLY_MAX), timeout)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            end_silent_peers(sock, DEAD_SERVER_TIMEOUT)
        return cls(reader, writer, fmt, timeout)

    async def _scram(self, login: ScramLogin) -> bool:
        """The SCRAM exchange: True once logged in; False when ``Auth.AUTO`` should try
        MaxScale's login instead (not offered, or not accepted)."""
        final = login.answer(await self._exchange(login.first()))  # b"": a hang-up
        return final is not None and login.accepted(await self._exchange(final))

    async def _exchange(self, line: bytes) -> bytes:
        self.writer.write(line)
        await self.writer.drain()
        return await asyncio.wait_for(self.reader.readline(), self.timeout)

    async def _register(self, uuid: str | None) -> None:
        register = register_line(uuid or str(uuidlib.uuid4()), self.format,
                                 CLIENT_DIALECT[self.format])
        await self.command(register.encode(), self.timeout)

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
        self.writer.write(line.encode())
        await self.writer.drain()
        reply = await asyncio.wait_for(self.reader.readline(), timeout)
        if reply.startswith(b"ERR"):
            _, code, message = parse_reply(reply)
            raise ProtocolError(code or Code.INTERNAL, message)
        return json_answer(reply)

    async def request(self, request: DataRequest | None) -> AsyncIterator[Event]:
        """Send ``request`` and decode the stream (None: the stream already started, after
        a ``REQUEST-DUMP ... FOLLOW``)."""
        async for batch in self.request_batches(request):
            for event in batch:
                yield event

    async def request_batches(self, request: DataRequest | None
                              ) -> AsyncIterator[list[Event]]:
        """:meth:`request`'s events in the decoders' batches (a block's records, or a
        schema)."""
        if request is not None:
            self.writer.write(request.line().encode())
            await self.writer.drain()
        decoder = JsonStreamDecoder() if self.format == Format.JSON else AvroStreamDecoder()
        while True:
            data = await self.reader.read(1 << 18)
            if not data:
                raise ConnectionError("the server closed the stream")
            for batch in decoder.batches(data):
                yield batch

    async def list_dumps(self, table: Table | None = None) -> list[dict[str, Any]]:
        reply = await self.query("LIST-DUMPS" + (f" {as_table(table)}" if table else ""))
        return objects(reply, "dumps")

    async def start_dumps(self, *tables: Table | str) -> dict[str, list[str]]:
        """START-DUMP: new dumps of ``tables`` (``db.table``, or ``"db.*"``) taken now;
        ``{"started": [...], "under_way": [...]}``. LIST-DUMPS shows their progress."""
        names = [t if isinstance(t, str) and t.endswith(".*") else str(as_table(t)) for t in tables]
        reply: dict[str, list[str]] = await self.query("START-DUMP " + " ".join(names))
        return reply

    async def request_dump(self, request: DumpRequest) -> tuple[int, str]:
        """Send REQUEST-DUMP; returns (size, name). Exactly ``size`` bytes of the file follow
        (read them with :meth:`read_dump`), then, with FOLLOW, the change stream."""
        return dump_reply(await self.command(request.line().encode(), self.timeout))

    async def read_dump(self, size: int) -> AsyncIterator[bytes]:
        remaining = size
        while remaining:
            data = await self.reader.read(min(remaining, 1 << 20))
            if not data:
                raise ConnectionError(f"the server closed the connection with {remaining} "
                                      "bytes of the dump still to come")
            remaining -= len(data)
            yield data

    async def close(self) -> None:
        try:
            self.writer.write(b"CLOSE")
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError, RuntimeError):
            pass


class CdcClient:
    """``host`` may name several service instances, ``HOST[:PORT],...``
    (:mod:`mariadb_cdc_client.endpoints`): the client moves to the next when one fails."""

    def __init__(self, host: str, port: int, user: str, password: str, *,
                 format: str | Format = Format.JSON, ssl: Any = None,
                 timeout: float = 10.0, retry_delays: tuple[float, ...] = DELAYS,
                 max_retries: int | None = None, auth: str | Auth = Auth.AUTO) -> None:
        self.endpoints = Endpoints.of(host, port)
        self.user, self.password = user, password
        self.auth = Auth(auth)  # the login: see mariadb_cdc_client.login
        self.format = Format(format)
        self.ssl = ssl
        self.timeout = timeout
        self.retry_delays = retry_delays
        self.max_retries = max_retries

    async def __aenter__(self) -> CdcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def host(self) -> str:
        """The instance in use."""
        return self.endpoints.current[0]

    @property
    def port(self) -> int:
        return self.endpoints.current[1]

    async def connect(self) -> CdcConnection:
        """A connection to the instance in use."""
        return await CdcConnection.open(self.host, self.port, self.user, self.password,
                                        format=self.format, ssl=self.ssl, timeout=self.timeout,
                                        auth=self.auth)

    async def _connect_any(self) -> CdcConnection:
        """A connection to the instance in use, else to each of the others in turn."""
        for _ in range(len(self.endpoints.all) - 1):
            try:
                return await self.connect()
            except FAILURES as exc:
                log.warning("CDC connection to %s failed (%s)", self.endpoints.describe(), exc)
                self.endpoints.failed()
        return await self.connect()

    async def stream(self, table: Table, *, version: int | None = None,
                     gtid: str | None = None, after: str | None = None
                     ) -> AsyncIterator[Event]:
        """Every record of ``table`` from ``version`` (or the first) or ``gtid`` on (or, an
        extension, of the transactions the GTID state ``after`` does not cover), then new
        ones as they commit, forever; reconnects after a dropped connection. ``table`` is
        ``db.table[.version]`` as commands write it (```my db`.t``, protocol.md's quoting)
        or the pair of names (``("my db", "t")``)."""
        ref = as_table(table, version=True)
        resume = Resume(ref.version if version is None else version, gtid, after)
        async for batch in self._follow(ref, resume):
            for event in batch:
                yield event

    async def _follow(self, table: TableRef, resume: Resume,
                      conn: CdcConnection | None = None) -> AsyncIterator[list[Event]]:
        """The stream in batches (an async generator's step per record costs as much as
        decoding it), resumed after each failure; ``conn`` is one already streaming."""
        database, name = table.database, table.table
        policy = Reconnect(self.endpoints, self.retry_delays, self.max_retries)
        while True:
            if conn is None:
                try:
                    conn = await self.connect()
                except (*FAILURES, ProtocolError) as exc:
                    await asyncio.sleep(policy.failed(exc))
                    continue
                request: DataRequest | None = DataRequest(database, name, *resume.request())
            else:
                request = None  # already streaming
            try:
                async for batch in conn.request_batches(request):
                    if holds_records(batch):
                        policy.received()
                    accepted = resume.accepted(batch)
                    if accepted:
                        yield accepted
            except (*FAILURES, ProtocolError) as exc:
                await asyncio.sleep(policy.failed(exc))
            finally:
                await conn.close()
                conn = None

    # -- dumps (extensions) ------------------------------------------------------------

    async def list_dumps(self, table: Table | None = None) -> list[dict[str, Any]]:
        """The server's complete dumps (of ``table``), oldest first."""
        conn = await self._connect_any()
        try:
            return await conn.list_dumps(table)
        finally:
            await conn.close()

    async def fetch_dump(self, target: Table, path: str,
                         progress: Callable[[int, int], None] | None = None) -> DumpHeader:
        """Save a dump (``db.table`` for its newest, or a dump name) to ``path`` as the
        server has it, checking its checksum; ``progress(received, total)`` after each
        piece."""
        conn = await self._connect_any()
        try:
            size, _ = await conn.request_dump(DumpRequest.of(target))
            saved = await asyncio.to_thread(SavedDump, path)
            try:
                async for data in conn.read_dump(size):
                    await asyncio.to_thread(saved.write, data)
                    if progress is not None:
                        progress(saved.received, size)
                return await asyncio.to_thread(saved.finish)
            except BaseException:
                await asyncio.to_thread(saved.abandon)
                raise
        finally:
            await conn.close()

    async def dump(self, target: Table, *, follow: bool = True,
                   progress: Callable[[int, int], None] | None = None
                   ) -> AsyncIterator[DumpHeader | DumpRows | Event]:
        """A table's newest dump (or the dump named ``target``): its header, its row
        operations, then with ``follow`` the changes after it, forever (reconnecting as
        :meth:`stream` does). The dump plus what follows is the table."""
        conn = await self._connect_any()
        try:
            size, _ = await conn.request_dump(DumpRequest.of(target, follow))
            decoder = DumpDecoder()
            async for data in conn.read_dump(size):
                for item in decoder.feed(data):
                    yield item
                if progress is not None:
                    progress(decoder.received, size)
            header = decoder.finish()
        except BaseException:
            await conn.close()
            raise
        if not follow:
            await conn.close()
            return
        resume = Resume(header.stream_version or None, None, header.gtid or None)
        async for batch in self._follow(TableRef(header.database, header.table), resume,
                                        conn):
            for event in batch:
                yield event

    async def last_transaction(self) -> dict[str, Any]:
        conn = await self._connect_any()
        try:
            return await conn.query("QUERY-LAST-TRANSACTION", self.timeout)
        finally:
            await conn.close()

    async def transaction(self, gtid: str) -> dict[str, Any]:
        conn = await self._connect_any()
        try:
            return await conn.query(f"QUERY-TRANSACTION {gtid}", self.timeout)
        finally:
            await conn.close()
