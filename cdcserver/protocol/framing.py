"""Framing: the messages a client sends, cut from its byte stream.

A message is a line, or for MaxScale's clients one write without a newline; either is
bounded by the listener's ``max_line``. Once a client has ended a message with a newline,
every message of its is a line: the rest of a line TCP delivered in parts is waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mariadb_cdc_client.format.wire import Code, ProtocolError

_READ_SIZE = 65536


class MessageReader:
    """Frames messages: ``\\n``-terminated lines (``\\r\\n`` accepted), or the bytes of one
    write when they carry no newline at all (MaxScale's cdc.py and connector never send one).
    With ``incomplete``, such bytes are joined with the next write while it says they are only
    the start of a message (a login sent in two writes, as bborbe's Go client does)."""

    def __init__(self, reader: asyncio.StreamReader, max_line: int) -> None:
        self._reader = reader
        self._max_line = max_line
        self._buffer = bytearray()
        self._ready: list[bytes] = []
        # The client ended a message with a newline: it frames by lines, and a write without
        # one is the start of a line TCP cut (a long line in segments, a command written in
        # parts), not a command of its own (found by splitting lines in the network).
        self._lines = False

    async def next(self, incomplete: Callable[[bytes], bool] | None = None) -> bytes | None:
        """The next message, or None at end of input."""
        while not self._ready:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                if self._buffer:
                    rest, self._buffer = bytes(self._buffer), bytearray()
                    return rest
                return None
            self._buffer += data
            *lines, tail = self._buffer.split(b"\n")
            self._ready.extend(bytes(line.rstrip(b"\r")) for line in lines)
            self._lines = self._lines or bool(lines)
            self._buffer = bytearray(tail)
            if tail and not self._lines and len(data) < _READ_SIZE and not (
                    incomplete is not None and incomplete(bytes(tail))):
                # One write without a newline: a whole MaxScale-style command. (A read that
                # filled the buffer is part of something longer: keep reading.)
                self._ready.append(bytes(tail))
                self._buffer.clear()
            if len(self._buffer) > self._max_line or any(
                    len(m) > self._max_line for m in self._ready):
                raise ProtocolError(Code.LINE_TOO_LONG,
                                    f"a command may be at most {self._max_line} bytes", fatal=True)
        return self._ready.pop(0)
