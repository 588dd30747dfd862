"""Chunked dumps: a table read in short consistent reads, with the changes between them merged
in, so that no lock is held across chunks and a big table is read by several readers at once.

1. The key space is split into ranges in key order: an integer key arithmetically, in ranges
   of about half ``chunk_rows`` rows (from its span and the table's estimated rows), which
   the readers take in turn; any other key in one range per reader, at sampled keys (the key
   ``n`` rows in, ``LIMIT 1 OFFSET n``).
2. A reader reads its range in chunks of at most ``chunk_rows`` rows, each chunk its own
   transaction: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` gives the binlog position its
   read view is at (taken under the binlog's commit lock: an exact low watermark, nothing is
   written to the source), the table's definition is checked under its metadata lock, the
   chunk is read in key order, and ``COMMIT`` releases the lock: an ``ALTER TABLE`` waits for
   one chunk's read at most.
3. The ranges go into the dump's body in key order, each as it is read when its turn has come
   (the first range not finished), else into a buffer (memory, then a temporary file) until
   it does: the body is written once, with no copy in the usual case. A reader that
   finishes a range before its turn leaves it to be appended and reads the next one. The
   body is made durable and its chunks recorded in ``<stem>.chunked`` every
   ``sync_seconds``; a killed dump continues after its last recorded chunk.
4. When every range is read, the dump's point is the store's checkpoint once it has caught
   up with the source (so that it is not between a change without binlog rows and its
   repair), and the table's changes since the first chunk are taken from the store
   (:func:`cdcserver.dump.fixups.records_between`), each with where its transaction ends in
   the binlog (the store's transaction log, read back to the first chunk). A key's last
   change wins over the row a chunk read before it; a key no chunk read exists if its last
   change left it. If any change came, the body is written again with those rows
   replaced, dropped or added. The result holds only ``insert`` lines: the table at the
   dump's point, as a single-snapshot dump would.

If the table's definition changes during the dump (a chunk finds another ``SHOW CREATE
TABLE``, or the store holds a schema change between the chunks), the table's dump starts over
in the new definition. The merge needs the service to be replicating into the same data
directory: without it, on MySQL, or for a table whose key cannot be ranged over (see
:mod:`cdcserver.dump.scan`), the dump is read in one snapshot instead (:class:`NotChunkable`
says why).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.gtid import GtidState, binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.dump import files, fixups, rawrows
from cdcserver.dump.options import DumpOptions
from cdcserver.dump.partial import HEADER_SLACK, PartialDump, Progress
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    ER_TABLE_DEF_CHANGED,
    SnapshotPoint,
    open_snapshot_position,
    prepare_session,
    qualified,
)
from cdcserver.replication import source as source_sql
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.history import TRANSACTIONAL_ENGINES, layout_of
from cdcserver.store import checkpoint as ckpt
from cdcserver.store import index as store_index
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import dump_stem
from cdcserver.store.reader import wait_for_checkpoint
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.dump import FORMAT, operation_line

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # a table whose definition keeps changing under its dump: given up after this


class NotChunkable(CdcError):
    """This table is read in one snapshot instead; the message says why."""


class TableChanged(SourceError):
    """The table's definition changed during its dump: it starts over."""


@dataclass
class Chunk:
    start: int  # its bytes in the dump's body (offsets in the .partial file)
    end: int
    rows: int
    file: str  # the binlog position its read view was at: it holds every transaction that
    pos: int   # ends there or before


@dataclass
class KeyRange:
    lo: list[str] | None  # hex of the key values after which the range starts (None: first)
    hi: list[str] | None  # ... and of the last key it holds (None: to the table's end)
    after: list[str] | None = None  # the last key recorded
    rows: int = 0
    done: bool = False
    chunks: list[Chunk] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyRange:
        chunks = [Chunk(**c) for c in data.pop("chunks")]
        return cls(**data, chunks=chunks)


@dataclass
class ChunkedProgress:
    """What a killed dump continues from: the ranges in key order, those done and the
    chunks recorded of the one being appended; ``body``: the durable end of the body."""

    definition: str  # the SHOW CREATE TABLE the chunks were read with (normalised)
    fields: str  # fingerprint of the columns
    stream_version: int
    consistent: bool
    ranges: list[KeyRange]
    body: int = 0  # bytes of the .partial file that are good (reserved header included)
    resumed: bool = False
    # the source's GTID state before the first chunk (every transaction it covers is in
    # every chunk), and the server the chunks are read from (server_id@host:port)
    floor: str = ""
    server: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkedProgress:
        return cls(data["definition"], data["fields"], int(data["stream_version"]),
                   bool(data["consistent"]), [KeyRange.from_json(r) for r in data["ranges"]],
                   int(data["body"]), bool(data.get("resumed", False)),
                   str(data.get("floor", "")), str(data.get("server", "")))


Progressed = Callable[[TableName, int], None]


# -- files -------------------------------------------------------------------------------

def _progress_path(directory: str, table: TableName) -> str:
    return os.path.join(directory, f"{dump_stem(table)}.chunked")


def _body_path(directory: str, table: TableName) -> str:
    """The body read, renamed here while the changes made meanwhile are merged into a new
    .partial."""
    return os.path.join(directory, f"{dump_stem(table)}.body")


def discard(directory: str, table: TableName) -> None:
    """Remove a table's unfinished chunked dump (its record and body; a single-snapshot
    attempt's .partial stays)."""
    if os.path.exists(_progress_path(directory, table)):
        PartialDump(directory, table).discard()
    for path in (_progress_path(directory, table), _progress_path(directory, table) + ".tmp",
                 _body_path(directory, table)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _load(directory: str, table: TableName) -> ChunkedProgress | None:
    try:
        with open(_progress_path(directory, table), encoding="utf-8") as f:
            return ChunkedProgress.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("dump of %s: its chunk record is damaged (%s); starting over", table, exc)
        return None


def _save(directory: str, table: TableName, progress: ChunkedProgress) -> None:
    path = _progress_path(directory, table)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(progress.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


# -- the table ---------------------------------------------------------------------------

_AUTO_INCREMENT = re.compile(r" AUTO_INCREMENT=\d+")


def _show_create(conn: Any, table: TableName) -> str:
    """SHOW CREATE TABLE without its AUTO_INCREMENT counter (which inserts move)."""
    try:
        text = str(source_sql.query(conn, f"SHOW CREATE TABLE {qualified(table)}")[0][1])
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else 0
        if code == ER_NO_SUCH_TABLE:
            raise SourceError(f"no table {table} on the source") from exc
        raise SourceError(f"cannot read the definition of {table}: {exc}") from exc
    return _AUTO_INCREMENT.sub("", text)


@dataclass
class _Table:
    """What every chunk of one attempt is read with."""

    name: TableName
    text: str  # normalised SHOW CREATE TABLE
    definition: TableDefinition
    schema: TableSchema
    plan: ScanPlan
    fields: list[dict[str, Any]]
    fingerprint: str
    consistent: bool


def _describe(conn: Any, table: TableName, stream_version: int) -> _Table:
    text = _show_create(conn, table)
    statement = ddl.parse(text, table.database)
    if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
        raise NotChunkable(f"cannot parse the definition of {table}")
    definition = statement.definition
    schema = TableSchema.from_layout(layout_of(table, definition), max(stream_version, 1), "")
    plan = ScanPlan(table, definition, schema.columns)
    if not plan.chunked:
        raise NotChunkable(f"{table} has no primary key that can be read in ranges")
    fields = schema.avsc["fields"][6:]
    fingerprint = hashlib.sha256(json.dumps([fields, schema.avsc.get("primary_key")],
                                            sort_keys=True).encode()).hexdigest()
    return _Table(table, text, definition, schema, plan, fields, fingerprint,
                  (definition.engine or "innodb") in TRANSACTIONAL_ENGINES)


def _check_store(conn: Any, data_dir: str) -> str:
    """The merge takes the changes between chunks from the store: the service must be
    replicating into ``data_dir`` (it holds the store's writer lock; the merge waits for it
    to reach the dump's point), from the server the dump reads (binlog positions are
    compared with the store's, which only holds on one server). Returns which server it is."""
    if not _service_running(data_dir):
        raise NotChunkable(f"the service is not replicating into {data_dir}")
    if ckpt.load(DataDir(data_dir).checkpoint) is None:
        raise NotChunkable(f"the service has stored nothing in {data_dir} yet")
    reading = _service_source(data_dir)
    here = source_sql.server_identity(conn)
    if reading is None or reading[1] != here:
        raise NotChunkable(
            "the service reads another server" + (f" ({reading[0]}, {reading[1]})"
                                                  if reading else "") +
            f" than this dump ({here}): binlog positions of two servers cannot be compared")
    return here


def _service_source(data_dir: str) -> tuple[str, str] | None:
    """The server the service reads (as it recorded when it connected), if it said."""
    try:
        with open(DataDir(data_dir).source, encoding="utf-8") as f:
            record = json.load(f)
        return str(record["source"]), str(record["server"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _service_running(data_dir: str) -> bool:
    """Whether a process holds the store's writer lock: a shared lock cannot be had then.
    (Had, it is let go at once; a service starting in that instant waits for it: see
    Store._lock_directory.)"""
    try:
        fd = os.open(DataDir(data_dir).writer_lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the lock
    return False


# -- ranges ------------------------------------------------------------------------------

_INTEGER_KEYS = ("tinyint", "smallint", "mediumint", "int", "bigint", "serial")
_MOST_RANGES = 100_000


def _split(conn: Any, plan: ScanPlan, table: TableName, readers: int,
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
class _Run:
    """One attempt's shared state. The ranges are appended to the body in key order: the
    reader of the first range not done (the *turn*) writes straight into it; the others
    keep what they read in a buffer (memory, then a temporary file) until their turn. A
    reader that finishes a range before its turn leaves it in ``waiting`` and goes on to
    the next range: whoever finishes the turn's range appends it. Readers run at most
    ``ahead`` ranges past the turn, which bounds the memory held."""

    address: SourceAddress
    data_dir: str
    directory: str  # the dump directory
    table: _Table
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
        _save(self.directory, self.table.name, self.progress)
        self.synced = time.monotonic()

    def read(self, rows: int) -> None:
        """``rows`` more rows read: the progress reported."""
        with self.cond:
            self.rows_read += rows
            total = self.rows_read
        if self.progressed is not None:
            self.progressed(self.table.name, total)


def _reader(run: _Run) -> None:
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


def _read_range(run: _Run, conn: Any, index: int) -> None:
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


def _finish_range(run: _Run, index: int, buffer: _Buffer, held: list[Chunk],
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


def _append_held(run: _Run, rng: KeyRange, buffer: _Buffer, held: list[Chunk],
                 after: list[str] | None) -> None:
    """The turn has come: the chunks read into the buffer go into the body (``after``: the
    key of their last row)."""
    base = run.partial.size
    buffer.drain(run.partial.write)
    _recorded(run, rng, [replace(c, start=base + c.start, end=base + c.end) for c in held],
              after)


def _recorded(run: _Run, rng: KeyRange, chunks: list[Chunk], after: list[str] | None
              ) -> None:
    """Chunks now in the body: recorded (made durable at the sync interval)."""
    with run.cond:
        rng.chunks += chunks
        rng.rows += sum(c.rows for c in chunks)
        rng.after = after
        if time.monotonic() - run.synced >= run.sync_seconds:
            run.sync()


def _read_chunk(run: _Run, conn: Any, rng: KeyRange, after: list[str] | None, out: Any
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
        if _show_create(conn, table.name) != table.text:
            raise TableChanged(f"{table.name} changed during its dump")
        sql = table.plan.chunk_sql(_values(after if after is not None else rng.lo),
                                   run.chunk_rows, _values(rng.hi))
        for line, rows, final in rawrows.query_lines(conn, sql, run.batch_rows):
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


# -- merging -----------------------------------------------------------------------------

Position = tuple[int, int]  # binlog_ordinal(file, pos)
Overlay = dict[tuple[bytes, ...], tuple[Position, str, bytes]]


def _overlay(run: _Run, end: _EndPoint, timeout: float) -> Overlay:
    """Each key's last change between the earliest chunk and the dump's point, with where
    its transaction ends in the binlog (from the store's transaction log, read back from
    its end to the earliest chunk). When no transaction in that window touched the table,
    nothing is read from the table's files (its versions are still checked for a schema
    change)."""
    chunks = [c for r in run.progress.ranges for c in r.chunks]
    if not chunks:
        return {}
    first = min(chunks, key=lambda c: binlog_ordinal(c.file, c.pos))
    point = end.point
    origin = end.checkpoint.origin
    if origin is None or binlog_ordinal(origin.file, origin.pos) > \
            binlog_ordinal(first.file, first.pos):
        raise TableChanged("the changes made during the dump are not available: the store "
                           "began replicating after its first chunk")
    window = store_index.window(DataDir(run.data_dir).index, (first.file, first.pos),
                                (point.file, point.pos), GtidState.parse(run.progress.floor))
    ends = {t.gtid: binlog_ordinal(t.file, t.pos) for t in window.transactions}
    since = _state_before(window, point.gtid, origin.gtid_state)
    overlay: Overlay = {}
    key_text = run.table.plan.key_text
    try:
        if not any(run.table.name in t.tables for t in window.transactions):
            fixups.check_versions(run.data_dir, run.table.name, since, point.gtid,
                                  (point.file, point.pos), timeout)
            return overlay
        for gtid, kind, row in fixups.records_between(
                run.data_dir, run.table.name, run.table.fields, since, point.gtid,
                (point.file, point.pos), timeout):
            if gtid not in ends:
                raise CdcError(f"the store's transaction log does not hold {gtid} between "
                               f"{first.file}:{first.pos} and {point.file}:{point.pos}")
            overlay[key_text(row)] = (ends[gtid], kind, row)
    except (fixups.Unavailable, CdcError) as exc:
        raise TableChanged(f"the changes made during the dump are not available: {exc}") \
            from exc
    return overlay


def _state_before(window: store_index.Window, end: GtidState, origin: GtidState
                  ) -> GtidState:
    """The GTID state at the window's start: the end's, with each domain the window holds
    set back to its last transaction before the window (or where the store began)."""
    inside = {(t.gtid.domain, t.gtid.source_uuid or "") for t in window.transactions}
    kept = [g for g in end if (g.domain, g.source_uuid or "") not in inside]
    for key in inside:
        earlier = window.before.get(key)
        if earlier is None:
            earlier = next((g for g in origin if (g.domain, g.source_uuid or "") == key),
                           None)
        if earlier is not None:
            kept.append(earlier)
    return GtidState(kept)


def _merged_lines(run: _Run, body: str, overlay: Overlay) -> Iterator[tuple[bytes, int]]:
    """The dump's body with the changes merged in: (line, rows in it). ``body``: the file
    the chunks were read into."""
    key_text = run.table.plan.key_text
    final_in_chunk: set[tuple[bytes, ...]] = set()
    with open(body, "rb") as f:
        for rng in run.progress.ranges:
            for chunk in rng.chunks:
                f.seek(chunk.start)
                read_at = binlog_ordinal(chunk.file, chunk.pos)
                for line in _lines(f, chunk):
                    kept = []
                    for row in _rows_of(line):
                        key = key_text(row)
                        change = overlay.get(key)
                        if change is None:
                            kept.append(row)
                        elif change[0] <= read_at:  # read after its last change
                            kept.append(row)
                            final_in_chunk.add(key)
                    if kept:
                        yield operation_line("insert", kept), len(kept)
    batch: list[bytes] = []
    for key, (_, kind, row) in overlay.items():
        if kind == "insert" and key not in final_in_chunk:
            batch.append(row)
            if len(batch) >= run.batch_rows:
                yield operation_line("insert", batch), len(batch)
                batch = []
    if batch:
        yield operation_line("insert", batch), len(batch)


def _lines(spool: Any, chunk: Chunk) -> Iterator[bytes]:
    remaining = chunk.end - chunk.start
    while remaining > 0:
        line = spool.readline()
        if not line:
            raise SourceError(f"{spool.name} is shorter than its chunk record says")
        remaining -= len(line)
        yield line


def _rows_of(line: bytes) -> list[bytes]:
    """The rows of an insert line as rawrows wrote them (arrays of base64 texts and nulls,
    which hold no brackets)."""
    assert line.startswith(rawrows.INSERT_PREFIX) and line.endswith(b"]]}\n"), line[:60]
    body = line[len(rawrows.INSERT_PREFIX) + 1:-4]
    return [b"[" + part + b"]" for part in body.split(b"],[")]


# -- the whole dump ----------------------------------------------------------------------

def dump_table(address: SourceAddress, data_dir: str, table: TableName, stream_version: int,
               options: DumpOptions, progressed: Progressed | None = None,
               stop: threading.Event | None = None) -> files.DumpInfo | None:
    """Dump ``table`` in chunks (see the module's description); NotChunkable before anything
    is written if it cannot be. Returns the finished dump, or None when ``stop`` was set (the
    next dump of the table continues this one)."""
    directory = files.dump_dir(data_dir)
    conn = source_sql.connect(address)
    try:
        info = source_sql.describe(conn)
        if info.flavor != "mariadb":
            raise NotChunkable("chunked reads need MariaDB's snapshot positions")
        prepare_session(conn, mariadb=True)
        server = _check_store(conn, data_dir)
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return _attempt(address, data_dir, conn, table, stream_version, options,
                                progressed, stop, server)
            except NotChunkable:
                discard(directory, table)
                raise
            except TableChanged as exc:
                discard(directory, table)
                if attempt == _ATTEMPTS:
                    raise SourceError(f"{exc}; gave up after {attempt} attempts") from exc
                log.info("dump of %s: %s; starting it over in the new definition", table,
                         exc)
    finally:
        conn.close()
    raise AssertionError("unreachable")


def _attempt(address: SourceAddress, data_dir: str, conn: Any, table: TableName,
             stream_version: int, options: DumpOptions, progressed: Progressed | None,
             stop: threading.Event | None, server: str) -> files.DumpInfo | None:
    directory = files.dump_dir(data_dir)
    started = time.monotonic()
    described = _describe(conn, table, stream_version)
    progress = _load(directory, table)
    partial = PartialDump(directory, table)
    record = partial.load_progress()
    why = "--restart was given" if options.restart else \
        "the table's definition changed" if progress is not None and (
            progress.definition != described.text or
            progress.fields != described.fingerprint) else \
        "its body is missing" if progress is not None and (
            record is None or not os.path.exists(partial.path)) else \
        "it was read from another server" if progress is not None and \
        progress.server != server else \
        "it stopped while merging" if os.path.exists(_body_path(directory, table)) else None
    if progress is not None and why is not None:
        log.info("dump of %s: starting over (%s)", table, why)
        discard(directory, table)
        progress = None
    if progress is None or record is None:
        partial.discard()  # a single-snapshot attempt, if any
        discard(directory, table)
        ranges = _split(conn, described.plan, table, options.config.readers,
                        options.config.chunk_rows)
        start = _now(conn)
        record = Progress(table, start.to_json(), described.fingerprint, stream_version,
                          _reserve(described, start), consistent=described.consistent)
        os.makedirs(directory, exist_ok=True)
        partial.create(record)
        progress = ChunkedProgress(described.text, described.fingerprint, stream_version,
                                   described.consistent, ranges, record.reserved,
                                   floor=str(start.gtid), server=server)
        _save(directory, table, progress)
        log.info("dump of %s: %d readers over %d key ranges, %d rows per chunk", table,
                 options.config.readers, len(ranges), options.config.chunk_rows)
    else:
        record.body = progress.body - record.reserved  # what the chunk record vouches for
        partial.reopen(record)
        progress.resumed = True
        progress.stream_version = min(progress.stream_version, stream_version)
        log.info("dump of %s: continuing after %d rows", table,
                 sum(r.rows for r in progress.ranges))
    run = _Run(address, data_dir, directory, described, progress, partial,
               options.config.chunk_rows, options.config.batch_rows, stop, progressed,
               options.config.sync_interval,
               rows_read=sum(r.rows for r in progress.ranges))
    try:
        readers = max(1, min(options.config.readers, len(progress.ranges)))
        try:
            with ThreadPoolExecutor(max_workers=readers,
                                    thread_name_prefix=f"dump-{dump_stem(table)}") as pool:
                for future in [pool.submit(_reader, run) for _ in range(readers)]:
                    future.result()
        finally:
            run.close()
        run.sync()
        if stop is not None and stop.is_set():
            return None
        end = _end_point(conn, data_dir, options.config.store_timeout, server)
        overlay = _overlay(run, end, options.config.store_timeout)
        path, rows = _finish(run, end.point, overlay)
    finally:
        partial.close()
    discard(directory, table)
    log.info("dumped %s: %d rows in %d chunks, %d changes merged, %d bytes in %.1fs%s", table,
             rows, sum(len(r.chunks) for r in progress.ranges), len(overlay),
             os.path.getsize(path), time.monotonic() - started,
             " (resumed)" if progress.resumed else "")
    return files.read_info(path)


def _now(conn: Any) -> SnapshotPoint:
    """Where the source is, roughly (what the header's room is sized for)."""
    file, pos, _ = source_sql.query(conn, "SHOW MASTER STATUS")[0][:3]
    state = source_sql.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    return SnapshotPoint(GtidState.parse(str(state or "")), str(file), int(pos),
                         dt.datetime.now(dt.UTC))


def _reserve(described: _Table, point: SnapshotPoint) -> int:
    """Room for the final header: its size with today's values, plus slack for a longer
    GTID state at the dump's point."""
    sample = json.dumps({"schema": described.schema.avsc, "gtid": str(point.gtid),
                         "definition": described.definition.to_json()})
    return len(sample.encode("utf-8")) + HEADER_SLACK


@dataclass(frozen=True)
class _EndPoint:
    point: SnapshotPoint  # the dump's point: the store's checkpoint
    checkpoint: ckpt.Checkpoint


def _end_point(conn: Any, data_dir: str, timeout: float, server: str) -> _EndPoint:
    """The dump's point: the store's checkpoint, once it has reached the source's position
    after the last chunk. The checkpoint never passes a change without binlog rows (a
    value-filling ALTER, a cascade) that was not repaired, so the dump's point is not
    between such a change and its repair, where the stream's before images would not match
    the dump's rows; and its GTID state is exactly the transactions up to its position."""
    file, pos = source_sql.query(conn, "SHOW MASTER STATUS")[0][:2]
    state = GtidState.parse(str(source_sql.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
                                or ""))  # at or after the position: enough to wait for
    try:
        checkpoint = wait_for_checkpoint(data_dir, str(file), int(pos), timeout, state)
    except CdcError as exc:
        raise TableChanged(f"the store did not reach the dump's point: {exc}") from exc
    position = checkpoint.position
    assert position is not None
    reading = _service_source(data_dir)
    if reading is None or reading[1] != server:
        raise TableChanged("the service moved to another server during the dump")
    return _EndPoint(SnapshotPoint(position.gtid_state, position.file, position.pos,
                                   dt.datetime.now(dt.UTC)), checkpoint)


def _finish(run: _Run, end: SnapshotPoint, overlay: Overlay) -> tuple[str, int]:
    """The header at the dump's point, the file under its final name. Rows the changes
    touched are replaced, dropped or added by writing the body again, merged (the body as
    read is left alone when no change touched the table meanwhile)."""
    described, progress = run.table, run.progress
    partial = run.partial
    rows = sum(r.rows for r in progress.ranges)
    if overlay:
        body = _body_path(run.directory, described.name)
        partial.close()
        os.replace(partial.path, body)
        partial = run.partial = PartialDump(run.directory, described.name)
        assert partial.progress is None
        record = Progress(described.name, end.to_json(), described.fingerprint,
                          progress.stream_version, _reserve(described, end),
                          consistent=progress.consistent)
        partial.create(record)
        rows = 0
        for data, count in _merged_lines(run, body, overlay):
            partial.write(data)
            rows += count
    avsc = {**described.schema.avsc, "version": max(progress.stream_version, 1),
            "gtid": str(end.gtid)}
    header = {"format": FORMAT, "database": described.name.database,
              "table": described.name.table, "gtid": str(end.gtid),
              "binlog": {"file": end.file, "pos": end.pos}, "rows": rows,
              "created": end.taken.isoformat(), "stream_version": progress.stream_version,
              "consistent": progress.consistent, "resumed": progress.resumed,
              "schema": avsc, "definition": described.definition.to_json()}
    return partial.finish(header, files.new_name(described.name, end.taken)), rows
