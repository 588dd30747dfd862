"""A Kafka request that reaches the broker late, after its client gave up on it and sent it
again: what a network does with a request whose connection the client closed on a timeout
(the kernel goes on retransmitting the bytes it had queued, so they may arrive once the link
is back, after the retry). For an ``EndTxn`` (commit) this is dangerous: it names no
transaction, only the producer's id and epoch, so arriving once the next transaction of the
same epoch is open, it commits that one.

:class:`LateEndTxnProxy` relays a broker (which advertises the proxy's port, so every
connection of a client goes through it) and, once armed, holds the next ``EndTxn`` request:
it forwards nothing more of that connection, lets the client time out and retry on another
connection, and after ``delay`` seconds sends the held request to the broker on the original
connection, recording the broker's answer (its error code).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

END_TXN = 26  # the EndTxn request's api key


class LateEndTxnProxy:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.target = ("127.0.0.1", 0)
        self.port = 0
        self.armed = False
        self.held = 0  # EndTxn requests held
        self.answers: list[int] = []  # the broker's error code for each one sent late
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        answers = asyncio.ensure_future(_pipe(up_reader, writer))
        held = await self._requests(reader, up_writer)
        if held is None:  # the client hung up: so does the broker's side
            answers.cancel()
            up_writer.transport.abort()
            writer.transport.abort()
            return
        answers.cancel()  # no answer reaches the client on this connection any more
        task = asyncio.ensure_future(self._late(held, up_reader, up_writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        with contextlib.suppress(Exception):
            while await reader.read(65536):  # until the client gives up on the connection
                pass
        writer.transport.abort()

    async def _requests(self, reader: asyncio.StreamReader,
                        up_writer: asyncio.StreamWriter) -> bytes | None:
        """Relay the client's requests, frame by frame, until one is held (returned)."""
        try:
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", size)[0])
                (api_key,) = struct.unpack_from(">h", body)
                if self.armed and api_key == END_TXN:
                    self.armed = False
                    self.held += 1
                    return size + body
                up_writer.write(size + body)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            return None

    async def _late(self, request: bytes, up_reader: asyncio.StreamReader,
                    up_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.delay)
        try:
            up_writer.write(request)
            await up_writer.drain()
            size = struct.unpack(">i", await up_reader.readexactly(4))[0]
            answer = await up_reader.readexactly(size)
            version = struct.unpack_from(">h", request, 6)[0]
            # correlation id, a tagged-fields byte in flexible versions (3+), throttle time
            at = 4 + (1 if version >= 3 else 0) + 4
            self.answers.append(struct.unpack_from(">h", answer, at)[0])
        finally:
            up_writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
