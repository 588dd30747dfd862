"""JSON lines of blocks too big to hold per connection: big values go out in pieces.

A stream in JSON mode renders a block whole (:func:`~cdcserver.protocol.render.json_block`): the
block's data and its rendering are in memory until the client has taken them, so a client
that does not read a table of 64 MiB values holds twice that. A block of more than
``LARGE_BLOCK`` decompressed bytes goes through :func:`send_large_block` instead:

- its data is read where it lies: the version file itself for the ``null`` codec, a temporary
  file the block is decompressed into for the others (deflate as a stream, snappy and
  zstandard whole, then released);
- its records are walked there (:class:`_Walker`); runs of ordinary records are rendered
  together, ``RUN_BYTES`` at a time, as ``json_block`` renders them;
- a record with a string or bytes value over ``LARGE_VALUE`` bytes is decoded and rendered
  with each such value replaced by a placeholder, and its line is sent up to each placeholder,
  then the value itself, ``PIECE`` bytes of it at a time, escaped as the renderer escapes it
  (a string's JSON text, a bytes value's hex), then the rest.

So the lines are byte for byte those of ``json_block`` (a test compares them), and a client that
takes nothing holds at most a piece, the small values of one record, and what the socket
buffers, whatever the sizes of the values and of the block.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import os
import secrets
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

import fastavro

from cdcserver.protocol.dialect import JsonStyle, braceless
from cdcserver.protocol.render import (
    compile_block_renderer,
    compile_renderer,
    repair_suffix,
    with_suffix,
)
from cdcserver.store.avrofile import Block
from cdcserver.store.catalog import VersionInfo
from mariadb_cdc_client.format.gtid import unsigned_metadata
from mariadb_cdc_client.format.wire import Dialect

LARGE_BLOCK = 1 << 20  # decompressed bytes past which a block is not held whole
LARGE_VALUE = 64 << 10  # a string or bytes value longer than this is sent in pieces
PIECE = 64 << 10  # bytes of a big value read and sent at a time
RUN_BYTES = 256 << 10  # ordinary records rendered together
_WINDOW = 64 << 10  # bytes the walker reads at a time

Send = Callable[[bytes], Awaitable[None]]
Accepts = Callable[[dict[str, Any]], bool]  # a record the client is sent (its filter)


def large(info: VersionInfo, block: Block, fd: int) -> bool:
    """Whether the block holds more than ``LARGE_BLOCK`` bytes once decompressed."""
    if block.data_size > LARGE_BLOCK:
        return True  # no codec here makes data bigger than it compresses to
    codec = info.header.codec
    if codec == "null":
        return False
    head = os.pread(fd, min(block.data_size, 32), block.data_start)
    if codec == "snappy":
        return _uvarint(head)[0] > LARGE_BLOCK
    if codec == "zstandard":
        content = _zstd_content_size(head)
        if content is not None:
            return content > LARGE_BLOCK
    # deflate, or a zstandard frame that does not say: decompress no more than it takes
    data = os.pread(fd, block.data_size, block.data_start)
    return len(_bounded_decompress(codec, data, LARGE_BLOCK + 1)) > LARGE_BLOCK


# -- where a block's data is read ----------------------------------------------------------


class BlockData:
    """A block's decompressed bytes, read by offset from a descriptor."""

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd, self.start, self.size = fd, start, size

    def read(self, pos: int, n: int) -> bytes:
        n = max(0, min(n, self.size - pos))
        out = os.pread(self.fd, n, self.start + pos)
        while len(out) < n:  # a regular file gives short reads only at its end
            more = os.pread(self.fd, n - len(out), self.start + pos + len(out))
            if not more:
                raise EOFError(f"the block ends {n - len(out)} bytes early")
            out += more
        return out


@contextlib.contextmanager
def block_data(info: VersionInfo, block: Block, fd: int) -> Iterator[BlockData]:
    """The block's data where the walker reads it: the version file (``null`` codec), or a
    temporary file the block is decompressed into (removed when done)."""
    codec = info.header.codec
    if codec == "null":
        yield BlockData(fd, block.data_start, block.data_size)
        return
    with tempfile.TemporaryFile(prefix="cdc-block-") as spill:
        size = _decompress_into(codec, fd, block, spill)
        spill.flush()  # read by descriptor
        yield BlockData(spill.fileno(), 0, size)


def _decompress_into(codec: str, fd: int, block: Block, out: Any) -> int:
    if codec == "deflate":  # raw deflate, as a stream: a piece of it in memory at a time
        inflater = zlib.decompressobj(-15)
        size, pos, end = 0, block.data_start, block.data_start + block.data_size
        while pos < end:
            chunk = os.pread(fd, min(PIECE, end - pos), pos)
            pos += len(chunk)
            data = inflater.decompress(chunk, PIECE)
            while True:
                out.write(data)
                size += len(data)
                if not inflater.unconsumed_tail:
                    break
                data = inflater.decompress(inflater.unconsumed_tail, PIECE)
        tail = inflater.flush()
        out.write(tail)
        return size + len(tail)
    from mariadb_cdc_client.format.avro import decompress

    data = decompress(codec, os.pread(fd, block.data_size, block.data_start))
    out.write(data)
    return len(data)


def _bounded_decompress(codec: str, data: bytes, limit: int) -> bytes:
    if codec == "deflate":
        return zlib.decompressobj(-15).decompress(data, limit)
    from mariadb_cdc_client.format.avro import decompress

    return decompress(codec, data)[:limit]


def _uvarint(data: bytes) -> tuple[int, int]:
    """An unsigned LEB128 varint (snappy's length prefix)."""
    value = shift = 0
    for i, byte in enumerate(data):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    return 0, 0


def _zstd_content_size(head: bytes) -> int | None:
    """The Frame_Content_Size of a zstandard frame's header, when the frame gives it."""
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = head[4]
    fcs_flag, single = descriptor >> 6, (descriptor >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if not width or len(head) < pos + width:
        return None
    size = int.from_bytes(head[pos:pos + width], "little")
    return size + 256 if width == 2 else size


# -- walking the records -------------------------------------------------------------------


@dataclass
class _Big:
    """A value sent in pieces: its field, where its length and its bytes are."""

    kind: str  # "string" or "bytes"
    length_at: int
    start: int
    size: int


@dataclass
class _Record:
    start: int
    end: int = 0
    bigs: list[_Big] = field(default_factory=list)


class _Cursor:
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


class _Walker:
    """Finds each record's extent, and its big values, by the writer's schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
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

    def record(self, cur: _Cursor) -> _Record:
        record = _Record(cur.pos)
        for avro_type in self.fields:
            if isinstance(avro_type, list):
                avro_type = avro_type[cur.long()]
            kind = _plain_text(avro_type)
            if kind is None:
                self._skip(cur, avro_type)
                continue
            length_at = cur.pos
            size = cur.long()
            if size > LARGE_VALUE:
                record.bigs.append(_Big(kind, length_at, cur.pos, size))
            cur.skip(size)
        record.end = cur.pos
        return record

    def _skip(self, cur: _Cursor, avro_type: Any) -> None:
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

    def _skip_blocks(self, cur: _Cursor, avro_type: dict[str, Any], is_map: bool) -> None:
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


# -- rendering and sending -----------------------------------------------------------------


@dataclass
class _Sender:
    info: VersionInfo
    style: JsonStyle
    send: Send
    accepts: Accepts | None
    counted: Callable[[int], None]  # records sent
    suffix: bytes | None = None
    pending: bytearray = field(default_factory=bytearray)

    async def flush(self) -> None:
        if self.pending:
            data = bytes(self.pending)
            self.pending.clear()
            await self.send(data)

    async def add(self, line: bytes) -> None:
        self.pending += line
        if len(self.pending) >= RUN_BYTES:
            await self.flush()


async def send_large_block(info: VersionInfo, block: Block, fd: int, style: JsonStyle,
                           send: Send, counted: Callable[[int], None],
                           accepts: Accepts | None = None) -> None:
    """Send a large block's records as JSON lines, each big value in pieces (see the module's
    description). ``accepts``: the stream's filter (records it refuses are not sent);
    ``counted``: told how many records were sent."""
    schema = json.loads(info.header.schema_json)
    parsed = fastavro.parse_schema(schema)
    walker = _Walker(schema)
    sender = _Sender(info, style, send, accepts, counted,
                     repair_suffix(info, block, style.dialect))
    with block_data(info, block, fd) as data:
        cur = _Cursor(data)
        run: list[_Record] = []
        for _ in range(block.count):
            record = walker.record(cur)
            if not record.bigs:
                run.append(record)
                if record.end - run[0].start >= RUN_BYTES:
                    await _send_run(sender, data, parsed, run)
                    run = []
                continue
            if run:
                await _send_run(sender, data, parsed, run)
                run = []
            await _send_big(sender, data, parsed, record)
        if run:
            await _send_run(sender, data, parsed, run)
        await sender.flush()


async def _send_run(sender: _Sender, data: BlockData, parsed: Any, run: list[_Record]
                    ) -> None:
    """Consecutive records without big values, rendered together (by the C renderer where
    it takes them and every record goes out, as ``json_block`` renders a block)."""
    raw = data.read(run[0].start, run[-1].end - run[0].start)
    info, style = sender.info, sender.style
    if sender.suffix is None and sender.accepts is None:
        renderer = compile_block_renderer(info.header.schema_json, style)
        if renderer is not None:
            lines = renderer.render(raw, len(run))
            if lines is not None:
                await sender.add(lines)
                sender.counted(len(run))
                return
    render = compile_renderer(info.header.schema_json, style)
    stream = io.BytesIO(raw)
    sent = 0
    for _ in run:
        record = unsigned_metadata(_record(fastavro.schemaless_reader(stream, parsed, None)))
        if sender.accepts is not None and not sender.accepts(record):
            continue
        await sender.add(with_suffix(render(record), sender.suffix))
        sent += 1
    sender.counted(sent)


async def _send_big(sender: _Sender, data: BlockData, parsed: Any, record: _Record) -> None:
    """One record with big values: its line around placeholders, the values in pieces."""
    token = "cdcvalue" + secrets.token_hex(16)
    reduced = bytearray()
    at = record.start
    placeholders = []
    for i, big in enumerate(record.bigs):
        reduced += data.read(at, big.length_at - at)
        text = f"{token}x{i}".encode()
        reduced += _avro_long(len(text)) + text
        placeholders.append(b'"' + (text.hex().encode() if big.kind == "bytes" else text)
                            + b'"')
        at = big.start + big.size
    reduced += data.read(at, record.end - at)
    decoded = unsigned_metadata(_record(fastavro.schemaless_reader(io.BytesIO(bytes(reduced)),
                                                                   parsed, None)))
    if sender.accepts is not None and not sender.accepts(decoded):
        return
    line = with_suffix(compile_renderer(sender.info.header.schema_json, sender.style)(decoded),
                       sender.suffix)
    cursor = 0
    for big, placeholder in zip(record.bigs, placeholders, strict=True):
        found = line.find(placeholder, cursor)
        if found < 0:
            raise ValueError("a big value's placeholder is not in its rendered line")
        await sender.add(line[cursor:found] + b'"')
        await sender.flush()
        await _send_value(sender, data, big)
        sender.pending += b'"'
        cursor = found + len(placeholder)
    await sender.add(line[cursor:])
    sender.counted(1)


async def _send_value(sender: _Sender, data: BlockData, big: _Big) -> None:
    """A big value's JSON text without its quotes, ``PIECE`` bytes of it at a time."""
    escape = _escaper(sender.style)
    decoder = codecs.getincrementaldecoder("utf-8")()
    pos, end = big.start, big.start + big.size
    while pos < end:
        piece = _piece(data, pos, min(PIECE, end - pos), big.kind, decoder, escape,
                       final=pos + PIECE >= end)
        pos = min(end, pos + PIECE)
        if piece:
            await sender.send(piece)  # (only the piece is held while the client is slow)


def _piece(data: BlockData, pos: int, size: int, kind: str, decoder: codecs.IncrementalDecoder,
           escape: Callable[[str], str], final: bool) -> bytes:
    """``size`` bytes of a value from ``pos``, as JSON text (a bytes value's hex)."""
    chunk = data.read(pos, size)
    if kind == "bytes":
        return chunk.hex().encode()
    return escape(decoder.decode(chunk, final=final)).encode("utf-8")


def _record(value: Any) -> dict[str, Any]:
    assert isinstance(value, dict), "a version's schema is a record"
    return value


def _escaper(style: JsonStyle) -> Callable[[str], str]:
    """A string's JSON text without its quotes, as the renderer writes it in the dialect."""
    if style.dialect == Dialect.MAXSCALE:
        return lambda text: braceless(json.dumps(text, ensure_ascii=False))[1:-1]
    return lambda text: encode_basestring(text)[1:-1]


def _avro_long(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
