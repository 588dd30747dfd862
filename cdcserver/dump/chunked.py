"""Chunked dumps: a table read in short consistent reads, with the changes between them merged
in, so that no lock is held across chunks and a big table is read by several readers at once.

1. The key space is split into one range per reader: an integer key arithmetically between
   its smallest and largest value, any other key at sampled boundaries (the key ``n`` rows
   in, ``LIMIT 1 OFFSET n``).
2. Each reader walks its range in chunks of ``chunk_rows`` keys. Every chunk is its own
   transaction: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` gives the chunk's point (the
   binlog position and GTID state its read view is at, taken under the binlog's commit lock:
   an exact low watermark, with nothing written to the source), the table's definition is
   checked under its metadata lock, the chunk is read in key order, and ``COMMIT`` releases
   the lock. An ``ALTER TABLE`` waits for at most one chunk's read. The chunk's rows go to the
   reader's spool file, which is fsynced before the chunk is recorded in ``<stem>.chunked``;
   a killed dump continues from its last recorded chunk.
3. When every range is read, the dump's point is taken (a last consistent snapshot: the high
   watermark) and the table's changes from the earliest chunk's point to it are taken from the
   store (:func:`cdcserver.dump.fixups.records_between`). For each key, the last change wins
   over a chunk's row when the chunk's point does not include it; a key no chunk read exists
   if its last change left it. The spools are copied into the dump with those rows replaced,
   dropped or added: the result holds only ``insert`` lines, the table at the dump's point,
   as a single-snapshot dump would (and untouched chunks are copied as they are).

If the table's definition changes during the dump (a chunk finds another ``SHOW CREATE
TABLE``, or the store holds a schema change between the chunks), the table's dump starts over
in the new definition. The merge needs the service to be replicating into the same data
directory: without a live store, or on MySQL, or for a table whose key cannot be ranged over
(see :mod:`cdcserver.dump.scan`), the dump is read in one snapshot instead
(:class:`NotChunkable` says why).
"""

from __future__ import annotations

import base64
import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.gtid import Gtid, GtidState, binlog_ordinal
from cdcserver.dump import files, fixups, rawrows
from cdcserver.dump.partial import HEADER_SLACK, PartialDump, Progress
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    ER_TABLE_DEF_CHANGED,
    SnapshotPoint,
    open_mariadb_point,
    prepare_session,
    qualified,
)
from cdcserver.replication import source as source_sql
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.history import TRANSACTIONAL_ENGINES, layout_of
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import TableName
from cdcserver.store.reader import wait_for_checkpoint
from cdcserver.store.schema import TableSchema
from client.format.dump import FORMAT, operation_line

log = logging.getLogger(__name__)

_INSERT_PREFIX = b'{"action":"insert","rows":['
_ATTEMPTS = 3  # a table whose definition keeps changing under its dump: given up after this


class NotChunkable(CdcError):
    """This table is read in one snapshot instead; the message says why."""


class TableChanged(SourceError):
    """The table's definition changed during its dump: it starts over."""


@dataclass
class Chunk:
    start: int  # its bytes in the reader's spool
    end: int
    rows: int
    gtid: str  # the point its read view was at
    file: str
    pos: int


@dataclass
class KeyRange:
    lo: list[str] | None  # hex of the key values after which the range starts (None: first)
    hi: list[str] | None  # ... and of the last key it holds (None: to the table's end)
    after: list[str] | None = None  # the last key read
    spool: int = 0  # good bytes in its spool
    rows: int = 0
    done: bool = False
    chunks: list[Chunk] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyRange:
        chunks = [Chunk(**c) for c in data.pop("chunks")]
        return cls(**data, chunks=chunks)


@dataclass
class ChunkedProgress:
    definition: str  # the SHOW CREATE TABLE the chunks were read with (normalised)
    fields: str  # fingerprint of the columns
    stream_version: int
    consistent: bool
    ranges: list[KeyRange]
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkedProgress:
        return cls(data["definition"], data["fields"], int(data["stream_version"]),
                   bool(data["consistent"]), [KeyRange.from_json(r) for r in data["ranges"]],
                   bool(data.get("resumed", False)))


Progressed = Callable[[TableName, int], None]


# -- files -------------------------------------------------------------------------------

def _progress_path(directory: str, table: TableName) -> str:
    return os.path.join(directory, f"{table.stem}.chunked")


def _spool_path(directory: str, table: TableName, reader: int) -> str:
    return os.path.join(directory, f"{table.stem}.r{reader}.spool")


def discard(directory: str, table: TableName) -> None:
    """Remove a table's unfinished chunked dump (its record and spools)."""
    paths = [_progress_path(directory, table), _progress_path(directory, table) + ".tmp",
             *glob.glob(os.path.join(glob.escape(directory),
                                     f"{glob.escape(table.stem)}.r*.spool"))]
    for path in paths:
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


def _check_store(data_dir: str, conn: Any, timeout: float) -> None:
    """The merge takes the changes between chunks from the store: the service must be
    replicating into ``data_dir`` (it holds the store's writer lock) and keeping up."""
    if not _service_running(data_dir):
        raise NotChunkable(f"the service is not replicating into {data_dir}")
    status = source_sql.query(conn, "SHOW MASTER STATUS")
    if not status:
        raise NotChunkable("the source has no binlog")
    file, pos = str(status[0][0]), int(status[0][1])
    state = GtidState.parse(str(source_sql.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
                                or ""))
    try:
        wait_for_checkpoint(data_dir, file, pos, timeout, state)
    except CdcError as exc:
        raise NotChunkable(f"the service is not replicating into {data_dir} ({exc})") from exc


def _service_running(data_dir: str) -> bool:
    """Whether a process holds the store's writer lock, read from /proc/locks (taking the
    lock to see, even briefly, could make a starting service fail)."""
    try:
        st = os.stat(DataDir(data_dir).writer_lock)
    except FileNotFoundError:
        return False
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii") as f:
            return any(line.split()[1] == "FLOCK" and wanted in line.split() for line in f)
    except OSError:  # no /proc: assume it runs; the checkpoint wait tells
        return True


# -- ranges ------------------------------------------------------------------------------

def _split(conn: Any, plan: ScanPlan, table: TableName, readers: int) -> list[KeyRange]:
    """One range per reader: an integer key split arithmetically, others at sampled keys."""
    if readers <= 1:
        return [KeyRange(None, None)]
    key = plan.key
    if len(key) == 1 and key[0].sql_type in ("tinyint", "smallint", "mediumint", "int",
                                             "bigint", "serial"):
        column = f"`{key[0].name.replace('`', '``')}`"
        low, high = source_sql.query(conn, f"SELECT MIN({column}), MAX({column}) FROM "
                                           f"{qualified(table)}")[0]
        if low is None or int(high) - int(low) < readers * 2:
            return [KeyRange(None, None)]
        step = (int(high) - int(low)) // readers
        cuts = [[str(int(low) + step * i).encode()] for i in range(1, readers)]
    else:
        estimate = int(source_sql.query(
            conn, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                  "AND TABLE_NAME = %s", (table.database, table.table))[0][0] or 0)
        if estimate < readers * 2:
            return [KeyRange(None, None)]
        cuts = []
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

@dataclass
class _Run:
    """One attempt's shared state: the progress record and who may write it."""

    address: SourceAddress
    data_dir: str
    directory: str  # the dump directory
    table: _Table
    progress: ChunkedProgress
    chunk_rows: int
    batch_rows: int
    stop: threading.Event | None
    progressed: Progressed | None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, rng: KeyRange, chunk: Chunk | None, after: list[str] | None,
               done: bool) -> None:
        with self.lock:
            if chunk is not None:
                rng.chunks.append(chunk)
                rng.spool, rng.rows = chunk.end, rng.rows + chunk.rows
                rng.after = after
            rng.done = done
            _save(self.directory, self.table.name, self.progress)
            rows = sum(r.rows for r in self.progress.ranges)
        if self.progressed is not None:
            self.progressed(self.table.name, rows)


def _read_range(run: _Run, index: int) -> None:
    rng = run.progress.ranges[index]
    if rng.done:
        return
    table = run.table
    path = _spool_path(run.directory, table.name, index)
    conn = source_sql.connect(run.address)
    try:
        prepare_session(conn, mariadb=True)
        with open(path, "r+b" if os.path.exists(path) else "w+b") as spool:
            spool.truncate(rng.spool)
            spool.seek(rng.spool)
            while not rng.done:
                if run.stop is not None and run.stop.is_set():
                    return
                _read_chunk(run, conn, rng, spool)
    finally:
        conn.close()


def _read_chunk(run: _Run, conn: Any, rng: KeyRange, spool: Any) -> None:
    """One chunk in its own consistent read, then committed (its metadata lock released)."""
    table = run.table
    point = open_mariadb_point(conn)
    start = rng.spool
    written, count, last = start, 0, None
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
        sql = table.plan.chunk_sql(_values(rng.after if rng.after is not None else rng.lo),
                                   run.chunk_rows, _values(rng.hi))
        for batch in rawrows.query_rows(conn, sql, run.batch_rows):
            data = operation_line("insert", batch)
            spool.write(data)
            written += len(data)
            count += len(batch)
            last = batch[-1]
    finally:
        if conn.open:
            source_sql.query(conn, "COMMIT")
    spool.flush()
    os.fsync(spool.fileno())
    done = count < run.chunk_rows
    if last is None:
        run.record(rng, None, rng.after, done)
        return
    chunk = Chunk(start, written, count, str(point.gtid), point.file, point.pos)
    run.record(rng, chunk, [v.hex() for v in table.plan.key_of(last)], done)


# -- merging -----------------------------------------------------------------------------

Overlay = dict[tuple[bytes, ...], tuple[Gtid, str, bytes]]


def _overlay(run: _Run, end: SnapshotPoint, timeout: float) -> Overlay:
    """Each key's last change between the earliest chunk and the dump's point."""
    chunks = [c for r in run.progress.ranges for c in r.chunks]
    if not chunks:
        return {}
    first = min(chunks, key=lambda c: binlog_ordinal(c.file, c.pos))
    overlay: Overlay = {}
    key_text = run.table.plan.key_text
    try:
        for gtid, kind, row in fixups.records_between(
                run.data_dir, run.table.name, run.table.fields, GtidState.parse(first.gtid),
                end.gtid, (end.file, end.pos), timeout):
            overlay[key_text(row)] = (gtid, kind, row)
    except fixups.Unavailable as exc:
        raise TableChanged(f"the changes made during the dump are not available: {exc}") \
            from exc
    return overlay


def _merged_lines(run: _Run, overlay: Overlay) -> Iterator[tuple[bytes, int]]:
    """The dump's body: (line, rows in it)."""
    key_text = run.table.plan.key_text
    final_in_chunk: set[tuple[bytes, ...]] = set()
    for index, rng in enumerate(run.progress.ranges):
        with open(_spool_path(run.directory, run.table.name, index), "rb") as spool:
            for chunk in rng.chunks:
                spool.seek(chunk.start)
                if not overlay:
                    yield from _copied(spool, chunk)
                    continue
                point = GtidState.parse(chunk.gtid)
                for line in _lines(spool, chunk):
                    kept = []
                    for row in _rows_of(line):
                        key = key_text(row)
                        change = overlay.get(key)
                        if change is None:
                            kept.append(row)
                        elif point.covers(change[0]):  # read after its last change
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


def _copied(spool: Any, chunk: Chunk) -> Iterator[tuple[bytes, int]]:
    """A chunk no change touched, as it is (its rows counted once, with its first piece)."""
    remaining, rows = chunk.end - chunk.start, chunk.rows
    while remaining:
        data = spool.read(min(remaining, 1 << 20))
        if not data:
            raise SourceError(f"{spool.name} is shorter than its chunk record says")
        remaining -= len(data)
        yield data, rows
        rows = 0


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
    assert line.startswith(_INSERT_PREFIX) and line.endswith(b"]]}\n"), line[:60]
    body = line[len(_INSERT_PREFIX) + 1:-4]
    return [b"[" + part + b"]" for part in body.split(b"],[")]


# -- the whole dump ----------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkedOptions:
    readers: int
    chunk_rows: int
    batch_rows: int
    restart: bool
    store_timeout: float


def dump_table(address: SourceAddress, data_dir: str, table: TableName, stream_version: int,
               options: ChunkedOptions, progressed: Progressed | None = None,
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
        _check_store(data_dir, conn, min(options.store_timeout, 10.0))
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return _attempt(address, data_dir, conn, table, stream_version, options,
                                progressed, stop)
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
             stream_version: int, options: ChunkedOptions, progressed: Progressed | None,
             stop: threading.Event | None) -> files.DumpInfo | None:
    directory = files.dump_dir(data_dir)
    started = time.monotonic()
    described = _describe(conn, table, stream_version)
    progress = _load(directory, table)
    if progress is not None and (options.restart or progress.definition != described.text
                                 or progress.fields != described.fingerprint):
        log.info("dump of %s: starting over (%s)", table, "--restart was given"
                 if options.restart else "the table's definition changed")
        discard(directory, table)
        progress = None
    if progress is None:
        PartialDump(directory, table).discard()  # a single-snapshot attempt, if any
        ranges = _split(conn, described.plan, table, options.readers)
        progress = ChunkedProgress(described.text, described.fingerprint, stream_version,
                                   described.consistent, ranges)
        os.makedirs(directory, exist_ok=True)
        _save(directory, table, progress)
        log.info("dump of %s: %d readers over key ranges, %d rows per chunk", table,
                 len(ranges), options.chunk_rows)
    else:
        progress.resumed = True
        progress.stream_version = min(progress.stream_version, stream_version)
        log.info("dump of %s: continuing after %d rows", table,
                 sum(r.rows for r in progress.ranges))
    run = _Run(address, data_dir, directory, described, progress, options.chunk_rows,
               options.batch_rows, stop, progressed)
    with ThreadPoolExecutor(max_workers=len(progress.ranges),
                            thread_name_prefix=f"dump-{table.stem}") as pool:
        for future in [pool.submit(_read_range, run, i) for i in range(len(progress.ranges))]:
            future.result()
    if stop is not None and stop.is_set():
        return None
    end = _end_point(conn, data_dir, options.store_timeout)
    overlay = _overlay(run, end, options.store_timeout)
    path, rows = _write(run, end, overlay)
    discard(directory, table)
    log.info("dumped %s: %d rows in %d chunks, %d changes merged, %d bytes in %.1fs%s", table,
             rows, sum(len(r.chunks) for r in progress.ranges), len(overlay),
             os.path.getsize(path), time.monotonic() - started,
             " (resumed)" if progress.resumed else "")
    return files.read_info(path)


def _end_point(conn: Any, data_dir: str, timeout: float) -> SnapshotPoint:
    """The dump's point, once the store has reached the source's position after the last
    chunk: a change without binlog rows (a value-filling ALTER, a cascade) before that
    position has then been repaired (the store's checkpoint never passes one that was not),
    so the dump's point is not between such a change and its repair, where the stream's
    before images would not match the dump's rows."""
    reached = open_mariadb_point(conn)
    source_sql.query(conn, "COMMIT")
    try:
        wait_for_checkpoint(data_dir, reached.file, reached.pos, timeout, reached.gtid)
    except CdcError as exc:
        raise TableChanged(f"the store did not reach the dump's point: {exc}") from exc
    end = open_mariadb_point(conn)
    source_sql.query(conn, "COMMIT")
    return end


def _write(run: _Run, end: SnapshotPoint, overlay: Overlay) -> tuple[str, int]:
    described, progress = run.table, run.progress
    sample = json.dumps({"schema": described.schema.avsc, "gtid": str(end.gtid),
                         "definition": described.definition.to_json()})
    partial = PartialDump(run.directory, described.name)
    record = Progress(described.name, end.to_json(), described.fingerprint,
                      progress.stream_version, len(sample.encode()) + HEADER_SLACK,
                      consistent=progress.consistent)
    try:
        partial.create(record)
        rows = 0
        for data, count in _merged_lines(run, overlay):
            partial.write(data)
            rows += count
        record.rows = rows
        avsc = {**described.schema.avsc, "version": max(progress.stream_version, 1),
                "gtid": str(end.gtid)}
        header = {"format": FORMAT, "database": described.name.database,
                  "table": described.name.table, "gtid": str(end.gtid),
                  "binlog": {"file": end.file, "pos": end.pos}, "rows": rows,
                  "created": end.taken.isoformat(), "stream_version": progress.stream_version,
                  "consistent": progress.consistent, "resumed": progress.resumed,
                  "schema": avsc, "definition": described.definition.to_json()}
        path = partial.finish(header, files.new_name(described.name, end.taken))
    finally:
        partial.close()
    return path, rows
