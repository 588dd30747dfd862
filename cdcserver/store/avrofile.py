"""Avro object container files, written block by block and read back as whole blocks.

Format (Avro 1.11 "Object Container Files"): ``Obj\\x01``, a metadata map (``avro.schema``,
``avro.codec``), a 16-byte sync marker; then blocks of ``long count, long size, data, sync``.
A block is the unit of visibility: a transaction's rows for a table become one block (or
several, for a big one) and readers stop at the last committed block. MaxScale's AVRO mode
sends the header once per version and then blocks verbatim, which is why the writer never
re-encodes or merges blocks after writing them.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from cdcserver.core.durable import write_all
from cdcserver.core.errors import StoreError
from cdcserver.store import transcoder
from cdcserver.store.encoder import varint
from cdcserver.store.transcoder import _transcode
from mariadb_cdc_client.format.avro import (
    MAGIC,
    SYNC_SIZE,
    AvroFormatError,
    Header,
    container_header,
    decompress,
    parse_header,
    read_varint,
)

__all__ = ["MAGIC", "SYNC_SIZE", "Header", "container_header", "decompress", "parse_header",
           "read_varint"]

CODECS = ("null", "deflate", "snappy", "zstandard")


def compress(codec: str, data: bytes | bytearray) -> bytes:
    if codec == "null":
        return bytes(data)
    if codec == "deflate":
        packer = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, as Avro requires
        return packer.compress(data) + packer.flush()
    import cramjam

    if codec == "snappy":  # raw snappy followed by the CRC32 of the uncompressed data
        return bytes(cramjam.snappy.compress_raw(bytes(data))) + \
            (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")
    if codec == "zstandard":
        return bytes(cramjam.zstd.compress(bytes(data)))
    raise StoreError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")


def read_header(path: str) -> Header:
    with open(path, "rb") as f:
        data = f.read(1 << 12)  # a header is its schema and 40 bytes: most fit in a page
        while True:
            try:
                return parse_header(data)
            except AvroFormatError as exc:
                raise StoreError(f"{path}: {exc}") from exc
            except IndexError:
                more = f.read(max(len(data), 1 << 16))
                if not more:
                    raise StoreError(f"{path}: truncated Avro header") from None
                data += more


@dataclass(frozen=True, slots=True)
class Block:
    offset: int  # where the block starts in the file
    count: int  # records
    data_start: int  # offset of the (possibly compressed) data
    data_size: int
    end: int  # offset after the sync marker


_BLOCK_HEAD = 20  # a block's count and size: two varints of at most ten bytes


def scan_blocks(path: str, header: Header, start: int, end: int, fd: int | None = None
                ) -> Iterator[Block]:
    """The whole blocks between ``start`` and ``end`` (a committed size). A block that does not
    end with the file's sync marker means corruption and raises StoreError. One pread per
    block: its sync marker with the next block's header. ``fd``: the file already open (a
    stream's shared descriptor: a scan that waits between blocks then holds none of its
    own)."""
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        head = os.pread(fd, _BLOCK_HEAD, pos)
        while pos < end:
            count, after_count = read_varint(head, 0)
            size, data_start = read_varint(head, after_count)
            block_end = pos + data_start + size + SYNC_SIZE
            if count < 0 or size < 0 or block_end > end:
                raise StoreError(f"{path}: malformed block at offset {pos}")
            tail = os.pread(fd, SYNC_SIZE + _BLOCK_HEAD, block_end - SYNC_SIZE)
            if tail[:SYNC_SIZE] != header.sync:
                raise StoreError(f"{path}: sync marker mismatch after the block at {pos}")
            yield Block(pos, count, pos + data_start, size, block_end)
            pos, head = block_end, tail[SYNC_SIZE:]
    finally:
        if own:
            os.close(fd)


def last_valid_end(path: str, header: Header, limit: int) -> int:
    """The end of the last complete block at or before ``limit``: where a torn tail is cut."""
    end = header.size
    try:
        for block in scan_blocks(path, header, header.size, limit):
            end = block.end
    except (StoreError, IndexError, ValueError):
        pass  # everything from the first bad block on is the torn tail
    return end


class OpenFiles:
    """At most ``limit`` writers hold their file open: using one makes it the most recent,
    and opening one past the limit parks (closes) the least recently used, which reopen
    when they next write. The data directory's descriptors then stay bounded however many
    tables are written, as a process's limit (often 1024) needs."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        self._open: OrderedDict[int, VersionFileWriter] = OrderedDict()
        self.dirty: set[VersionFileWriter] = set()  # written since their last fsync

    def __len__(self) -> int:
        return len(self._open)

    def used(self, writer: VersionFileWriter) -> None:
        key = id(writer)
        if key in self._open:
            self._open.move_to_end(key)
            return
        self._open[key] = writer
        excess = len(self._open) - self.limit
        parked: list[int] = []
        for key, oldest in self._open.items():  # the least recently used first
            if len(parked) >= excess or oldest is writer:
                break
            if oldest.park(wait=False):  # one being fsynced stays open for now
                parked.append(key)
        for key in parked:
            del self._open[key]

    def closed(self, writer: VersionFileWriter) -> None:
        self._open.pop(id(writer), None)
        self.dirty.discard(writer)


class VersionFileWriter:
    """Appends blocks to one table version's container file.

    ``size`` counts bytes written; ``committed`` is what readers may see. A block is written
    with one ``write`` call; ``rollback`` cuts the file back to the committed size. With
    ``files`` (an :class:`OpenFiles`), the file may be parked (closed) between writes, dirty
    or not; it reopens to write, and an fsync of a parked file opens it for the fsync (which
    makes the file's data durable whichever descriptor wrote it).
    """

    def __init__(self, path: str, header: Header, fd: int, size: int,
                 files: OpenFiles | None = None) -> None:
        self.path = path
        self.header = header
        self.fd = fd
        self.size = size
        self.committed = size
        self.buffer = bytearray()
        self.count = 0
        self.files = files
        self._dirty = False
        self._lock = threading.Lock()  # the flush's fsync (a thread) against parking
        if files is not None and fd >= 0:
            files.used(self)

    @classmethod
    def create(cls, path: str, schema_json: str, codec: str,
               files: OpenFiles | None = None) -> VersionFileWriter:
        header_bytes = container_header(schema_json, codec, os.urandom(SYNC_SIZE))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        try:
            _write_all(fd, header_bytes)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        writer = cls(path, parse_header(header_bytes), fd, len(header_bytes), files)
        writer.dirty = True
        return writer

    @classmethod
    def known(cls, path: str, header: Header, size: int, files: OpenFiles
              ) -> VersionFileWriter:
        """A writer for a file whose header and committed size the catalog holds: nothing is
        read, and the file is opened at the first write (with thousands of tables, most
        commits after a start are some table's first)."""
        return cls(path, header, -1, size, files)

    @property
    def dirty(self) -> bool:
        """Written since the last fsync (the writers' :class:`OpenFiles` lists the dirty
        ones, so that a checkpoint visits those, not every table's)."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if self.files is not None:
            if value:
                self.files.dirty.add(self)
            else:
                self.files.dirty.discard(self)

    def _descriptor(self) -> int:
        """The open file, reopened if it was parked."""
        if self.fd < 0:
            with self._lock:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if self.files is not None:
            self.files.used(self)
        return self.fd

    def end_block(self) -> None:
        if not self.count:
            return
        data = compress(self.header.codec, self.buffer)
        block = varint(self.count) + varint(len(data)) + data + self.header.sync
        fd = self._descriptor()
        try:
            _write_all(fd, block)
        except OSError:
            os.ftruncate(fd, self.size)  # no partial block may stay (disk full)
            raise
        self.size += len(block)
        self.buffer.clear()
        self.count = 0
        self.dirty = True

    def commit(self) -> None:
        self.end_block()
        self.committed = self.size

    def rollback(self) -> None:
        self.buffer.clear()
        self.count = 0
        if self.size != self.committed or os.stat(self.path).st_size != self.committed:
            os.ftruncate(self._descriptor(), self.committed)
            self.size = self.committed

    def fsync(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.fsync(self.fd)
                return
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except FileNotFoundError:  # its version was deleted (a rolled-back creation)
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def park(self, wait: bool = True) -> bool:
        """Close the file until the next write (its data stays; an fsync reopens it).
        Without ``wait``, not while an fsync holds it (False)."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        finally:
            self._lock.release()
        return True

    def close(self) -> None:
        self.park()
        if self.files is not None:
            self.files.closed(self)


# Holding the GIL through the write where the extension is built (transcoder.py); the
# Python loop releases it in each os.write.
_write_all = _transcode.write_all if transcoder.available() else write_all
