"""The one way the listener writes to a client.

Replies, stream data and dump headers all go through :class:`Outbox`: it refuses to write to a
connection the client has closed (uvloop raises RuntimeError there, not ConnectionError), waits
for the socket to take each write (``drain``), yields the loop after each, and counts the bytes
of streams and dumps in the listener's totals (``cdc_sent_bytes``; replies to commands are not
counted). Two paths that must hand bytes to the kernel themselves report what
they sent with :meth:`Outbox.sent`: ``sendfile(2)`` of stored files, and the shared tails, which
write one rendered commit to many clients' transports (``tail.py``).
"""

from __future__ import annotations

import asyncio
import contextlib

from cdcserver.protocol.tail import Traffic


class Outbox:
    def __init__(self, writer: asyncio.StreamWriter, traffic: Traffic) -> None:
        self.writer = writer
        self.traffic = traffic

    @property
    def transport(self) -> asyncio.WriteTransport:
        return self.writer.transport

    async def send(self, data: bytes, *, counted: bool = True) -> None:
        """Stream data: raises ConnectionResetError once the client has gone."""
        if self.writer.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.writer.write(data)
        if counted:
            self.sent(len(data))
        await self.writer.drain()
        # drain() returns at once below the high-water mark: yield anyway, so a stream
        # sending a whole file does not hold the loop (replication, other clients).
        await asyncio.sleep(0)

    async def reply(self, data: bytes) -> None:
        """A reply to a command: a client that has gone is not an error."""
        with contextlib.suppress(ConnectionError):
            await self.send(data, counted=False)

    def last_words(self, data: bytes) -> None:
        """A final line written without waiting (a refusal, the server stopping)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not self.writer.is_closing():
                self.writer.write(data)

    def sent(self, count: int) -> None:
        self.traffic.bytes_sent += count
