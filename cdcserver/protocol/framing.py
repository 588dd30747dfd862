"""Framing: the messages a client sends, cut from its byte stream.

A message is a line, or for MaxScale's clients one write without a newline; either is
bounded by the listener's ``max_line``. A client that has ended a command (after its login)
with a newline frames by lines: bytes without a newline are the start of a line TCP cut, and
the rest is waited for, a moment at most (:data:`LINE_REST`), after which they are a command
written without its newline, as a client that mixes the two sends it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mariadb_cdc_client.format.wire import Code, ProtocolError

_READ_SIZE = 65536
LINE_REST = 0.25  # seconds a line client's bytes without a newline wait for the line's rest


class MessageReader:
    """Frames messages: ``\\n``-terminated lines (``\\r\\n`` accepted), or the bytes of one
    write when they carry no newline at all (MaxScale's cdc.py and connector never send one).
    With ``incomplete`` (the login), such bytes are joined with the next write while it says
    they are only the start of a message (a login sent in two writes, as bborbe's Go client
    does)."""

    def __init__(self, reader: asyncio.StreamReader, max_line: int) -> None:
        self._reader = reader
        self._max_line = max_line
        self._buffer = bytearray()
        self._ready: list[bytes] = []
        # A command after the login ended with a newline: the client frames by lines, and
        # TCP may cut a line (a GTID state of many domains in several segments, found by
        # attack: each part was taken for a command of its own)
        self._lines = False
        # The last read filled the buffer without a newline: more of that write may follow,
        # or it was a command of exactly _READ_SIZE bytes (max_line's default), which must not
        # wait for the idle timeout for its answer
        self._full = False

    async def next(self, incomplete: Callable[[bytes], bool] | None = None) -> bytes | None:
        """The next message, or None at end of input."""
        while not self._ready:
            data = await self._read()
            if data is None:  # the rest of a line did not come: a command without newline
                rest, self._buffer = bytes(self._buffer), bytearray()
                return rest
            if not data:
                if self._buffer:
                    rest, self._buffer = bytes(self._buffer), bytearray()
                    return rest
                return None
            self._buffer += data
            *lines, tail = self._buffer.split(b"\n")
            self._ready.extend(bytes(line.rstrip(b"\r")) for line in lines)
            if incomplete is None and lines:
                self._lines = True
            self._buffer = bytearray(tail)
            self._full = len(data) == _READ_SIZE and b"\n" not in data
            if tail and not self._lines and not self._full and b"\n" not in data \
                    and not (incomplete is not None and not lines and incomplete(bytes(tail))):
                # One write without a newline: a whole MaxScale-style command. (A read that
                # filled the buffer is part of something longer: keep reading.)
                self._ready.append(bytes(tail))
                self._buffer.clear()
            if len(self._buffer) > self._max_line or any(
                    len(m) > self._max_line for m in self._ready):
                raise ProtocolError(Code.LINE_TOO_LONG,
                                    f"a command may be at most {self._max_line} bytes", fatal=True)
        return self._ready.pop(0)

    async def _read(self) -> bytes | None:
        """The next bytes; None when a line client's line, or a write that filled the last
        read, stays without its rest for :data:`LINE_REST` seconds."""
        if not ((self._lines or self._full) and self._buffer):
            return await self._reader.read(_READ_SIZE)
        try:
            async with asyncio.timeout(LINE_REST):
                return await self._reader.read(_READ_SIZE)
        except TimeoutError:
            return None
