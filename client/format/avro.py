"""Reading Avro object container data: the header, varints and block codecs.

Avro 1.11 "Object Container Files": ``Obj\\x01``, a metadata map (``avro.schema``,
``avro.codec``), a 16-byte sync marker, then blocks of ``long count, long size, data, sync``.
Used by the AVRO-mode stream decoder here and by the server's store.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

MAGIC = b"Obj\x01"
SYNC_SIZE = 16


class AvroFormatError(ValueError):
    """The bytes are not a well-formed Avro container stream."""


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at ``pos``; returns (value, next position). Raises IndexError
    when the buffer ends inside it."""
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise IndexError("varint runs past the buffer")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 70:
            raise AvroFormatError("varint too long")


def write_varint(value: int) -> bytes:
    """A zig-zag encoded Avro long."""
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def container_header(schema_json: str, codec: str, sync: bytes) -> bytes:
    """A container file's header: magic, metadata (schema and codec), sync marker."""
    out = bytearray(MAGIC)
    meta = {"avro.schema": schema_json.encode("utf-8"), "avro.codec": codec.encode("ascii")}
    out += write_varint(len(meta))
    for key, value in meta.items():
        out += write_varint(len(key)) + key.encode("ascii")
        out += write_varint(len(value)) + value
    out += write_varint(0)
    return bytes(out + sync)


@dataclass(frozen=True)
class Header:
    schema_json: str
    codec: str
    sync: bytes
    size: int  # bytes up to and including the sync marker


# What a container may claim before a client has read it, so that a claim past them is an
# error at once rather than memory waited for: a header's value (a schema: a table of 4,096
# columns takes about 1 MB), and a block, compressed or not (a row is at most MariaDB's
# max_allowed_packet, 1 GiB).
MAX_HEADER_VALUE = 64 << 20
MAX_BLOCK_BYTES = 2 << 30


def parse_header(data: bytes | bytearray | memoryview) -> Header:
    """Parse a container header from the start of ``data`` (IndexError if it is incomplete)."""
    if bytes(data[:4]) != MAGIC[: len(data[:4])]:
        raise AvroFormatError("not an Avro container (bad magic)")
    if len(data) < 4:
        raise IndexError("header incomplete")
    pos = 4
    meta: dict[str, bytes] = {}
    while True:
        count, pos = read_varint(data, pos)
        if count == 0:
            break
        if count < 0:
            count = -count
            _, pos = read_varint(data, pos)  # block size, unused
        for _ in range(count):
            klen, pos = read_varint(data, pos)
            key = bytes(data[pos : pos + klen]).decode("utf-8")
            pos += klen
            vlen, pos = read_varint(data, pos)
            if not 0 <= vlen <= MAX_HEADER_VALUE or not 0 <= klen <= MAX_HEADER_VALUE:
                raise AvroFormatError(f"a container header claims a value of {vlen} bytes")
            if pos + vlen > len(data):
                raise IndexError("header incomplete")
            meta[key] = bytes(data[pos : pos + vlen])
            pos += vlen
    sync = bytes(data[pos : pos + SYNC_SIZE])
    if len(sync) != SYNC_SIZE:
        raise IndexError("header truncated in the sync marker")
    if "avro.schema" not in meta:
        raise AvroFormatError("container header without avro.schema")
    return Header(meta["avro.schema"].decode("utf-8"), meta.get("avro.codec", b"null").decode(),
                  sync, pos + SYNC_SIZE)


def block_at(buf: bytes | bytearray | memoryview, pos: int, sync: bytes
             ) -> tuple[int, int, int] | None:
    """The container block at ``pos``: (record count, where its data starts, where the block
    ends after its sync marker); None when ``buf`` ends inside it. A malformed block header
    or a wrong sync marker raises AvroFormatError."""
    try:
        count, start = read_varint(buf, pos)
        size, start = read_varint(buf, start)
    except IndexError:
        return None
    if count < 0 or size < 0:
        raise AvroFormatError(f"malformed block header at byte {pos}")
    if size > MAX_BLOCK_BYTES or count > MAX_BLOCK_BYTES:
        raise AvroFormatError(f"a block at byte {pos} claims {size} bytes and {count} records, "
                              f"past the {MAX_BLOCK_BYTES} a client takes")
    end = start + size + SYNC_SIZE
    if end > len(buf):
        return None
    if buf[end - SYNC_SIZE:end] != sync:
        raise AvroFormatError(f"sync marker mismatch after the block at byte {pos}")
    return count, start, end


def decompress(codec: str, data: bytes) -> bytes:
    if codec == "null":
        return data
    if codec == "deflate":  # no bigger than a block may be (a small block can inflate 1000x)
        inflater = zlib.decompressobj(-15)
        plain = inflater.decompress(data, MAX_BLOCK_BYTES)
        if inflater.unconsumed_tail:
            raise AvroFormatError(f"a block inflates past the {MAX_BLOCK_BYTES} bytes a "
                                  "client takes")
        return plain
    import cramjam

    if codec == "snappy":  # raw snappy, then a CRC32 of the uncompressed data
        return bytes(cramjam.snappy.decompress_raw(data[:-4]))
    if codec == "zstandard":
        return bytes(cramjam.zstd.decompress(data))
    raise AvroFormatError(f"unknown Avro codec {codec!r}")
