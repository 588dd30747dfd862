"""The one way the listener writes to a client.

Every write goes through a client's :class:`Outbox`: replies to commands, stream data and
dump transfers; one exception, the shared tails (:mod:`.tail`) write a commit to each
following client's :attr:`Outbox.transport` themselves and count it as the outbox would (that
loop is the fan-out's cost, so it calls nothing per client it need not). It refuses to write
to a connection the client has closed (uvloop raises RuntimeError there, not
ConnectionError), waits for the socket to take each write (``drain``), yields the loop after
each, and counts the bytes of streams, tails and dumps in the listener's totals
(``cdc_sent_bytes``; replies to commands are not counted).

Stored bytes (AVRO streams, dumps) go as they are on disk with :meth:`Outbox.send_file`:
``sendfile(2)`` from the page cache to the transport's own socket, on the event loop. The
socket is non-blocking, so a full socket returns at once; the outbox then hands the
transport the next ``SPILL`` bytes, read from the file, and waits until it has written them:
the transport waits for room with its own watch on the socket (uvloop lets no one else watch
a transport's descriptor, and implements no ``loop.sendfile``), so a transfer takes no
descriptor beyond the file it reads and the socket. Most bytes never pass through Python, no
thread is taken, and a client that takes nothing for ``stall_timeout`` seconds loses the
transfer. On TLS connections (the bytes must be encrypted) the file is read and written in
chunks through the transport instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any

CHUNK = 1 << 20  # bytes read at a time where sendfile(2) cannot be used
SENDFILE_MAX = 4 << 20  # bytes per sendfile(2) call
SPILL = 64 << 10  # bytes written through the transport when the socket is full


@dataclass
class Traffic:
    """What a listener has sent, counted as it is written (the metrics read it)."""

    bytes_sent: int = 0
    records_sent: int = 0


class TransferStalled(TimeoutError):
    """The client accepted nothing for too long."""


class FileEnded(FileNotFoundError):
    """The file is shorter than the bytes asked for (retention or a resync replaced it)."""


class Outbox:
    def __init__(self, writer: asyncio.StreamWriter, traffic: Traffic) -> None:
        self.writer = writer
        self.transport = writer.transport  # (a shared tail writes to it directly)
        self.traffic = traffic
        # What was written last ends inside a message: a stored range or a dump being sent
        # (send_file), a JSON line whose big value goes in pieces. A line written now would
        # land inside it (a client would read it as part of a block or a value).
        self.cut = False
        self.lines = False  # a JSON stream: a message ends with its line's newline
        self._file = False  # send_file under way (its copy over TLS goes through send)
        self.bytes_sent = 0  # by this connection, counted as the listener's are
        self.records_sent = 0

    @property
    def closing(self) -> bool:
        return self.writer.is_closing()

    @property
    def buffered(self) -> int:
        """Bytes written but not yet taken by the socket."""
        return self.writer.transport.get_write_buffer_size()

    async def send(self, data: bytes, *, counted: bool = True) -> None:
        """Stream data: raises ConnectionResetError once the client has gone."""
        if self.writer.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.writer.write(data)
        if not self._file:
            self.cut = self.lines and not data.endswith(b"\n")
        if counted:
            self.sent(len(data))
        await self.writer.drain()
        # drain() returns at once below the high-water mark: yield anyway, so a stream
        # sending a whole file does not hold the loop (replication, other clients).
        await asyncio.sleep(0)

    async def reply(self, data: bytes) -> None:
        """A reply to a command: a client that has gone is not an error. After a message cut
        off (:attr:`cut`: a stream or a transfer ended inside one) the reply would be read as
        part of it: the connection is closed instead, which a client sees as a cut."""
        if self.cut:
            self.writer.close()
            return
        with contextlib.suppress(ConnectionError):
            await self.send(data, counted=False)

    def last_words(self, data: bytes) -> None:
        """A final line written without waiting (a refusal, the server stopping), where a
        message would start; not at all when the last one was cut off (:attr:`cut`): the
        connection then ends as if cut, which a client sees for what it is."""
        if self.cut:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not self.writer.is_closing():
                self.writer.write(data)

    def records(self, count: int) -> None:
        """``count`` records were written (counted with the listener's)."""
        self.records_sent += count
        self.traffic.records_sent += count

    def sent(self, count: int) -> None:
        self.bytes_sent += count
        self.traffic.bytes_sent += count

    async def send_file(self, fd: int, offset: int, count: int, *,
                        stall_timeout: float | None = None) -> int:
        """``count`` bytes of the open file ``fd`` from ``offset``, as they are on disk;
        returns the bytes sent (``count``). Raises ConnectionResetError when the client goes,
        TransferStalled when it takes nothing for ``stall_timeout`` seconds, and FileEnded
        when the file is shorter than ``count``. ``fd`` is read at explicit offsets only
        (other streams may share it) and must stay open until this returns."""
        self.cut = self._file = True
        try:
            sent = await self._send_file(fd, offset, count, stall_timeout)
            self.cut = False
            return sent
        except RuntimeError:  # uvloop's word for a transport the client's reset closed
            if self.writer.is_closing():
                raise ConnectionResetError("the client closed the connection") from None
            raise
        finally:
            self._file = False

    async def _send_file(self, fd: int, offset: int, count: int,
                         stall_timeout: float | None) -> int:
        transport = self.writer.transport
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None or \
                not hasattr(os, "sendfile"):
            return await self._copy(fd, offset, count, stall_timeout)
        await self._flushed(stall_timeout)  # what was written before goes first
        sent = 0
        while sent < count:
            n = self._sendfile(sock, fd, offset + sent, min(count - sent, SENDFILE_MAX))
            if n is None:  # the socket is full: the transport waits for room
                n = await self._spill(fd, offset + sent, min(count - sent, SPILL),
                                      stall_timeout)
            elif n == 0:
                raise FileEnded(f"the file ended after {sent} of {count} bytes")
            else:
                self.sent(n)
                await asyncio.sleep(0)  # let replication and other clients run
            sent += n
        return sent

    def _sendfile(self, sock: Any, fd: int, offset: int, count: int) -> int | None:
        """One ``sendfile(2)`` to the transport's socket: the bytes it took, None if it is
        full. The transport closes its socket only once it is closing, and nothing runs
        between the check and the call (no await): the descriptor written to is still the
        client's, never one a later connection or file got the number of."""
        if self.writer.is_closing():
            raise ConnectionResetError("the client closed the connection")
        try:
            return os.sendfile(sock.fileno(), fd, offset, count)
        except BlockingIOError:
            return None
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ConnectionResetError(f"the client went away: {exc}") from None

    async def _spill(self, fd: int, offset: int, count: int,
                     stall_timeout: float | None) -> int:
        """``count`` bytes of the file written through the transport, once it has handed them
        all to the socket: the socket has room again."""
        data = os.pread(fd, count, offset)
        if not data:
            raise FileEnded(f"the file ended at offset {offset}")
        self.writer.write(data)
        self.sent(len(data))
        await self._flushed(stall_timeout)
        return len(data)

    async def _copy(self, fd: int, offset: int, count: int,
                    stall_timeout: float | None) -> int:
        sent = 0
        while sent < count:
            data = os.pread(fd, min(CHUNK, count - sent), offset + sent)
            if not data:
                raise FileEnded(f"the file ended after {sent} of {count} bytes")
            try:
                async with asyncio.timeout(stall_timeout):
                    await self.send(data)
            except TimeoutError:
                raise TransferStalled(f"the client took nothing for {stall_timeout:.0f}s") \
                    from None
            sent += len(data)
        return sent

    async def _flushed(self, stall_timeout: float | None) -> None:
        """Until the transport has handed the socket everything written to it."""
        transport = self.writer.transport
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0)
        try:
            async with asyncio.timeout(stall_timeout):
                while transport.get_write_buffer_size():
                    if transport.is_closing():
                        raise ConnectionResetError("the client closed the connection")
                    await self.writer.drain()
        except TimeoutError:
            raise TransferStalled(f"the client took nothing for {stall_timeout:.0f}s") \
                from None
        finally:
            # uvloop refuses to touch a transport that closed meanwhile (the client left
            # during a transfer): the error on its way out says so already.
            with contextlib.suppress(RuntimeError):
                transport.set_write_buffer_limits(high=high, low=low)
