"""JSON lines of blocks too big to hold per connection: big values go out in pieces.

A stream in JSON mode renders a block whole (:func:`~cdcserver.protocol.render.json_block`): the
block's data and its rendering are in memory until the client has taken them, so a client
that does not read a table of 64 MiB values holds twice that. A block of more than
``LARGE_BLOCK`` decompressed bytes (:func:`~cdcserver.protocol.blockdata.large`) goes through
:func:`send_large_block` instead:

- its data is read where it lies (:mod:`cdcserver.protocol.blockdata`): the version file itself
  for the ``null`` codec, a temporary file the block is decompressed into for the others
  (deflate as a stream, snappy and zstandard whole, then released);
- its records are walked there (:mod:`cdcserver.protocol.recordwalk`); runs of ordinary
  records are rendered together, ``RUN_BYTES`` at a time, as ``json_block`` renders them;
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
import io
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

import fastavro

from cdcserver.protocol.blockdata import BlockData, block_data
from cdcserver.protocol.dialect import JsonStyle, safe_strings
from cdcserver.protocol.recordwalk import BigValue, BlockCursor, RecordExtent, RecordWalker
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

LARGE_VALUE = 64 << 10  # a string or bytes value longer than this is sent in pieces
PIECE = 64 << 10  # bytes of a big value read and sent at a time
RUN_BYTES = 256 << 10  # ordinary records rendered together

Send = Callable[[bytes], Awaitable[None]]
Accepts = Callable[[dict[str, Any]], bool]  # a record the client is sent (its filter)


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
    schema = json.loads(info.schema_json)
    parsed = fastavro.parse_schema(schema)
    walker = RecordWalker(schema, LARGE_VALUE)
    sender = _Sender(info, style, send, accepts, counted,
                     repair_suffix(info, block, style.dialect))
    with block_data(info, block, fd) as data:
        cur = BlockCursor(data)
        run: list[RecordExtent] = []
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


async def _send_run(sender: _Sender, data: BlockData, parsed: Any, run: list[RecordExtent]
                    ) -> None:
    """Consecutive records without big values, rendered together (by the C renderer where
    it takes them and every record goes out, as ``json_block`` renders a block)."""
    raw = data.read(run[0].start, run[-1].end - run[0].start)
    info, style = sender.info, sender.style
    if sender.suffix is None and sender.accepts is None:
        renderer = compile_block_renderer(info.schema_json, style)
        if renderer is not None:
            lines = renderer.render(raw, len(run))
            if lines is not None:
                await sender.add(lines)
                sender.counted(len(run))
                return
    render = compile_renderer(info.schema_json, style)
    stream = io.BytesIO(raw)
    sent = 0
    for _ in run:
        record = unsigned_metadata(_record(fastavro.schemaless_reader(stream, parsed, None)))
        if sender.accepts is not None and not sender.accepts(record):
            continue
        await sender.add(with_suffix(render(record), sender.suffix))
        sent += 1
    sender.counted(sent)


async def _send_big(sender: _Sender, data: BlockData, parsed: Any, record: RecordExtent) -> None:
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
    line = with_suffix(compile_renderer(sender.info.schema_json, sender.style)(decoded),
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


async def _send_value(sender: _Sender, data: BlockData, big: BigValue) -> None:
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
    """A string given in pieces as JSON text without its quotes, piece by piece, as the
    renderer writes it in the dialect."""
    if style.dialect == Dialect.MAXSCALE:
        return _MaxscaleEscaper()
    return lambda text: encode_basestring(text)[1:-1]


class _MaxscaleEscaper:
    """:func:`maxscale_safe` over pieces: each piece goes on from the characters the one
    before it ended with (an ``er`` there, and this piece's ``r`` is escaped)."""

    def __init__(self) -> None:
        self.recent = ""

    def __call__(self, text: str) -> str:
        body = json.dumps(text, ensure_ascii=False)[1:-1]
        out, self.recent = safe_strings(body, in_string=True, recent=self.recent)
        return out


def _avro_long(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
