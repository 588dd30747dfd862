"""The blocking client, for scripts, the CLI and Spark executors.

    with SyncCdcClient("127.0.0.1", 4001, "cdcuser", "cdcpass") as cdc:
        for event in cdc.stream("shop.orders", idle_timeout=5):
            ...

The same protocol and decoders as :mod:`mariadb_cdc_client.aio`, over a plain socket.
"""

from __future__ import annotations

import logging
import socket
import ssl as ssl_module
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
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


class SyncCdcConnection:
    def __init__(self, sock: socket.socket, fmt: Format) -> None:
        self.sock = sock
        self.format = fmt
        self._pending = bytearray()

    @classmethod
    def open(cls, host: str, port: int, user: str, password: str, *,
             format: str | Format = Format.JSON, uuid: str | None = None,
             ssl: ssl_module.SSLContext | None = None, timeout: float = 10.0,
             auth: str | Auth = Auth.AUTO) -> SyncCdcConnection:
        """Log in (``auth``: see :mod:`mariadb_cdc_client.login`) and register."""
        fmt, auth = Format(format), Auth(auth)
        login = scram_login(user, password, auth)
        if login is not None:
            conn = cls._connected(host, port, fmt, ssl, timeout)
            try:
                if conn._scram(login):
                    conn._register(uuid)
                    return conn
            except BaseException:
                conn.close()
                raise
            conn.close()
            log.info("SCRAM login as %s not accepted: trying MaxScale's login", user)
        conn = cls._connected(host, port, fmt, ssl, timeout)
        try:
            conn.command(auth_message(user, password))
            conn._register(uuid)
        except BaseException:
            conn.close()
            raise
        return conn

    @classmethod
    def _connected(cls, host: str, port: int, fmt: Format,
                   ssl: ssl_module.SSLContext | None, timeout: float) -> SyncCdcConnection:
        sock = socket.create_connection((host, port), timeout=timeout)
        end_silent_peers(sock, DEAD_SERVER_TIMEOUT)
        if ssl is not None:
            sock = ssl.wrap_socket(sock, server_hostname=host)
        return cls(sock, fmt)

    def _scram(self, login: ScramLogin) -> bool:
        """The SCRAM exchange: True once logged in; False when ``Auth.AUTO`` should try
        MaxScale's login instead (not offered, or not accepted)."""
        self.sock.sendall(login.first())
        try:
            reply = self._readline()
        except ConnectionError:
            reply = b""  # MaxScale hangs up on a login it cannot parse
        final = login.answer(reply)
        if final is None:
            return False
        self.sock.sendall(final)
        return login.accepted(self._readline())

    def _register(self, uuid: str | None) -> None:
        register = register_line(uuid or str(uuidlib.uuid4()), self.format,
                                 CLIENT_DIALECT[self.format])
        self.command(register.encode())

    def _readline(self) -> bytes:
        """The next reply line, within the socket's timeout for the whole line (a server
        sending it a byte at a time is not waited for without end) and ``REPLY_MAX`` bytes
        (as the asyncio client's)."""
        timeout = self.sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while (newline := self._pending.find(b"\n")) < 0:
                if len(self._pending) > REPLY_MAX:
                    raise ValueError(f"the server's reply is longer than {REPLY_MAX} bytes "
                                     "without its end")
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    self.sock.settimeout(left)
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self._pending += data
        except TimeoutError:
            raise TimeoutError(f"the server's reply did not come whole within {timeout:g} s"
                               ) from None
        finally:
            self.sock.settimeout(timeout)
        line = bytes(self._pending[: newline + 1])
        del self._pending[: newline + 1]
        return line

    def command(self, line: bytes) -> str:
        self.sock.sendall(line)
        ok, code, message = parse_reply(self._readline())
        if not ok:
            raise ProtocolError(code or Code.INTERNAL, message)
        return message

    def query(self, line: str) -> dict[str, Any]:
        self.send(line)
        reply = self._readline()
        if reply.startswith(b"ERR"):
            _, code, message = parse_reply(reply)
            raise ProtocolError(code or Code.INTERNAL, message)
        return json_answer(reply)

    def request(self, request: DataRequest | None, idle_timeout: float | None = None
                ) -> Iterator[Event]:
        """Events until the connection drops, or until ``idle_timeout`` seconds pass with
        nothing received (then the iterator simply ends; but TimeoutError when what came
        last ended inside a message: the server stalled). ``request`` None: the stream has
        already started (after ``REQUEST-DUMP ... FOLLOW``)."""
        for batch in self.request_batches(request, idle_timeout):
            yield from batch

    def request_batches(self, request: DataRequest | None, idle_timeout: float | None = None
                        ) -> Iterator[list[Event]]:
        """:meth:`request`'s events in the decoders' batches (a block's records, or a
        schema)."""
        if request is not None:
            self.send(request.line())
        decoder = JsonStreamDecoder() if self.format == Format.JSON else AvroStreamDecoder()
        self.sock.settimeout(idle_timeout)
        data, self._pending = bytes(self._pending), bytearray()
        while True:
            if data:
                yield from decoder.batches(data)
            try:
                data = self.sock.recv(1 << 18)
            except TimeoutError:
                if decoder.inside_message:  # a stalled server, not a quiet stream
                    raise TimeoutError(f"the server stopped inside a message for "
                                       f"{idle_timeout:g} s") from None
                return
            if not data:
                raise ConnectionError("the server closed the stream")

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode())

    def receive_into(self, view: memoryview) -> int:
        """The next bytes of a reply, into ``view``: how many (the bytes already read past
        the last reply line come first); 0 once the server has closed the connection."""
        if self._pending:
            size = min(len(view), len(self._pending))
            view[:size] = self._pending[:size]
            del self._pending[:size]
            return size
        return self.sock.recv_into(view)

    def start_dumps(self, *tables: Table | str) -> dict[str, list[str]]:
        """START-DUMP: new dumps of ``tables`` (``db.table``, or ``"db.*"``) taken now."""
        names = [t if isinstance(t, str) and t.endswith(".*") else str(as_table(t)) for t in tables]
        reply: dict[str, list[str]] = self.query("START-DUMP " + " ".join(names))
        return reply

    def taking(self, table: Table | None = None) -> list[dict[str, Any]]:
        """The dumps the server is taking (queued, running, or failed lately)."""
        reply = self.query("LIST-DUMPS" + (f" {as_table(table)}" if table else ""))
        taking: list[dict[str, Any]] = reply.get("taking", [])
        return taking

    def list_dumps(self, table: Table | None = None) -> list[dict[str, Any]]:
        return objects(self.query("LIST-DUMPS" + (f" {as_table(table)}" if table else "")),
                       "dumps")

    def request_dump(self, request: DumpRequest) -> tuple[int, str]:
        """Send REQUEST-DUMP; returns (size, name). Exactly ``size`` bytes of the file follow
        (:meth:`read_dump`), then, with FOLLOW, the change stream."""
        return dump_reply(self.command(request.line().encode()))

    def read_dump(self, size: int) -> Iterator[bytes]:
        remaining = size
        if self._pending:
            data = bytes(self._pending[:remaining])
            del self._pending[: len(data)]
            remaining -= len(data)
            yield data
        while remaining:
            data = self.sock.recv(min(remaining, 1 << 20))
            if not data:
                raise ConnectionError(f"the server closed the connection with {remaining} "
                                      "bytes of the dump still to come")
            remaining -= len(data)
            yield data

    def close(self) -> None:
        try:
            self.sock.sendall(b"CLOSE")
        except OSError:
            pass
        self.sock.close()


class SyncCdcClient:
    def __init__(self, host: str, port: int, user: str, password: str, *,
                 format: str | Format = Format.JSON,
                 ssl: ssl_module.SSLContext | None = None, timeout: float = 10.0,
                 retry_delays: tuple[float, ...] = DELAYS,
                 max_retries: int | None = None, auth: str | Auth = Auth.AUTO) -> None:
        self.endpoints = Endpoints.of(host, port)  # several: see mariadb_cdc_client.endpoints
        self.user, self.password = user, password
        self.auth = Auth(auth)  # the login: see mariadb_cdc_client.login
        self.format = Format(format)
        self.ssl = ssl
        self.timeout = timeout
        self.retry_delays = retry_delays
        self.max_retries = max_retries

    def __enter__(self) -> SyncCdcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def host(self) -> str:
        """The instance in use."""
        return self.endpoints.current[0]

    @property
    def port(self) -> int:
        return self.endpoints.current[1]

    def connect(self) -> SyncCdcConnection:
        """A connection to the instance in use."""
        return SyncCdcConnection.open(self.host, self.port, self.user, self.password,
                                      format=self.format, ssl=self.ssl, timeout=self.timeout,
                                      auth=self.auth)

    def _connect_any(self) -> SyncCdcConnection:
        """A connection to the instance in use, else to each of the others in turn."""
        for _ in range(len(self.endpoints.all) - 1):
            try:
                return self.connect()
            except OSError as exc:
                log.warning("CDC connection to %s failed (%s)", self.endpoints.describe(), exc)
                self.endpoints.failed()
        return self.connect()

    def stream(self, table: Table, *, version: int | None = None, gtid: str | None = None,
               after: str | None = None, idle_timeout: float | None = None
               ) -> Iterator[Event]:
        """Like :meth:`mariadb_cdc_client.aio.CdcClient.stream`; with ``idle_timeout`` the
        iterator ends once nothing new arrived for that long."""
        ref = as_table(table, version=True)
        resume = Resume(ref.version if version is None else version, gtid, after)
        yield from self._follow(ref, resume, idle_timeout)

    def _follow(self, table: TableRef, resume: Resume, idle_timeout: float | None,
                conn: SyncCdcConnection | None = None) -> Iterator[Event]:
        database, name = table.database, table.table
        policy = Reconnect(self.endpoints, self.retry_delays, self.max_retries)
        while True:
            try:
                request = None
                if conn is None:
                    conn = self.connect()
                    request = DataRequest(database, name, *resume.request())
                try:
                    for batch in conn.request_batches(request, idle_timeout):
                        if holds_records(batch):
                            policy.received()
                        yield from resume.accepted(batch)
                    return
                finally:
                    conn.close()
                    conn = None
            except (*FAILURES, ProtocolError) as exc:
                time.sleep(policy.failed(exc))

    # -- dumps (extensions) ------------------------------------------------------------

    def list_dumps(self, table: Table | None = None) -> list[dict[str, Any]]:
        conn = self._connect_any()
        try:
            return conn.list_dumps(table)
        finally:
            conn.close()

    def fetch_dump(self, target: Table, path: str,
                   progress: Callable[[int, int], None] | None = None) -> DumpHeader:
        """Like :meth:`mariadb_cdc_client.aio.CdcClient.fetch_dump`."""
        conn = self._connect_any()
        try:
            size, _ = conn.request_dump(DumpRequest.of(target))
            with SavedDump(path) as saved:
                for data in conn.read_dump(size):
                    saved.write(data)
                    if progress is not None:
                        progress(saved.received, size)
                return saved.finish()
        finally:
            conn.close()

    def dump(self, target: Table, *, follow: bool = True,
             progress: Callable[[int, int], None] | None = None,
             idle_timeout: float | None = None) -> Iterator[DumpHeader | DumpRows | Event]:
        """Like :meth:`mariadb_cdc_client.aio.CdcClient.dump`; with ``idle_timeout`` the
        iterator ends once nothing new arrived for that long after the dump."""
        conn: SyncCdcConnection | None = self._connect_any()
        assert conn is not None
        try:
            size, _ = conn.request_dump(DumpRequest.of(target, follow))
            decoder = DumpDecoder()
            for data in conn.read_dump(size):
                yield from decoder.feed(data)
                if progress is not None:
                    progress(decoder.received, size)
            header = decoder.finish()
        except BaseException:
            conn.close()
            raise
        if not follow:
            conn.close()
            return
        resume = Resume(header.stream_version or None, None, header.gtid or None)
        yield from self._follow(TableRef(header.database, header.table), resume, idle_timeout,
                                conn)

    def last_transaction(self) -> dict[str, Any]:
        conn = self._connect_any()
        try:
            return conn.query("QUERY-LAST-TRANSACTION")
        finally:
            conn.close()

    def transaction(self, gtid: str) -> dict[str, Any]:
        conn = self._connect_any()
        try:
            return conn.query(f"QUERY-TRANSACTION {gtid}")
        finally:
            conn.close()
