"""Chunked dumps: a table read in short consistent reads, with the changes between them merged
in, so that no lock is held across chunks and a big table is read by several readers at once.

1. The key space is split into ranges in key order, in one consistent snapshot whose binlog
   position the changes are merged from (step 4), the last range ending at the table's last
   key there (rows added after it come from those changes, so the readers never chase the
   table's end): an integer key arithmetically, in ranges
   of about half ``chunk_rows`` rows (from its span and the table's estimated rows), the last
   quarter of them a quarter as long (so that the readers run out of ranges together), which
   the readers take in turn; any other key in one range per reader, at sampled keys (the key
   ``n`` rows in, ``LIMIT 1 OFFSET n``). The readers' connections are opened meanwhile, and
   they start reading while the dump's files are created.
2. A reader reads its range in chunks of at most ``chunk_rows`` rows, each chunk its own
   transaction: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` gives the binlog position its
   read view is at (taken under the binlog's commit lock: an exact low watermark, nothing is
   written to the source), the table's definition is checked under its metadata lock, the
   chunk is read in key order, and ``COMMIT`` releases the lock: an ``ALTER TABLE`` waits for
   one chunk's read at most.
3. The ranges go into the dump's body in key order, each as it is read when its turn has come
   (the first range not finished), else into a buffer (blocks of memory, then a temporary
   file) until it does, looked at between pieces of a chunk: what the buffer holds then goes
   into the body, and the rest of the range straight there. Rows are encoded straight into
   the body's staging area or the buffer's blocks (:func:`cdcserver.dump.rawrows.query_into`),
   and the body is written in aligned blocks, with O_DIRECT where the file system takes it
   (:class:`cdcserver.dump.partial.PartialDump`). A reader that finishes a range before its
   turn leaves it to be appended and reads the next one. The body is made durable and its
   chunks recorded in ``<stem>.chunked`` every ``sync_interval`` seconds; a killed dump
   continues after its last recorded chunk.
4. When every range is read, the dump's point is the store's checkpoint once it has caught
   up with the source (so that it is not between a change without binlog rows and its
   repair), and the table's changes since the split's snapshot are taken from the store
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

import datetime as dt
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import SourceError, SourceUnavailable
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.core.retry import Backoff
from cdcserver.dump import files
from cdcserver.dump.chunkmerge import Overlay, end_point, merged_lines, store_overlay
from cdcserver.dump.chunkreader import Run, reader, split
from cdcserver.dump.chunks import (
    ChunkedProgress,
    NotChunkable,
    Progressed,
    Table,
    TableChanged,
    body_path,
    check_store,
    describe,
    discard,
    load,
    save,
)
from cdcserver.dump.options import DumpOptions
from cdcserver.dump.partial import HEADER_SLACK, PartialDump, Progress
from cdcserver.dump.readerconnections import Connections
from cdcserver.dump.snapshot import (
    SnapshotPoint,
    prepare_session,
)
from cdcserver.replication import source as source_sql
from cdcserver.store.naming import dump_stem
from mariadb_cdc_client.format.dump import FORMAT

log = logging.getLogger(__name__)


_ATTEMPTS = 3  # a table whose definition keeps changing under its dump: given up after this
SOURCE_LOST_LIMIT = 600.0  # seconds in a row a dump waits for a lost source to come back
# pymysql's codes for a connection lost or refused: can't connect, gone away, lost during a
# query, lost at the handshake
_LOST = (2003, 2006, 2013, 2055)


# -- the whole dump ----------------------------------------------------------------------

def dump_table(address: SourceAddress, data_dir: str, table: TableName, stream_version: int,
               options: DumpOptions, progressed: Progressed | None = None,
               stop: threading.Event | None = None) -> files.DumpInfo | None:
    """Dump ``table`` in chunks (see the module's description); NotChunkable before anything
    is written if it cannot be. Returns the finished dump, or None when ``stop`` was set (the
    next dump of the table continues this one).

    A source lost during the dump (a connection cut, the server killed and restarted) is
    waited for with backoff, up to ``SOURCE_LOST_LIMIT`` seconds in a row, and the dump
    continues after its last chunk made durable: each chunk is read in a snapshot of its
    own, so nothing read before is read again, and the changes since come from the store."""
    backoff = Backoff(first=0.5)
    lost_since: float | None = None
    while True:
        began = time.monotonic()
        try:
            return _dump_table(address, data_dir, table, stream_version, options, progressed,
                               stop)
        except SourceUnavailable as exc:
            now = time.monotonic()
            if lost_since is None or now - began >= backoff.stable_after:
                lost_since = began  # the source was there at the start of this attempt
            if now - lost_since > SOURCE_LOST_LIMIT:
                raise SourceUnavailable(f"dump of {table}: {exc}; gave up after "
                                        f"{SOURCE_LOST_LIMIT:.0f}s (the next dump of the "
                                        f"table continues it)") from exc
            delay = backoff.failed()
            log.warning("dump of %s: %s; continuing after its last chunk in %.1fs", table,
                        exc, delay)
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                return None


def _dump_table(address: SourceAddress, data_dir: str, table: TableName, stream_version: int,
                options: DumpOptions, progressed: Progressed | None,
                stop: threading.Event | None) -> files.DumpInfo | None:
    """One try of :func:`dump_table`; SourceUnavailable when the source is lost."""
    try:
        return _dump_connected(address, data_dir, table, stream_version, options,
                               progressed, stop)
    except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
        if not _lost(exc):
            raise
        raise SourceUnavailable(f"the source was lost: {exc}") from exc
    except SourceError as exc:  # a query that says what it asked, when the source was lost
        if isinstance(exc, SourceUnavailable) or not _lost(exc.__cause__):
            raise
        raise SourceUnavailable(str(exc)) from exc


def _lost(exc: BaseException | None) -> bool:
    """Whether pymysql raised ``exc`` for a connection lost or refused."""
    if isinstance(exc, pymysql.err.InterfaceError):  # a connection closed under it
        return True
    return isinstance(exc, pymysql.err.OperationalError) and bool(exc.args) and \
        exc.args[0] in _LOST


def _dump_connected(address: SourceAddress, data_dir: str, table: TableName,
                    stream_version: int, options: DumpOptions, progressed: Progressed | None,
                    stop: threading.Event | None) -> files.DumpInfo | None:
    conn = source_sql.connect(address)
    try:
        # MariaDB says so in its handshake's version (no round trip); else ask
        handshake = str(getattr(conn, "server_version", "") or "")
        if "mariadb" not in handshake.lower() and source_sql.describe(conn).flavor != "mariadb":
            raise NotChunkable("chunked reads need MariaDB's snapshot positions")
        prepare_session(conn, mariadb=True)
        server = check_store(conn, data_dir)
        connections = Connections(address, options.config.readers)
        try:
            return _attempts(address, data_dir, conn, table, stream_version, options,
                             progressed, stop, server, connections)
        finally:
            connections.close()
    finally:
        conn.close()


def _attempts(address: SourceAddress, data_dir: str, conn: Any, table: TableName,
              stream_version: int, options: DumpOptions, progressed: Progressed | None,
              stop: threading.Event | None, server: str, connections: Connections
              ) -> files.DumpInfo | None:
    """The dump, started over in the new definition if the table changes under it."""
    directory = files.dump_dir(data_dir)
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return _attempt(address, data_dir, conn, table, stream_version, options,
                            progressed, stop, server, connections)
        except NotChunkable:
            discard(directory, table)
            raise
        except TableChanged as exc:
            discard(directory, table)
            if attempt == _ATTEMPTS:
                raise SourceError(f"{exc}; gave up after {attempt} attempts") from exc
            log.info("dump of %s: %s; starting it over in the new definition", table, exc)
    raise AssertionError("unreachable")


def _attempt(address: SourceAddress, data_dir: str, conn: Any, table: TableName,
             stream_version: int, options: DumpOptions, progressed: Progressed | None,
             stop: threading.Event | None, server: str, connections: Connections | None = None
             ) -> files.DumpInfo | None:
    directory = files.dump_dir(data_dir)
    started = time.monotonic()
    described = describe(conn, table, stream_version, options.columns)
    partial = PartialDump(directory, table)
    progress, record, fresh = _progress(conn, directory, table, described, partial,
                                        stream_version, options, server)
    run = Run(address, data_dir, directory, described, progress, partial,
              options.config.chunk_rows, options.config.batch_rows, stop, progressed,
              options.config.sync_interval,
              rows_read=sum(r.rows for r in progress.ranges), connections=connections)
    try:
        _read(run, options.config.readers, fresh, record)
        if stop is not None and stop.is_set():
            run.sync()  # the next dump of the table continues after every chunk read
            return None
        # (otherwise the body is made durable with its header; a crash before that loses
        # at most what was read since the last sync, as one during the reading would)
        end = end_point(conn, data_dir, options.config.store_timeout, server)
        changes = store_overlay(run, end, options.config.store_timeout)
        path, rows = _finish(run, end.point, changes)
    finally:
        partial.close()
    discard(directory, table)
    log.info("dumped %s: %d rows in %d chunks, %d changes merged, %d bytes in %.1fs%s", table,
             rows, sum(len(r.chunks) for r in progress.ranges), len(changes),
             os.path.getsize(path), time.monotonic() - started,
             " (resumed)" if progress.resumed else "")
    return files.read_info(path)


def _progress(conn: Any, directory: str, table: TableName, described: Table,
              partial: PartialDump, stream_version: int, options: DumpOptions, server: str
              ) -> tuple[ChunkedProgress, Progress, bool]:
    """The dump's progress and its chunk record: those left by an earlier attempt, unless it
    must start over, or new ones; and whether they are new."""
    progress = load(directory, table)
    record = partial.load_progress()
    why = _why_start_over(directory, table, described, partial, progress, record, options,
                          server)
    if progress is not None and why is not None:
        log.info("dump of %s: starting over (%s)", table, why)
        discard(directory, table)
        progress = None
    if progress is None or record is None:
        progress, record = _fresh(conn, directory, table, described, partial,
                                  stream_version, options, server)
        return progress, record, True
    record.body = progress.body - record.reserved  # what the chunk record vouches for
    progress.resumed = True
    progress.stream_version = min(progress.stream_version, stream_version)
    log.info("dump of %s: continuing after %d rows", table,
             sum(r.rows for r in progress.ranges))
    return progress, record, False


def _why_start_over(directory: str, table: TableName, described: Table, partial: PartialDump,
                    progress: ChunkedProgress | None, record: Progress | None,
                    options: DumpOptions, server: str) -> str | None:
    """Why an earlier attempt's progress cannot be continued (None: it can, or there is
    none)."""
    if options.restart:
        return "--restart was given"
    if progress is not None and (progress.definition != described.text or
                                 progress.fields != described.fingerprint):
        return "the table's definition changed"
    if progress is not None and (record is None or not os.path.exists(partial.path)):
        return "its body is missing"
    if progress is not None and progress.server != server:
        return "it was read from another server"
    if os.path.exists(body_path(directory, table)):
        return "it stopped while merging"
    return None


def _fresh(conn: Any, directory: str, table: TableName, described: Table,
           partial: PartialDump, stream_version: int, options: DumpOptions, server: str
           ) -> tuple[ChunkedProgress, Progress]:
    """A new dump: the table split into key ranges, and where the source stood before."""
    partial.discard()  # a single-snapshot attempt, if any
    discard(directory, table)
    start = _now(conn)  # before the split's snapshot: the floor covers none after it
    ranges = split(conn, described.plan, table, options.config.readers,
                   options.config.chunk_rows)
    record = Progress(table, start.to_json(), described.fingerprint, stream_version,
                      _reserve(described, start), consistent=described.consistent)
    progress = ChunkedProgress(described.text, described.fingerprint, stream_version,
                               described.consistent, ranges.ranges, record.reserved,
                               floor=str(start.gtid), server=server,
                               split_file=ranges.file, split_pos=ranges.pos)
    log.info("dump of %s: %d readers over %d key ranges, %d rows per chunk", table,
             options.config.readers, len(ranges.ranges), options.config.chunk_rows)
    return progress, record


def _read(run: Run, readers: int, fresh: bool, record: Progress) -> None:
    """Every key range read by ``readers`` threads into the dump's body."""
    readers = max(1, min(readers, len(run.progress.ranges)))
    table, directory, partial = run.table.name, run.directory, run.partial
    try:
        with ThreadPoolExecutor(max_workers=readers,
                                thread_name_prefix=f"dump-{dump_stem(table)}") as pool:
            # the readers connect and read their first ranges (into their buffers)
            # while the body is made ready
            futures = [pool.submit(reader, run) for _ in range(readers)]
            try:
                if fresh:
                    os.makedirs(directory, exist_ok=True)
                    partial.create(record)
                    save(directory, table, run.progress)
                else:
                    partial.reopen(record)
                run.open()
            except BaseException:
                run.fail()
                raise
            for future in futures:
                future.result()
    finally:
        run.close()


def _now(conn: Any) -> SnapshotPoint:
    """Where the source is, roughly (what the header's room is sized for)."""
    file, pos, _ = source_sql.query(conn, "SHOW MASTER STATUS")[0][:3]
    state = source_sql.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    return SnapshotPoint(GtidState.parse(str(state or "")), str(file), int(pos),
                         dt.datetime.now(dt.UTC))


def _reserve(described: Table, point: SnapshotPoint) -> int:
    """Room for the final header: its size with today's values, plus slack for a longer
    GTID state at the dump's point."""
    sample = json.dumps({"schema": described.schema.avsc, "gtid": str(point.gtid),
                         "definition": described.definition.to_json()})
    return len(sample.encode("utf-8")) + HEADER_SLACK


def _finish(run: Run, end: SnapshotPoint, overlay: Overlay) -> tuple[str, int]:
    """The header at the dump's point, the file under its final name. Rows the changes
    touched are replaced, dropped or added by writing the body again, merged (the body as
    read is left alone when no change touched the table meanwhile)."""
    described, progress = run.table, run.progress
    partial = run.partial
    rows = sum(r.rows for r in progress.ranges)
    if overlay:
        body = body_path(run.directory, described.name)
        partial.close()
        os.replace(partial.path, body)
        partial = run.partial = PartialDump(run.directory, described.name)
        assert partial.progress is None
        record = Progress(described.name, end.to_json(), described.fingerprint,
                          progress.stream_version, _reserve(described, end),
                          consistent=progress.consistent)
        partial.create(record)
        rows = 0
        for data, count in merged_lines(run, body, overlay):
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
