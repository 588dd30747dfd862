"""A little-endian reader over one event's bytes, for the events that are not on the hot path."""

from __future__ import annotations

import struct

from cdcserver.core.errors import UndecodableEvent

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Cursor:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def _need(self, n: int) -> int:
        start = self.pos
        if start + n > self.end:
            raise UndecodableEvent(f"event truncated: needed {n} bytes at offset {start}")
        self.pos = start + n
        return start

    def u8(self) -> int:
        return self.buf[self._need(1)]

    def u16(self) -> int:
        return int(_U16.unpack_from(self.buf, self._need(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self.buf, self._need(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.buf, self._need(8))[0])

    def uint(self, size: int) -> int:
        start = self._need(size)
        return int.from_bytes(self.buf[start : start + size], "little")

    def take(self, n: int) -> bytes:
        start = self._need(n)
        return bytes(self.buf[start : start + n])

    def rest(self) -> bytes:
        return self.take(self.end - self.pos)

    def lenenc(self) -> int:
        """A MySQL length-encoded integer (net_store_length)."""
        first = self.u8()
        if first < 0xFB:
            return first
        if first == 0xFC:
            return self.u16()
        if first == 0xFD:
            return self.uint(3)
        if first == 0xFE:
            return self.u64()
        raise UndecodableEvent(f"invalid length-encoded integer prefix 0x{first:02x}")

    def lenenc_bytes(self) -> bytes:
        return self.take(self.lenenc())
