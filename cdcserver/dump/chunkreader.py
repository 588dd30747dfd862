"""A chunked dump's reading (:mod:`cdcserver.dump.chunked`, steps 1 to 3): the key space
split into ranges, readers taking them in turn, each range read in chunks of short consistent
reads, and its rows written to the body in key order."""

from __future__ import annotations

import base64
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.names import TableName
from cdcserver.dump import rawrows
from cdcserver.dump.chunks import (
    Chunk,
    ChunkedProgress,
    KeyRange,
    NotChunkable,
    Progressed,
    Table,
    TableChanged,
    save,
    show_create,
)
from cdcserver.dump.partial import PartialDump
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    ER_TABLE_DEF_CHANGED,
    open_snapshot_position,
    prepare_session,
    qualified,
)
from cdcserver.replication import source as source_sql

log = logging.getLogger(__name__)


# -- ranges ------------------------------------------------------------------------------

_INTEGER_KEYS = ("tinyint", "smallint", "mediumint", "int", "bigint", "serial")
_MOST_RANGES = 100_000


def split(conn: Any, plan: ScanPlan, table: TableName, readers: int,
           chunk_rows: int) -> list[KeyRange]:
    """The key space in ranges, in key order: an integer key in ranges of about half
    ``chunk_rows`` rows each (arithmetically, from its span and the table's estimated
    rows), which the readers take in turn; any other key in one range per reader, split at
    sampled keys (``LIMIT 1 OFFSET n`` on the key)."""
    estimate = source_sql.estimated_rows(conn, table.database, table.table)
    key = plan.key
    cuts: list[list[bytes]] = []
    if len(key) == 1 and key[0].sql_type in _INTEGER_KEYS:
        column = f"`{key[0].name.replace('`', '``')}`"
        low, high = source_sql.query(conn, f"SELECT MIN({column}), MAX({column}) FROM "
                                           f"{qualified(table)}")[0]
        if low is not None:
            low, high = int(low), int(high)
            # about half a chunk's rows each, so that one query usually reads a range
            count = min(max(readers, -(-estimate * 2 // chunk_rows)), _MOST_RANGES,
                        max(high - low, 1))
            step = max((high - low) // count, 1)
            cuts = [[str(low + step * i).encode()] for i in range(1, count)]
    elif readers > 1 and estimate >= readers * 2:
        for i in range(1, readers):
            found = [row for batch in rawrows.query_rows(conn, plan.key_sql(
                estimate * i // readers)) for row in batch]
            if found:
                cuts.append([base64.b64decode(v) for v in found[0][2:-2].split(b'","')])
    hexed = [[v.hex() for v in cut] for cut in cuts]
    hexed = [h for i, h in enumerate(hexed) if i == 0 or h != hexed[i - 1]]
    edges: list[list[str] | None] = [None, *hexed, None]
    return [KeyRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _values(hexed: list[str] | None) -> tuple[bytes, ...] | None:
    return None if hexed is None else tuple(bytes.fromhex(v) for v in hexed)


# -- reading -----------------------------------------------------------------------------

class _Failed(Exception):
    """Another reader failed: this one stops too."""


@dataclass
class _Done:
    """A range read before its turn: its buffer and chunks, appended when its turn comes."""

    buffer: _Buffer
    held: list[Chunk]
    after: list[str] | None


@dataclass
class Run:
    """One attempt's shared state. The ranges are appended to the body in key order: the
    reader of the first range not done (the *turn*) writes straight into it; the others
    keep what they read in a buffer (memory, then a temporary file) until their turn. A
    reader that finishes a range before its turn leaves it in ``waiting`` and goes on to
    the next range: whoever finishes the turn's range appends it. Readers run at most
    ``ahead`` ranges past the turn, which bounds the memory held."""

    address: SourceAddress
    data_dir: str
    directory: str  # the dump directory
    table: Table
    progress: ChunkedProgress
    partial: PartialDump
    chunk_rows: int
    batch_rows: int
    stop: threading.Event | None
    progressed: Progressed | None
    # the turn holder makes the body durable and records its chunks this often: a killed
    # dump loses at most this much reading
    sync_seconds: float = 2.0
    buffer_bytes: int = 64 << 20
    ahead: int = 4
    cond: threading.Condition = field(default_factory=threading.Condition)
    next_range: int = 0  # the next range a reader takes
    failed: bool = False
    rows_read: int = 0
    synced: float = field(default_factory=time.monotonic)
    waiting: dict[int, _Done] = field(default_factory=dict)
    _turn: int = 0

    @property
    def turn(self) -> int:
        """The first range not done (ranges are done in key order, never undone)."""
        ranges = self.progress.ranges
        while self._turn < len(ranges) and ranges[self._turn].done:
            self._turn += 1
        return self._turn

    def take(self) -> int | None:
        """The next range to read, in key order (None: none left, or stopping); waits while
        readers are ``ahead`` ranges past the turn."""
        with self.cond:
            ranges = self.progress.ranges
            while True:
                while self.next_range < len(ranges) and ranges[self.next_range].done:
                    self.next_range += 1
                if self.failed or self.next_range >= len(ranges) or (
                        self.stop is not None and self.stop.is_set()):
                    return None
                if self.next_range - self.turn <= self.ahead:
                    break
                self.cond.wait(0.5)
            self.next_range += 1
            return self.next_range - 1

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def close(self) -> None:
        """Buffers of ranges read and never appended (a failure, a stop) let go."""
        with self.cond:
            for done in self.waiting.values():
                done.buffer.close()
            self.waiting.clear()

    def sync(self) -> None:
        """The body so far durable, then recorded (by the turn holder, or at the end). The
        good body ends with the last recorded chunk: the next turn holder may already be
        writing after it, and a resumed dump cuts that off."""
        self.partial.sync()
        self.progress.body = max((c.end for r in self.progress.ranges for c in r.chunks),
                                 default=self.partial.progress_reserved)
        save(self.directory, self.table.name, self.progress)
        self.synced = time.monotonic()

    def read(self, rows: int) -> None:
        """``rows`` more rows read: the progress reported."""
        with self.cond:
            self.rows_read += rows
            total = self.rows_read
        if self.progressed is not None:
            self.progressed(self.table.name, total)


def reader(run: Run) -> None:
    conn = source_sql.connect(run.address)
    try:
        here = source_sql.server_identity(conn)
        if here != run.progress.server:  # a proxy in front of several servers
            raise NotChunkable(f"a reader's connection reached {here}, not "
                               f"{run.progress.server}: the chunks must come from one server")
        prepare_session(conn, mariadb=True)
        while (index := run.take()) is not None:
            _read_range(run, conn, index)
    except _Failed:
        pass
    except BaseException:
        run.fail()
        raise
    finally:
        conn.close()


def _read_range(run: Run, conn: Any, index: int) -> None:
    """Read one range chunk by chunk, into the body when it is the turn, else into a
    buffer appended when its turn comes; then pass the turn on, or leave the range to
    whoever holds the turn when it comes."""
    rng = run.progress.ranges[index]
    buffer = _Buffer(run.buffer_bytes, run.directory)
    handed = False  # to whoever finishes the range before it
    held: list[Chunk] = []  # read into the buffer: offsets in it
    after = rng.after
    try:
        done = False
        while not done:
            if run.stop is not None and run.stop.is_set():
                return
            if run.failed:
                raise _Failed
            direct = run.turn == index
            if direct and held:
                _append_held(run, rng, buffer, held, after)
                held = []
            chunk, after, done = _read_chunk(run, conn, rng, after,
                                             run.partial if direct else buffer)
            if chunk is None:
                continue
            run.read(chunk.rows)
            if direct:
                _recorded(run, rng, [chunk], after)
            else:
                held.append(chunk)
        with run.cond:
            if run.turn != index:  # appended by whoever finishes the range before it
                run.waiting[index] = _Done(buffer, held, after)
                handed = True
                return
        handed = True
        _finish_range(run, index, buffer, held, after)
    finally:
        if not handed:
            buffer.close()


def _finish_range(run: Run, index: int, buffer: _Buffer, held: list[Chunk],
                  after: list[str] | None) -> None:
    """The turn's range is read: what it holds appended, the range done; then each range
    after it that was read before its turn, in order, the same way."""
    while True:
        rng = run.progress.ranges[index]
        if held:
            _append_held(run, rng, buffer, held, after)
        with run.cond:
            rng.after = after
            rng.done = True
            if time.monotonic() - run.synced >= run.sync_seconds:
                run.sync()
            run.cond.notify_all()
            index = run.turn
            done = run.waiting.pop(index, None)
        buffer.close()
        if done is None:
            return
        buffer, held, after = done.buffer, done.held, done.after


class _Buffer:
    """What a reader reads before its range's turn: the pieces as they came (no copy, no
    reallocation), moved to a temporary file beside the dump past ``limit`` bytes."""

    def __init__(self, limit: int, directory: str) -> None:
        self.limit, self.directory = limit, directory
        self.pieces: list[bytes] = []
        self.size = 0
        self.spill: Any = None

    def tell(self) -> int:
        return self.size

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.spill is not None:
            self.spill.write(data)
            return
        self.pieces.append(data)
        if self.size > self.limit:
            self.spill = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115
            for piece in self.pieces:
                self.spill.write(piece)
            self.pieces = []

    def drain(self, write: Callable[[bytes], None]) -> None:
        """Everything held, in order, to ``write``; the buffer is empty after."""
        if self.spill is not None:
            self.spill.seek(0)
            while data := self.spill.read(1 << 20):
                write(data)
            self.spill.close()
            self.spill = None
        for piece in self.pieces:
            write(piece)
        self.pieces, self.size = [], 0

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
        self.pieces = []


def _append_held(run: Run, rng: KeyRange, buffer: _Buffer, held: list[Chunk],
                 after: list[str] | None) -> None:
    """The turn has come: the chunks read into the buffer go into the body (``after``: the
    key of their last row)."""
    base = run.partial.size
    buffer.drain(run.partial.write)
    _recorded(run, rng, [replace(c, start=base + c.start, end=base + c.end) for c in held],
              after)


def _recorded(run: Run, rng: KeyRange, chunks: list[Chunk], after: list[str] | None
              ) -> None:
    """Chunks now in the body: recorded (made durable at the sync interval)."""
    with run.cond:
        rng.chunks += chunks
        rng.rows += sum(c.rows for c in chunks)
        rng.after = after
        if time.monotonic() - run.synced >= run.sync_seconds:
            run.sync()


def _read_chunk(run: Run, conn: Any, rng: KeyRange, after: list[str] | None, out: Any
                ) -> tuple[Chunk | None, list[str] | None, bool]:
    """One chunk in its own consistent read, then committed (its metadata lock released),
    written to ``out`` (the body or a buffer): the chunk (offsets in ``out``; None if no row
    was left), the last key read, whether the range is done."""
    table = run.table
    file, pos, _ = open_snapshot_position(conn)
    count, last = 0, b""
    start = out.size if out is run.partial else out.tell()
    written = start
    try:
        try:
            source_sql.query(conn, f"SELECT 1 FROM {qualified(table.name)} LIMIT 0")
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code in (ER_TABLE_DEF_CHANGED, ER_NO_SUCH_TABLE):
                raise TableChanged(f"{table.name} changed during its dump") from exc
            raise
        if show_create(conn, table.name) != table.text:
            raise TableChanged(f"{table.name} changed during its dump")
        sql = table.plan.chunk_sql(_values(after if after is not None else rng.lo),
                                   run.chunk_rows, _values(rng.hi))
        for line, rows, final in table.plan.lines(conn, sql, run.batch_rows):
            out.write(line)
            written += len(line)
            count += rows
            last = final
    finally:
        if conn.open:
            source_sql.query(conn, "COMMIT")
    done = count < run.chunk_rows
    if not count:
        return None, after, done
    chunk = Chunk(start, written, count, file, pos)
    return chunk, [v.hex() for v in table.plan.key_of(last)], done
