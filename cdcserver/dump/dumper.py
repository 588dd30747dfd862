"""Taking dumps: per table, a consistent snapshot read into its own dump file.

1. Note the table's newest stream version (before the snapshot, so a version whose
   changes all precede the snapshot; a hint, see docs/dumps.md).
2. Open a consistent snapshot (:mod:`cdcserver.dump.snapshot`). Each table has its own, so
   its metadata lock (which makes an ALTER of it wait) is held only while it is read.
3. Read its definition in the snapshot, derive its Avro schema (the change stream's mapping),
   then write its rows chunk by chunk (:mod:`cdcserver.dump.scan`) into ``<stem>.partial``,
   checkpointing progress after each chunk (:mod:`cdcserver.dump.partial`).
4. Write the header and rename the file to ``<stem>.<time>.dump``.

A dump that finds an interrupted attempt of the same table continues it (unless told to
restart): in the new snapshot, it first writes the changes made between the two snapshots
(:mod:`cdcserver.dump.fixups`), then reads on from the last key written. Without a primary key
there is no place to continue from, so such a table starts over.

One dump of a table runs at a time: ``<stem>.lock`` in the dump directory is held (``flock``)
for the whole run, by the service's scheduler or by ``cdcserver dump``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pymysql

from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.names import TableName
from cdcserver.dump import chunked, files, fixups
from cdcserver.dump.options import DumpOptions
from cdcserver.dump.partial import HEADER_SLACK, PartialDump, Progress
from cdcserver.dump.scan import ChunkEnd, ScanPlan
from cdcserver.dump.snapshot import DefinitionChanged, Snapshot, SnapshotPoint
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.layouts import layout_of
from cdcserver.schema.masking import project_definition
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import dump_stem
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.dump import FORMAT
from mariadb_cdc_client.format.wire import ProtocolError, parse_start_dump

log = logging.getLogger(__name__)


class DumpBusy(CdcError):
    """Another dump of the same table is running."""


class DumpInterrupted(CdcError):
    """Stopped on request; the next dump of the table continues where this one stopped."""


@dataclass(frozen=True)
class DumpResult:
    info: files.DumpInfo
    resumed: bool
    seconds: float


Progressed = Callable[[TableName, int], None]  # rows written so far


def resolve_tables(address: SourceAddress, patterns: list[str],
                   capture: CaptureFilter = EVERY_USER_TABLE) -> list[TableName]:
    """``db.table`` and ``db.*`` patterns as table names (in the order given): the tables the
    service captures (a named one it does not is an error; ``mysql.*`` is no table). A name
    holding a dot, a comma or a space is quoted as in the protocol (``shop.`v1.2```)."""
    from cdcserver.replication import source as source_sql

    names: list[TableName] = []
    conn = source_sql.connect(address)
    try:
        for pattern in patterns:
            database, table = _table_or_all(pattern)
            if table is None:
                rows = source_sql.query(
                    conn, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
                    "TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME",
                    (database,))
                names += [TableName(database, str(r[0])) for r in rows
                          if capture.captures(database, str(r[0]))]
            else:
                require_captured(TableName(database, table), capture)
                names.append(TableName(database, table))
    finally:
        conn.close()
    return list(dict.fromkeys(names))


def require_captured(table: TableName, capture: CaptureFilter) -> None:
    why = capture.why_not(table)
    if why is not None:
        raise SourceError(f"{table} is not captured: {why}")


def _table_or_all(pattern: str) -> tuple[str, str | None]:
    """``(db, table)``, or ``(db, None)`` for ``db.*``; SourceError for anything else."""
    try:
        refs = parse_start_dump(pattern)
    except ProtocolError as exc:
        raise SourceError(f"expected db.table or db.*, not {pattern!r}: {exc.message}") \
            from None
    if len(refs) != 1:
        raise SourceError(f"expected db.table or db.*, not {pattern!r}")
    return refs[0]


def resolve_refs(address: SourceAddress, refs: list[tuple[str, str | None]],
                 capture: CaptureFilter = EVERY_USER_TABLE) -> list[TableName]:
    """The base tables ``(db, table)`` and ``(db, None)`` (every table of ``db``) name on
    the source, in the order given; a named table the source does not have, or the service
    does not capture, is left out."""
    from cdcserver.replication import source as source_sql

    names: list[TableName] = []
    conn = source_sql.connect(address)
    try:
        for database, table in refs:
            sql = ("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                   "AND TABLE_TYPE = 'BASE TABLE'")
            args: tuple[str, ...] = (database,)
            if table is not None:
                sql, args = sql + " AND TABLE_NAME = %s", (database, table)
            rows = source_sql.query(conn, sql + " ORDER BY TABLE_NAME", args)
            names += [TableName(database, str(r[0])) for r in rows
                      if capture.captures(database, str(r[0]))]
    finally:
        conn.close()
    return list(dict.fromkeys(names))


def estimate_rows(address: SourceAddress, tables: list[TableName]) -> dict[TableName, int]:
    """The rows the source estimates each table holds (InnoDB's statistics; a progress
    bar's total, not a count)."""
    from cdcserver.replication import source as source_sql

    found: dict[TableName, int] = {}
    conn = source_sql.connect(address)
    try:
        for table in tables:
            found[table] = source_sql.estimated_rows(conn, table.database, table.table)
    finally:
        conn.close()
    return found


class DumpFailed(SourceError):
    """Some tables could not be dumped (the others were); ``results`` holds those."""

    def __init__(self, message: str, results: list[DumpResult]) -> None:
        super().__init__(message)
        self.results = results


DEFAULT_OPTIONS = DumpOptions()


def dump_tables(address: SourceAddress, data_dir: str, tables: list[TableName],
                options: DumpOptions = DEFAULT_OPTIONS,
                stream_versions: dict[TableName, int] | None = None,
                progressed: Progressed | None = None,
                stop: threading.Event | None = None,
                capture: CaptureFilter = EVERY_USER_TABLE,
                landed: Callable[[DumpResult], None] | None = None) -> list[DumpResult]:
    """Dump each table in its own snapshot; returns the finished dumps. A table that fails
    does not stop the others: DumpFailed at the end names it. ``stream_versions``: each
    table's newest version now (a running service passes its catalog's; by default they are
    read from the data directory). Setting ``stop`` interrupts it after the current batch.
    A table the service does not capture is refused before anything is read. ``landed`` is
    called with each table's dump as soon as it is in place."""
    for table in tables:
        require_captured(table, capture)
    options = replace(options, columns=capture.columns)
    directory = files.dump_dir(data_dir)
    os.makedirs(directory, exist_ok=True)
    versions = stream_versions if stream_versions is not None else \
        newest_versions(_load_catalog(data_dir), tables)
    results: list[DumpResult] = []
    failures: list[str] = []
    for table in tables:
        try:
            with table_lock(directory, table):
                result = _dump_one(address, data_dir, table, versions.get(table, 0), options,
                                   progressed, stop)
        except DumpInterrupted:
            raise
        except CdcError as exc:
            if len(tables) == 1:
                raise
            log.error("dump of %s failed: %s", table, exc)
            failures.append(f"{table}: {exc}")
            continue
        results.append(result)
        if landed is not None:
            landed(result)
    if failures:
        raise DumpFailed("; ".join(failures), results)
    return results


def _dump_one(address: SourceAddress, data_dir: str, table: TableName, stream_version: int,
              options: DumpOptions, progressed: Progressed | None,
              stop: threading.Event | None) -> DumpResult:
    """In chunks when it can be (cdcserver.dump.chunked), else in one snapshot."""
    if options.config.readers > 0:
        started = time.monotonic()
        try:
            info = chunked.dump_table(
                address, data_dir, table, stream_version,
                options,
                progressed, stop)
        except chunked.NotChunkable as exc:
            log.info("dump of %s: read in one snapshot, which holds its metadata lock for the "
                     "whole read (an ALTER TABLE of it waits): %s", table, exc)
            chunked.discard(files.dump_dir(data_dir), table)
        else:
            if info is None:
                raise DumpInterrupted(f"the dump of {table} was interrupted; it continues "
                                      "next time")
            return DumpResult(info, info.header.resumed, time.monotonic() - started)
    return _dump_in_snapshot(address, data_dir, table, stream_version, options, progressed,
                             stop)


def _dump_in_snapshot(address: SourceAddress, data_dir: str, table: TableName,
                      stream_version: int, options: DumpOptions,
                      progressed: Progressed | None,
                      stop: threading.Event | None) -> DumpResult:
    """One table, in a snapshot of its own (so its metadata lock is held only while it is
    read); a new snapshot if the table changed while the first one opened."""
    for attempt in range(1, 6):
        try:
            snapshot = Snapshot(address, table)
        except DefinitionChanged as exc:
            if attempt == 5:
                raise SourceError(f"{exc}; gave up after {attempt} snapshots") from exc
            log.info("%s; opening a new snapshot", exc)
            continue
        except pymysql.MySQLError as exc:
            raise SourceError(f"{table}: {exc}") from exc
        try:
            log.info("dump of %s: snapshot at %s:%d (GTID %s)", table, snapshot.point.file,
                     snapshot.point.pos, snapshot.point.gtid)
            return _dump_table(snapshot, data_dir, table, stream_version, options,
                               progressed, stop)
        except pymysql.MySQLError as exc:
            raise SourceError(f"the dump of {table} failed: {exc}") from exc
        finally:
            snapshot.close()
    raise AssertionError("unreachable")


@contextlib.contextmanager
def table_lock(directory: str, table: TableName) -> Iterator[None]:
    """Held while a table is being dumped; raises DumpBusy if another dump holds it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{dump_stem(table)}.lock")
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DumpBusy(f"a dump of {table} is already running") from None
        yield


def _load_catalog(data_dir: str) -> Catalog:
    catalog = Catalog(DataDir(data_dir).avro)
    if os.path.isdir(catalog.avro_dir):
        catalog.load()
    return catalog


def newest_versions(catalog: Catalog, tables: list[TableName]) -> dict[TableName, int]:
    found = {}
    for table in tables:
        entry = catalog.get(table)
        latest = entry.latest() if entry else None
        found[table] = latest.version if latest else 0
    return found


def _dump_table(snapshot: Snapshot, data_dir: str, table: TableName, stream_version: int,
                options: DumpOptions, progressed: Progressed | None,
                stop: threading.Event | None) -> DumpResult:
    started = time.monotonic()
    point = snapshot.point
    source, transactional = snapshot.definition()
    definition = project_definition(table, source, options.columns)  # as the rules store it
    schema = TableSchema.from_layout(layout_of(table, definition), max(stream_version, 1),
                                     str(point.gtid))
    plan = ScanPlan(table, definition, schema.columns, options.columns.salt)
    fields = schema.avsc["fields"][6:]
    fingerprint = hashlib.sha256(json.dumps([fields, schema.avsc.get("primary_key")],
                                            sort_keys=True).encode()).hexdigest()
    partial = PartialDump(files.dump_dir(data_dir), table)
    try:
        progress = _resume(partial, snapshot, data_dir, table, fields, fingerprint, plan,
                           options)
        if progress is None:
            progress = Progress(table, point.to_json(), fingerprint, stream_version,
                                _reserve(schema, point, definition), consistent=transactional)
            partial.create(progress)
        else:
            progress.stream_version = min(progress.stream_version, stream_version)
            progress.consistent = progress.consistent and transactional
        _read_rows(snapshot, plan, partial, progress, options, progressed, stop)
        if progress.resumed:
            progress.rows = snapshot.count()
        header = _header(table, schema, point, progress, definition)
        path = partial.finish(header, files.new_name(table, point.taken))
    finally:
        partial.close()
    log.info("dumped %s: %d rows, %d bytes in %.1fs%s", table, progress.rows,
             os.path.getsize(path), time.monotonic() - started,
             " (resumed)" if progress.resumed else "")
    info = files.read_info(path)
    return DumpResult(info, progress.resumed, time.monotonic() - started)


def _resume(partial: PartialDump, snapshot: Snapshot, data_dir: str, table: TableName,
            fields: list[dict[str, Any]], fingerprint: str, plan: ScanPlan,
            options: DumpOptions) -> Progress | None:
    """Continue an interrupted attempt in this snapshot, or None to start over."""
    progress = partial.load_progress()
    if progress is None or not os.path.exists(partial.path):
        return None
    why = None
    if options.restart:
        why = "--restart was given"
    elif progress.fields != fingerprint:
        why = "the table's columns changed"
    elif not plan.chunked or progress.key is None:
        why = "the table has no primary key to continue from" if not plan.chunked \
            else "no chunk was finished"
    if why is None:
        before = SnapshotPoint.from_json(progress.snapshot)
        point = snapshot.point
        try:
            operations = list(fixups.changes_between(
                data_dir, table, fields, before.gtid, point.gtid, (point.file, point.pos),
                options.config.store_timeout))
        except fixups.Unavailable as exc:
            why = f"the changes since the interrupted snapshot are not available: {exc}"
    if why is not None:
        log.info("dump of %s: starting over (%s)", table, why)
        partial.discard()
        return None
    log.info("dump of %s: continuing after %d rows, with %d operations of changes made "
             "since %s", table, progress.rows, len(operations), before.gtid)
    partial.reopen(progress)
    for line in operations:
        partial.write(line)
    progress.snapshot = snapshot.point.to_json()
    progress.resumed = True
    partial.checkpoint()
    return progress


def _read_rows(snapshot: Snapshot, plan: ScanPlan, partial: PartialDump, progress: Progress,
               options: DumpOptions, progressed: Progressed | None,
               stop: threading.Event | None) -> None:
    for item in plan.read(snapshot.conn, progress.key_values(), options.config.chunk_rows,
                          options.config.batch_rows):
        if stop is not None and stop.is_set():
            raise DumpInterrupted(f"the dump of {plan.table} was interrupted after "
                                  f"{progress.rows} rows; it continues next time")
        if isinstance(item, ChunkEnd):
            if item.key is not None:
                progress.key = [v.hex() for v in item.key]
                partial.checkpoint()
            if progressed is not None:
                progressed(plan.table, progress.rows)
            continue
        line, rows, _ = item
        partial.write(line)
        progress.rows += rows


def _reserve(schema: TableSchema, point: SnapshotPoint, definition: TableDefinition) -> int:
    """Room for the final header: its size with today's values, plus slack for a longer GTID
    state or counts after a resume."""
    sample = json.dumps({"schema": schema.avsc, "gtid": str(point.gtid),
                         "definition": definition.to_json()})
    return len(sample.encode("utf-8")) + HEADER_SLACK


def _header(table: TableName, schema: TableSchema, point: SnapshotPoint, progress: Progress,
            definition: TableDefinition) -> dict[str, Any]:
    avsc = {**schema.avsc, "version": max(progress.stream_version, 1), "gtid": str(point.gtid)}
    return {"format": FORMAT, "database": table.database, "table": table.table,
            "gtid": str(point.gtid), "binlog": {"file": point.file, "pos": point.pos},
            "rows": progress.rows, "created": point.taken.astimezone(dt.UTC).isoformat(),
            "stream_version": progress.stream_version, "consistent": progress.consistent,
            "resumed": progress.resumed, "schema": avsc,
            "definition": definition.to_json()}
