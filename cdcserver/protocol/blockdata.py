"""A block's decompressed data, read where it lies (:mod:`cdcserver.protocol.bigjson`): the
version file itself for the ``null`` codec, a temporary file the block is decompressed into for
the others (deflate as a stream, snappy and zstandard whole, then released); and what a
block's compressed head tells of its decompressed size.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib
from collections.abc import Iterator
from typing import Any

from cdcserver.store.avrofile import Block
from cdcserver.store.catalog import VersionInfo

_INFLATE_PIECE = 64 << 10  # bytes of a deflate stream read, and inflated, at a time
LARGE_BLOCK = 1 << 20  # decompressed bytes past which a block is not held whole


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


# -- rendering and sending -----------------------------------------------------------------


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
            chunk = os.pread(fd, min(_INFLATE_PIECE, end - pos), pos)
            pos += len(chunk)
            data = inflater.decompress(chunk, _INFLATE_PIECE)
            while True:
                out.write(data)
                size += len(data)
                if not inflater.unconsumed_tail:
                    break
                data = inflater.decompress(inflater.unconsumed_tail, _INFLATE_PIECE)
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
