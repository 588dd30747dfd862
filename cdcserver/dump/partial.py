"""A dump being written: ``<stem>.partial`` and its progress record ``<stem>.progress``.

The file starts with a reserved header line (spaces, then a newline) long enough for the final
header; the body (the row operations) follows. After each chunk the body is fsynced, then the
progress record is replaced atomically (write, fsync, rename): it names how many body bytes are
good, so a resumed dump truncates whatever a crash left after them. When the body is complete
the real header is written into the reserved space (JSON allows the trailing spaces), the file
is fsynced and renamed to its final name, and the directory is fsynced: a dump is either absent
or whole under its final name.

The body goes through a staging area and is written in whole aligned blocks, with O_DIRECT
where the file system takes it (see :class:`PartialDump`): a dump of gigabytes is not copied
into the page cache only to be written back and dropped, and the fsync that makes it durable
has little left to do.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import mmap
import os
import shutil
import threading
from dataclasses import dataclass
from typing import Any

from cdcserver.core.durable import fsync_dir
from cdcserver.core.errors import StoreError
from cdcserver.core.names import TableName
from cdcserver.store.naming import dump_stem

HEADER_SLACK = 4096
WRITE_BEHIND = 8 << 20  # buffered writes: bytes between starts of their writeback to disk
ALIGN = 4096  # direct writes: their offsets, lengths and memory are multiples of this
STAGE = 4 << 20  # the staging area: bytes written to the file at a time
DIRECT_WRITES = True  # O_DIRECT where the file system takes it (tests turn it off)


@dataclass
class Progress:
    """What a crash must not lose: which snapshot the rows so far come from, the last key
    written, and how much of the body is good."""

    table: TableName
    snapshot: dict[str, Any]  # SnapshotPoint.to_json() of the snapshot the dump is now at
    fields: str  # fingerprint of the columns (a resumed dump needs the same)
    stream_version: int
    reserved: int  # bytes reserved for the header line
    key: list[str] | None = None  # hex of the last key written; None before the first chunk
    rows: int = 0
    body: int = 0  # good bytes after the header
    resumed: bool = False
    consistent: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"database": self.table.database, "table": self.table.table,
                "snapshot": self.snapshot, "fields": self.fields,
                "stream_version": self.stream_version, "reserved": self.reserved,
                "key": self.key, "rows": self.rows, "body": self.body, "resumed": self.resumed,
                "consistent": self.consistent}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        return cls(TableName(data["database"], data["table"]), data["snapshot"],
                   data["fields"], int(data["stream_version"]), int(data["reserved"]),
                   data["key"], int(data["rows"]), int(data["body"]), bool(data["resumed"]),
                   bool(data.get("consistent", True)))

    def key_values(self) -> tuple[bytes, ...] | None:
        return None if self.key is None else tuple(bytes.fromhex(v) for v in self.key)


class PartialDump:
    """The body is gathered in an aligned staging area (``STAGE`` bytes of anonymous
    memory) and written from it in whole aligned blocks with ``O_DIRECT`` where the file
    system takes it: no copy into the page cache, no writeback left for the fsync that makes
    the dump durable (where it does not, the same blocks are written through the page cache,
    their writeback started as they are written). Readers encode rows straight into the
    staging area (:meth:`space`, :meth:`wrote`) or hand it bytes (:meth:`write`); either way
    the body is hashed as it comes. What is not a whole block yet (the staging area's tail)
    goes to the file through the page cache when the body is made durable or closed, and is
    written again with its block when that is full."""

    def __init__(self, directory: str, table: TableName) -> None:
        self.directory = directory
        self.table = table
        self.path = os.path.join(directory, f"{dump_stem(table)}.partial")
        self.progress_path = os.path.join(directory, f"{dump_stem(table)}.progress")
        self._fd = -1  # the file, through the page cache (-1: not open)
        self._direct: int | None = None  # the same file with O_DIRECT (None: not taken)
        self._stage: Any = None  # mmap of STAGE bytes: the file from _origin on
        self._origin = 0  # the file offset of _stage[0] (a multiple of ALIGN)
        self._fill = 0  # bytes of _stage in use
        self._hash = hashlib.sha256()
        self.progress: Progress | None = None
        self._written_back = 0  # buffered writes: the file's bytes whose writeback was started

    # -- starting --------------------------------------------------------------------------

    def load_progress(self) -> Progress | None:
        try:
            with open(self.progress_path, encoding="utf-8") as f:
                return Progress.from_json(json.load(f))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError) as exc:
            raise StoreError(f"{self.progress_path} is damaged ({exc}); delete it and the "
                             ".partial file to start the dump over") from exc

    def create(self, progress: Progress) -> None:
        """Start a new body (discarding any earlier attempt)."""
        os.makedirs(self.directory, exist_ok=True)
        self.discard()
        self._open(os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        header = b" " * (progress.reserved - 1) + b"\n"
        _pwrite_all(self._fd, header, 0)
        self._start_at(progress.reserved, header[progress.reserved - progress.reserved % ALIGN:])
        self._hash = hashlib.sha256()
        self._written_back = 0
        self.progress = progress
        self.checkpoint()

    def reopen(self, progress: Progress) -> None:
        """Continue a body after a crash: drop what follows the good bytes, re-hash the rest."""
        self._open(os.O_RDWR)
        end = progress.reserved + progress.body
        os.ftruncate(self._fd, end)
        self._written_back = end
        self._hash = hashlib.sha256()
        offset, remaining = progress.reserved, progress.body
        while remaining:
            data = os.pread(self._fd, min(remaining, 1 << 20), offset)
            if not data:
                raise StoreError(f"{self.path} is shorter than its progress record says")
            self._hash.update(data)
            offset += len(data)
            remaining -= len(data)
        origin = end - end % ALIGN
        self._start_at(end, os.pread(self._fd, end - origin, origin))
        self.progress = progress

    def _open(self, flags: int) -> None:
        self._fd = os.open(self.path, flags | os.O_CLOEXEC, 0o644)
        self._direct = None
        direct = getattr(os, "O_DIRECT", 0)
        if direct and DIRECT_WRITES:
            with contextlib.suppress(OSError):  # e.g. a file system without it
                self._direct = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | direct)
        self._stage = area()

    def _start_at(self, end: int, before: bytes) -> None:
        """The staging area starts at the block holding ``end``: ``before`` is what the file
        holds from that block's start to ``end``."""
        self._origin = end - end % ALIGN
        assert len(before) == end - self._origin
        self._stage[:len(before)] = before
        self._fill = len(before)

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: Any) -> None:
        """Bytes (or any bytes-like object) at the end of the body."""
        assert self.progress is not None
        n = len(data)
        if not n:
            return
        self._hash.update(data)
        self.progress.body += n
        stage, done = self._stage, 0
        with memoryview(data) as view:
            while done < n:
                if self._fill == STAGE:
                    self._flush()
                take = min(STAGE - self._fill, n - done)
                stage[self._fill:self._fill + take] = view[done:done + take]
                self._fill += take
                done += take
        if self._fill == STAGE:
            self._flush()

    def space(self, need: int = 0) -> tuple[Any, int, int] | None:
        """Room to encode into at the end of the body: (a writable buffer, where the room
        starts in it, where it ends), at least ``need`` bytes (None: never that much here);
        :meth:`wrote` then says how much of it was used."""
        if STAGE - self._fill < max(need, 1):
            self._flush()
            if STAGE - self._fill < need:
                return None
        return self._stage, self._fill, STAGE

    def wrote(self, end: int) -> None:
        """The room :meth:`space` gave holds body bytes up to ``end``."""
        assert self.progress is not None and self._fill <= end <= STAGE
        if end == self._fill:
            return
        with memoryview(self._stage) as stage, stage[self._fill:end] as new:
            self._hash.update(new)
        self.progress.body += end - self._fill
        self._fill = end
        if end == STAGE:
            self._flush()

    def _flush(self) -> None:
        """The staging area's whole blocks to the file; the rest moves to its front."""
        whole = self._fill - self._fill % ALIGN
        if not whole:
            return
        with memoryview(self._stage) as stage, stage[:whole] as blocks:
            self._write_blocks(blocks, self._origin)
        rest = self._fill - whole
        if rest:
            self._stage.move(0, whole, rest)
        self._origin += whole
        self._fill = rest

    def _write_blocks(self, blocks: memoryview, offset: int) -> None:
        if self._direct is not None:
            try:
                written = os.pwrite(self._direct, blocks, offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not for this file system after all
                    raise
                written = 0
                os.close(self._direct)
                self._direct = None
            if written == len(blocks):
                return
            blocks, offset = blocks[written:], offset + written  # the rest as below
        _pwrite_all(self._fd, blocks, offset)
        if offset + len(blocks) - self._written_back >= WRITE_BEHIND:
            self._write_behind(offset + len(blocks))

    def _write_tail(self) -> None:
        """What the staging area holds past its whole blocks, to the file (through the page
        cache; its block is written again when full)."""
        self._flush()
        if self._fill:
            with memoryview(self._stage) as stage, stage[:self._fill] as tail:
                _pwrite_all(self._fd, tail, self._origin)

    def _write_behind(self, end: int) -> None:
        """Start writing the body written since the last call to disk, without waiting
        (Linux starts the writeback of a range's dirty pages on POSIX_FADV_DONTNEED, and
        drops only pages already clean): the fsync that makes the dump durable then has
        little left to wait for, instead of the whole body at the end. (Buffered writes
        only: a direct write leaves nothing to write back.)"""
        with contextlib.suppress(OSError, AttributeError):  # not Linux: fsync does it all
            os.posix_fadvise(self._fd, self._written_back, end - self._written_back,
                             os.POSIX_FADV_DONTNEED)
        self._written_back = end

    @property
    def progress_reserved(self) -> int:
        """Where the body starts: the room reserved for the header."""
        assert self.progress is not None
        return self.progress.reserved

    @property
    def size(self) -> int:
        """The file's length so far: the reserved header and the body."""
        assert self.progress is not None
        return self.progress.reserved + self.progress.body

    def sync(self) -> None:
        """Make the body so far durable, without recording it (a caller keeping its own
        record of the body, as a chunked dump does)."""
        self._write_tail()
        os.fsync(self._fd)

    def checkpoint(self) -> None:
        """Make the body so far durable, then record it."""
        assert self.progress is not None
        self.sync()
        temporary = self.progress_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.progress.to_json()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.progress_path)
        fsync_dir(self.directory)

    def finish(self, header: dict[str, Any], name: str) -> str:
        """Write the header, give the file its final name; returns the final path."""
        assert self.progress is not None
        header = {**header, "checksum": "sha256:" + self._hash.hexdigest()}
        line = json.dumps(header, separators=(",", ":")).encode("utf-8")
        final = os.path.join(self.directory, name)
        self._write_tail()
        if len(line) < self.progress.reserved:
            _pwrite_all(self._fd, line + b" " * (self.progress.reserved - 1 - len(line)) +
                        b"\n", 0)
            os.fsync(self._fd)
            self._release()  # (all written)
            os.replace(self.path, final)
        else:
            self._rewrite(line, final)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.progress_path)
        fsync_dir(self.directory)
        return final

    def _rewrite(self, line: bytes, final: str) -> None:
        """The header outgrew its reserved space (a resumed dump's GTID state gained many
        domains): copy the body behind a new header."""
        assert self.progress is not None
        temporary = final + ".tmp"
        self._release()  # (finish wrote it all)
        with open(temporary, "wb") as out, open(self.path, "rb") as body:
            out.write(line + b"\n")
            body.seek(self.progress.reserved)
            shutil.copyfileobj(body, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, final)
        os.unlink(self.path)

    def close(self) -> None:
        """The body so far to the file (not made durable), the file closed."""
        try:
            if self._fd >= 0 and self._stage is not None:
                self._write_tail()
        finally:
            self._release()

    def _release(self) -> None:
        for fd in (self._direct, self._fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._fd, self._direct = -1, None
        if self._stage is not None:
            release(self._stage)
            self._stage = None

    def discard(self) -> None:
        """Remove this table's unfinished attempt, and what a crash in ``finish`` left."""
        self.close()
        leftovers = glob.glob(os.path.join(glob.escape(self.directory),
                                           f"{glob.escape(dump_stem(self.table))}.*.dump.tmp"))
        for path in (self.path, self.progress_path, self.progress_path + ".tmp", *leftovers):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)


# Areas of AREA bytes (staging areas, and the blocks readers encode into before their
# turn) are kept for the next dump, a few: a new one's pages are faulted in and zeroed.
AREA = STAGE
_SPARE_AREAS = 4
_spare: list[Any] = []
_spare_lock = threading.Lock()


def area() -> Any:
    """AREA bytes of anonymous memory (see :func:`anonymous`), a spare one if any."""
    with _spare_lock:
        if _spare:
            return _spare.pop()
    return anonymous(AREA)


def release(used: Any) -> None:
    """An area from :func:`area` no longer used: kept as a spare, or unmapped."""
    with _spare_lock:
        if len(_spare) < _SPARE_AREAS:
            _spare.append(used)
            return
    with contextlib.suppress(BufferError):  # still exported: unmapped when collected
        used.close()


def anonymous(size: int) -> Any:
    """``size`` bytes of anonymous memory, page-aligned (as O_DIRECT needs), in huge pages
    where the kernel gives them on request (fewer page faults)."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    area = mmap.mmap(-1, size, flags=private) if private else mmap.mmap(-1, size)
    with contextlib.suppress(AttributeError, OSError):
        area.madvise(mmap.MADV_HUGEPAGE)
    return area
