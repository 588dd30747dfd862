"""One client's connection: the task that owns its socket.

It frames messages (``framing.py``), enforces the deadlines (authentication and idle
timeouts) and carries out what the :class:`Session` decides: replies, a stream
(``stream.py``), a dump file sent whole. While a stream or a transfer runs, the task keeps
reading, so that ``CLOSE`` or a hang-up ends it at once. The listener (``server.py``)
accepts connections and runs one of these for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import BinaryIO, Protocol

from cdcserver.core.config import ListenerConfig
from cdcserver.core.names import TableName
from cdcserver.dump.databus import NoDefinition, write_databus
from cdcserver.protocol.dialect import JsonStyle
from cdcserver.protocol.framing import MessageReader
from cdcserver.protocol.openfiles import dump_in_use
from cdcserver.protocol.outbox import Outbox, Traffic
from cdcserver.protocol.outcomes import Delay, Phase, Reply, SendDump, StartStream
from cdcserver.protocol.queries import QUERIES, SessionContext
from cdcserver.protocol.session import Session, for_log
from cdcserver.protocol.stream import Streamer
from cdcserver.protocol.tail import Tails
from mariadb_cdc_client.format.keepalive import SilenceWatch
from mariadb_cdc_client.format.wire import Code, ProtocolError, error_line

# the listener's log, wherever its lines are written from
log = logging.getLogger("cdcserver.protocol.server")


class Listener(Protocol):
    """What a connection reads of the listener that accepted it (``server.CdcServer``)."""

    context: SessionContext
    limits: ListenerConfig
    zone: dt.tzinfo
    databus_labels: bool  # a dump's databus layout as the Kafka sink's
    traffic: Traffic
    tails: Tails
    dumps_sent: int
    dump_released: Callable[[], None] | None  # wakes the cleaner


class LayoutFailed(Exception):
    """The databus layout of a dump could not be written (a full disk...)."""


class Connection:
    def __init__(self, server: Listener, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str, connection_id: int = 0) -> None:
        self.server = server
        self.id = connection_id  # unique while the listener runs (the admin API's)
        self.connected_at = time.time()
        self.out = Outbox(writer, server.traffic)
        self.peer = peer
        self.messages = MessageReader(reader, server.limits.max_line)
        self.session = Session(server.context, peer, server.limits.bad_command_limit)
        loop = asyncio.get_running_loop()
        # One deadline for the whole authentication phase; after it, the idle deadline moves
        # only with real commands (empty lines do not keep a connection alive).
        self._auth_deadline = loop.time() + server.limits.auth_timeout
        self._last_command = loop.time()
        self._pending: bytes | None = None  # a command that arrived during a dump transfer
        # told once, when the session leaves the login phase (the per-address count)
        self.left_login: Callable[[], None] | None = None
        self.reading: TableName | None = None  # the table being streamed or dumped
        self.streamer: Streamer | None = None  # the stream being sent
        self.sending: str | None = None  # the dump file being sent (its name)
        self.request: str | None = None  # the command that started them
        self.revoked: str | None = None  # why the server ended the session (users file)
        self.silence = SilenceWatch()  # the listener's sweep for dead clients asks it

    async def run(self) -> None:
        log.debug("%s: connected", self.peer)
        try:
            while self.session.phase != Phase.CLOSED:
                message = await self._next_message()
                if message is None:
                    break
                if message.strip():
                    self._last_command = asyncio.get_running_loop().time()
                outcome = self.session.receive(message)
                if self.left_login is not None and self.session.phase != Phase.AUTH:
                    self.left_login()
                    self.left_login = None
                if isinstance(outcome, Delay):
                    await asyncio.sleep(outcome.seconds)
                    outcome = outcome.then()
                while isinstance(outcome, QUERIES):  # read off the loop, answered on it
                    result = await asyncio.to_thread(outcome.fetch, self.session.context)
                    outcome = self.session.answered(outcome, result)
                if isinstance(outcome, Reply):
                    if outcome.data:
                        await self.out.reply(outcome.data)
                    if outcome.close:
                        break
                elif isinstance(outcome, StartStream):
                    await self._stream(outcome)
                    break
                elif isinstance(outcome, SendDump):
                    sent = await self._send_dump(outcome)
                    if not sent or outcome.follow is None or \
                            self.session.phase == Phase.CLOSED:
                        continue
                    await self._stream(StartStream(outcome.follow, outcome.format, outcome.dialect))
                    break
        except ProtocolError as exc:
            await self.out.reply(exc.reply())
        except TimeoutError:
            phase = "authentication" if self.session.phase == Phase.AUTH else "idle"
            await self.out.reply(error_line(Code.TIMEOUT, f"{phase} timeout"))
        except ConnectionError as exc:
            log.debug("%s: connection lost: %s", self.peer, exc)
        except Exception:
            log.exception("%s: internal error", self.peer)
            await self.out.reply(error_line(Code.INTERNAL, "internal error; see the server's log"))
        log.debug("%s: closed", self.peer)

    async def _next_message(self) -> bytes | None:
        if self._pending is not None:
            message, self._pending = self._pending, None
            return message
        if self.session.phase == Phase.AUTH:
            async with asyncio.timeout_at(self._auth_deadline):
                return await self.messages.next(self.session.incomplete)
        async with asyncio.timeout_at(self._last_command + self.server.limits.idle_timeout):
            return await self.messages.next()

    async def _stream(self, start: StartStream) -> None:
        context = self.server.context
        streamer = Streamer(context.catalog, context.index(), start.request, start.format,
                            self.out, JsonStyle(start.dialect, self.server.zone),
                            context.caught_up, self.server.tails)
        log.info("%s: %s (%s)", self.peer, for_log(start.request.line), start.format.value)
        self.reading = start.request.table
        self.streamer, self.request = streamer, start.request.line
        stream_task = asyncio.create_task(streamer.run())
        input_task = asyncio.create_task(self._watch_input(start.request.until is not None))
        try:
            done, _ = await asyncio.wait({stream_task, input_task},
                                         return_when=asyncio.FIRST_COMPLETED)
            if stream_task in done:
                stream_task.result()
            else:
                reply = input_task.result()
                stream_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream_task
                if reply:
                    await self.out.reply(reply)
        except ConnectionError:
            pass
        finally:
            for task in (stream_task, input_task):
                task.cancel()
            log.info("%s: stream ended: %d records, %d bytes", self.peer,
                     streamer.records_sent, streamer.bytes_sent)

    async def _send_dump(self, outcome: SendDump) -> bool:
        """``OK <bytes> <name>``, then the file, marked in use throughout. True if it was
        sent whole; False after an error reply (or a CLOSE, which also ends the session)."""
        dump = outcome.dump
        started = time.monotonic()
        self.reading, self.sending = dump.table, dump.name
        try:
            with dump_in_use(dump.path, outcome.databus) as on_disk, \
                    contextlib.ExitStack() as stack:
                f = on_disk
                if outcome.databus:
                    f = stack.enter_context(await self._databus_layout(
                        on_disk, dump.path, self.server.databus_labels))
                size = os.fstat(f.fileno()).st_size
                await self.out.reply(f"OK {size} {dump.name}\n".encode())
                transfer = asyncio.create_task(self.out.send_file(
                    f.fileno(), 0, size, stall_timeout=self.server.limits.idle_timeout))
                input_task = asyncio.create_task(self.messages.next())
                try:
                    await asyncio.wait({transfer, input_task},
                                       return_when=asyncio.FIRST_COMPLETED)
                    if input_task.done() and not transfer.done() and \
                            not self._hold(input_task.result()):
                        log.info("%s: %s: transfer abandoned by the client", self.peer,
                                 dump.name)
                        return False
                    sent = await transfer
                    if not input_task.done():
                        input_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        # A command that arrived as the transfer ended must not be lost.
                        message = await input_task
                        if not self._pending:
                            self._hold(message)
                finally:
                    for task in (transfer, input_task):
                        task.cancel()
                    for task in (transfer, input_task):
                        with contextlib.suppress(asyncio.CancelledError, ConnectionError,
                                                 OSError):
                            await task
        except FileNotFoundError:
            await self.out.reply(error_line(Code.NO_FILE, f"{dump.name} was deleted meanwhile"))
            return False
        except NoDefinition as exc:
            await self.out.reply(error_line(Code.NO_FILE, f"{dump.name}: {exc}"))
            return False
        except LayoutFailed as exc:
            log.warning("%s: %s: %s", self.peer, dump.name, exc)
            await self.out.reply(error_line(Code.INTERNAL, f"{dump.name}: {exc}"))
            return False
        finally:
            self.reading = self.sending = None
            if self.server.dump_released is not None:
                self.server.dump_released()
        self._last_command = asyncio.get_running_loop().time()  # the transfer was not idle
        self.server.dumps_sent += 1
        log.info("%s: sent %s (%d bytes in %.2fs)", self.peer, dump.name, sent,
                 time.monotonic() - started)
        return True

    @staticmethod
    async def _databus_layout(f: BinaryIO, path: str, labels: bool) -> BinaryIO:
        """The dump in mysql-databus's layout, in a file without a name beside it (it
        vanishes when closed, or with the process), its size known before the reply."""
        try:
            out = tempfile.TemporaryFile(dir=os.path.dirname(path))  # noqa: SIM115 - returned
        except OSError as exc:
            raise LayoutFailed(f"cannot make the databus layout: {exc.strerror or exc}") \
                from exc
        try:
            await asyncio.to_thread(write_databus, f, out, labels)
            out.seek(0)
        except OSError as exc:  # a full disk
            out.close()
            raise LayoutFailed(f"cannot make the databus layout: {exc.strerror or exc}") \
                from exc
        except BaseException:
            out.close()
            raise
        return out

    def _hold(self, message: bytes | None) -> bool:
        """A message read during a transfer: kept to be answered after it. CLOSE stops the
        transfer (False); the end of the client's input lets it finish (the client may
        have only shut down its sending side), and then the session ends."""
        if message is None:
            self.session.phase = Phase.CLOSED
            return True
        if message.strip().upper() == b"CLOSE":
            self.session.phase = Phase.CLOSED
            return False
        self._pending = message
        return True

    async def _watch_input(self, bounded: bool) -> bytes:
        """While streaming, only CLOSE (or a hang-up) is expected; returns the reply to send
        after stopping the stream (empty for none). The end of the client's input ends a
        live stream, as in MaxScale; a ``bounded`` read (``UNTIL``) goes on to its end line,
        as a dump's transfer does (a client that shut down its sending side, ``nc -N``), for
        ``idle_timeout`` at most."""
        while True:
            message: bytes | None
            if self._pending is not None:  # sent during a REQUEST-DUMP ... FOLLOW transfer
                message, self._pending = self._pending, None
            else:
                message = await self.messages.next()
            if message is None:
                if bounded:  # until the stream ends (then cancelled), as long as an idle
                    # session may stay: a client that has gone can only be told from one that
                    # shut down its side by writing to it, and a range may wait for the future
                    await asyncio.sleep(self.server.limits.idle_timeout)
                return b""
            command = message.strip().upper()
            if not command:
                continue
            if command == b"CLOSE":
                return b""
            return error_line(Code.STREAMING, "only CLOSE is accepted while streaming; "
                                              "closing the stream")

