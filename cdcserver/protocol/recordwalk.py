"""Walking a block's Avro records where they lie (:mod:`cdcserver.protocol.bigjson`), by the
writer's schema and without decoding them: each record's extent, and where its string and bytes
values over a size are, read through a small window of the block's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdcserver.protocol.blockdata import BlockData

_WINDOW = 64 << 10  # bytes the walker reads at a time


@dataclass
class BigValue:
    """A value sent in pieces: its field, where its length and its bytes are."""

    kind: str  # "string" or "bytes"
    length_at: int
    start: int
    size: int


@dataclass
class RecordExtent:
    """Where a record lies in the block, and its big values."""

    start: int
    end: int = 0
    bigs: list[BigValue] = field(default_factory=list)


class BlockCursor:
    """Reads a block's data forwards through a window of ``_WINDOW`` bytes."""

    def __init__(self, data: BlockData) -> None:
        self.data = data
        self.pos = 0
        self._window = b""
        self._at = 0  # the offset the window starts at

    def byte(self) -> int:
        if not self._at <= self.pos < self._at + len(self._window):
            self._window, self._at = self.data.read(self.pos, _WINDOW), self.pos
            if not self._window:
                raise EOFError("the block ends inside a record")
        value = self._window[self.pos - self._at]
        self.pos += 1
        return value

    def long(self) -> int:
        shift = result = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    def skip(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative length in the block")
        self.pos += n


class RecordWalker:
    """Finds each record's extent, and its values over ``large_value`` bytes, by the writer's
    schema."""

    def __init__(self, schema: dict[str, Any], large_value: int) -> None:
        self.large_value = large_value
        self.fields = [f["type"] for f in schema["fields"]]
        self.named: dict[str, Any] = {}
        for avro_type in self.fields:
            self._learn(avro_type)

    def _learn(self, avro_type: Any) -> None:
        if isinstance(avro_type, list):
            for branch in avro_type:
                self._learn(branch)
        elif isinstance(avro_type, dict):
            if avro_type.get("type") in ("record", "enum", "fixed") and "name" in avro_type:
                self.named[avro_type["name"]] = avro_type
            for inner in avro_type.get("fields", ()):
                self._learn(inner["type"])
            for key in ("items", "values"):
                if key in avro_type:
                    self._learn(avro_type[key])

    def record(self, cur: BlockCursor) -> RecordExtent:
        record = RecordExtent(cur.pos)
        for avro_type in self.fields:
            if isinstance(avro_type, list):
                avro_type = avro_type[cur.long()]
            kind = _plain_text(avro_type)
            if kind is None:
                self._skip(cur, avro_type)
                continue
            length_at = cur.pos
            size = cur.long()
            if size > self.large_value:
                record.bigs.append(BigValue(kind, length_at, cur.pos, size))
            cur.skip(size)
        record.end = cur.pos
        return record

    def _skip(self, cur: BlockCursor, avro_type: Any) -> None:
        if isinstance(avro_type, list):
            self._skip(cur, avro_type[cur.long()])
            return
        if isinstance(avro_type, str) and avro_type in self.named:
            avro_type = self.named[avro_type]
        name = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
        if name == "null":
            return
        if name == "boolean":
            cur.skip(1)
        elif name in ("int", "long", "enum"):
            cur.long()
        elif name == "float":
            cur.skip(4)
        elif name == "double":
            cur.skip(8)
        elif name in ("string", "bytes"):
            cur.skip(cur.long())
        elif name == "fixed":
            cur.skip(avro_type["size"])
        elif name == "record":
            for inner in avro_type["fields"]:
                self._skip(cur, inner["type"])
        elif name in ("array", "map"):
            self._skip_blocks(cur, avro_type, name == "map")
        elif isinstance(name, (dict, list)):
            self._skip(cur, name)
        else:
            raise ValueError(f"an Avro type the walker does not know: {name!r}")

    def _skip_blocks(self, cur: BlockCursor, avro_type: dict[str, Any], is_map: bool) -> None:
        while True:
            count = cur.long()
            if count == 0:
                return
            if count < 0:  # the block's size in bytes follows
                cur.long()
                count = -count
            for _ in range(count):
                if is_map:
                    cur.skip(cur.long())
                self._skip(cur, avro_type["values" if is_map else "items"])


def _plain_text(avro_type: Any) -> str | None:
    """``string`` or ``bytes`` for a value rendered as a JSON string of its own (no logical
    type: a decimal, a UUID are short and rendered otherwise)."""
    if avro_type in ("string", "bytes"):
        return str(avro_type)
    if isinstance(avro_type, dict) and avro_type.get("type") in ("string", "bytes") and \
            "logicalType" not in avro_type:
        return str(avro_type["type"])
    return None
