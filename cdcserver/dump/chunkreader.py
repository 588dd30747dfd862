"""A chunked dump's reading (:mod:`cdcserver.dump.chunked`, steps 1 to 3): the key space
split into ranges, readers taking them in turn, each range read in chunks of short consistent
reads, and its rows written to the body in key order."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.names import TableName
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
from cdcserver.dump.keyranges import key_cuts, key_ranges
from cdcserver.dump.partial import PartialDump
from cdcserver.dump.rangebuffer import Blocks, RangeBuffer
from cdcserver.dump.readerconnections import Connections, reader_connection
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    ER_TABLE_DEF_CHANGED,
    open_snapshot_position,
    qualified,
)
from cdcserver.replication import source as source_sql

log = logging.getLogger(__name__)


# -- ranges ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Split:
    """The key ranges, and the binlog position of the snapshot they were taken in: the
    last range ends at the table's last key there, and every change after it is merged."""

    ranges: list[KeyRange]
    file: str
    pos: int


def split(conn: Any, plan: ScanPlan, table: TableName, readers: int,
          chunk_rows: int) -> Split:
    """The key space in ranges, in key order, in one consistent snapshot: an integer key
    in ranges of about half ``chunk_rows`` rows each, more in a big table
    (:mod:`cdcserver.dump.keyranges`; arithmetically, from its span and the table's estimated rows),
    the last quarter of them a quarter as long, which the readers take in turn; any other
    key in one range per reader, split at sampled keys (``LIMIT 1 OFFSET n`` on the key).
    The last range ends at the last key in the snapshot (an empty table has none): a range
    open at the end would chase rows added there for as long as they came faster than its
    chunks read them, and those come from the changes after the snapshot anyway."""
    file, pos, _ = open_snapshot_position(conn)
    try:
        cuts, last = key_cuts(conn, plan, table, readers, chunk_rows)
    finally:
        source_sql.query(conn, "COMMIT")
    return Split(key_ranges(cuts, last) if last is not None else [], file, pos)


def _values(hexed: list[str] | None) -> tuple[bytes, ...] | None:
    return None if hexed is None else tuple(bytes.fromhex(v) for v in hexed)


# -- reading -----------------------------------------------------------------------------

class _Failed(Exception):
    """Another reader failed: this one stops too."""


@dataclass
class _Done:
    """A range read before its turn: its buffer and chunks, appended when its turn comes."""

    buffer: RangeBuffer
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
    blocks: Blocks = field(default_factory=lambda: Blocks())
    connections: Connections | None = None  # the readers' (None: each opens its own)
    ready: bool = False  # the body can be written (the readers start before it can)
    _turn: int = 0

    @property
    def turn(self) -> int:
        """The first range not done (ranges are done in key order, never undone); -1 until
        the body is ready (:meth:`open`)."""
        if not self.ready:
            return -1
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

    def open(self) -> None:
        """The body is ready: the first range not done has the turn (appended now if it
        was read already)."""
        with self.cond:
            self.ready = True
            index = self.turn
            done = self.waiting.pop(index, None)
            self.cond.notify_all()
        if done is not None:
            _finish_range(self, index, done.buffer, done.held, done.after)

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
        self.blocks.close()

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
    try:
        conn, here = run.connections.take() if run.connections is not None else \
            reader_connection(run.address)
    except BaseException:
        run.fail()
        raise
    try:
        if here != run.progress.server:  # a proxy in front of several servers
            raise NotChunkable(f"a reader's connection reached {here}, not "
                               f"{run.progress.server}: the chunks must come from one server")
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
    """Read one range chunk by chunk, into its buffer until it is the turn, then into the
    body; then pass the turn on, or leave the range to whoever holds the turn when it
    comes."""
    rng = run.progress.ranges[index]
    target = _Target(run, index, RangeBuffer(run.buffer_bytes, run.directory, run.blocks),
                     rng.after)
    handed = False  # to whoever finishes the range before it
    try:
        done = False
        while not done:
            if run.stop is not None and run.stop.is_set():
                return
            if run.failed:
                raise _Failed
            target.take_turn()
            chunk, after, done = _read_chunk(run, conn, rng, target)
            if chunk is None:
                continue
            run.read(chunk.rows)
            target.add(chunk, after)
        with run.cond:
            if run.turn != index:  # appended by whoever finishes the range before it
                run.waiting[index] = _Done(target.buffer, target.held, target.after)
                handed = True
                return
        handed = True
        _finish_range(run, index, target.buffer, target.held, target.after)
    finally:
        if not handed:
            target.buffer.close()


class _Target:
    """Where a reader writes its range (a :class:`rawrows.Sink`): its buffer until the
    range has the turn, then the body. The turn is looked at between the pieces of a chunk
    too: when it comes, what the buffer holds goes into the body first, and the rest of
    the range is written straight there."""

    def __init__(self, run: Run, index: int, buffer: RangeBuffer, after: list[str] | None
                 ) -> None:
        self.run, self.index, self.buffer, self.after = run, index, buffer, after
        self.held: list[Chunk] = []  # read into the buffer: offsets in it
        self.direct = False
        self.out: Any = buffer

    def tell(self) -> int:
        return self.run.partial.size if self.direct else self.buffer.tell()

    def space(self, need: int = 0) -> tuple[Any, int, int] | None:
        room: tuple[Any, int, int] | None = self.out.space(need)
        return room

    def wrote(self, end: int) -> None:
        self.out.wrote(end)

    def write(self, data: bytes) -> None:
        self.out.write(data)

    def take_turn(self) -> int | None:
        """If the range has the turn now, what its buffer holds goes into the body, which
        it writes to from now on: returns the offset the buffer's bytes moved by (None: not
        the turn yet). The turn is looked at under the lock: the reader that passed it on
        is done with the body."""
        if self.direct:
            return None
        with self.run.cond:
            if self.run.turn != self.index:
                return None
        base = self.run.partial.size
        if self.held:
            _append_held(self.run, self.run.progress.ranges[self.index], self.buffer,
                         self.held, self.after)
            self.held = []
        else:
            self.buffer.drain(self.run.partial.write)
        self.direct, self.out = True, self.run.partial
        return base

    def add(self, chunk: Chunk, after: list[str] | None) -> None:
        """A chunk read (``after``: the key of its last row)."""
        if self.direct:
            _recorded(self.run, self.run.progress.ranges[self.index], [chunk], after)
        else:
            self.held.append(chunk)
        self.after = after


def _finish_range(run: Run, index: int, buffer: RangeBuffer, held: list[Chunk],
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


def _append_held(run: Run, rng: KeyRange, buffer: RangeBuffer, held: list[Chunk],
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


def _read_chunk(run: Run, conn: Any, rng: KeyRange, target: _Target
                ) -> tuple[Chunk | None, list[str] | None, bool]:
    """One chunk in its own consistent read, then committed (its metadata lock released),
    written to ``target`` (the body, or the reader's buffer until the turn comes): the chunk
    (offsets where it is now; None if no row was left), the key of its last row, whether the
    range is done."""
    table = run.table
    after = target.after
    file, pos, _ = open_snapshot_position(conn)
    count, last = 0, b""
    start = target.tell()
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
        for rows, final in table.plan.into(conn, sql, run.batch_rows, target):
            count += rows
            last = final
            if not target.direct and (moved := target.take_turn()) is not None:
                start += moved  # the chunk so far went into the body with the buffer
    finally:
        if conn.open:
            source_sql.query(conn, "COMMIT")
    done = count < run.chunk_rows
    if not count:
        return None, after, done
    chunk = Chunk(start, target.tell(), count, file, pos)
    return chunk, [v.hex() for v in table.plan.key_of(last)], done
