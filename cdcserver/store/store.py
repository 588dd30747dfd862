"""The Avro store: per-table versioned container files, written transaction by transaction.

Write path for one transaction: ``begin`` remembers the GTID; ``rows`` encodes each row event
into the block buffer of its table's current version (a layout whose Avro fields differ from the
current version's starts a new version, invisible until commit); a buffer over ``block_size`` is
written out as a block; ``commit`` writes the last blocks, then publishes the new committed sizes
and versions to the :class:`Catalog` and wakes the readers. Memory stays bounded by one block per
table touched, whatever the transaction's size.

Durability is group-committed: ``flush()`` fsyncs the files written since the last flush,
persists the index, and only then writes the checkpoint (binlog position + newest version and
committed size per table). ``open()`` repairs the directory back to the checkpoint, so a
``kill -9`` at any instant loses nothing and duplicates nothing: the binlog is replayed from
the checkpoint and produces the same bytes again.

**One table's problem is that table's.** A change the store cannot write for a table (a value
its encoder refuses, a file it cannot create, rows that do not decode) quarantines the table
(:meth:`AvroStore.quarantine`): the table's part of the open transaction is rolled back, its
later changes are not stored, its readers are told in-band where its stream stops, and every
other table goes on; the checkpoint holds the quarantine, so a restart keeps it. So does a
:class:`~cdcserver.core.changes.Quarantine` marker from the repair stage. A
:class:`~cdcserver.core.changes.Release` (the resync the repair stage made) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cdcserver.core.capture import RULED_STATEMENT
from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    EventType,
    Quarantine,
    Release,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.durable import fsync_dir, outlast, write_atomically
from cdcserver.core.errors import DiskFull, StoreError, UndecodableEvent
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.names import TableName
from cdcserver.store import checkpoint as ckpt
from cdcserver.store import recovery
from cdcserver.store.avrofile import (
    Header,
    OpenFiles,
    VersionFileWriter,
)
from cdcserver.store.catalog import Catalog, TableEntry, VersionInfo
from cdcserver.store.checkpoint import Checkpoint, Quarantined, TableMark
from cdcserver.store.encoder import RecordsEncoder, compile_encoder, record_head, record_tail
from cdcserver.store.index import StoreIndex, TransactionInfo
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import MAX_VERSION
from cdcserver.store.schema import TableSchema
from cdcserver.store.transcoder import Transcoder, compile_transcoder, records
from mariadb_cdc_client.format.names import table_ref

log = logging.getLogger(__name__)


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What writing one table's change can raise that concerns that table only: a value its
# encoder does not take, rows that do not decode, a file of its own that cannot be created or
# written (a name, a permission). Not a full or failing disk, which every table shares.
_TABLE_FAULTS = (TypeError, ValueError, OverflowError, ArithmeticError, KeyError, IndexError,
                 AttributeError, struct.error, UndecodableEvent, StoreError, OSError)
_SHARED_ERRNOS = (*DISK_FULL_ERRNOS, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE,
                  errno.ENOMEM)

class TableFault(StoreError):
    """One table cannot be stored any more (it used up its version numbers...)."""


_TAILS = {RowsKind.INSERT: (EventType.INSERT, EventType.INSERT),
          RowsKind.DELETE: (EventType.DELETE, EventType.DELETE),
          RowsKind.UPDATE: (EventType.UPDATE_BEFORE, EventType.UPDATE_AFTER)}


@dataclass
class _Target:
    """A table version being written by the open transaction."""

    info: VersionInfo
    writer: VersionFileWriter
    start: int  # where this transaction's data for the version begins
    new: bool  # the version was created by this transaction


@dataclass
class _Route:
    """Where rows decoded with one table layout go, and how they are encoded."""

    layout: TableLayout
    info: VersionInfo
    encode: RecordsEncoder
    transcode: Transcoder | None  # the compiled path, for rows handed over as images


@dataclass(frozen=True)
class StoreStats:
    """What the store has written, for /metrics and /health."""

    records_written: int
    checkpoint_age: float  # seconds the oldest applied transaction has waited for one
    tables: int
    versions: dict[TableName, int]  # the newest version of each table
    quarantined: list[dict[str, object]] = field(default_factory=list)  # their to_json


@dataclass
class _Open:
    begin: Begin
    head: bytes
    event_no: int = 1
    targets: dict[tuple[TableName, int], _Target] = field(default_factory=dict)
    created: dict[TableName, VersionInfo] = field(default_factory=dict)  # new versions
    fresh: dict[TableName, bool] = field(default_factory=dict)  # re-created: True, served: False
    notes: list[tuple[VersionInfo, int, str]] = field(default_factory=list)  # repair blocks
    # each table's records and the highest event number among them
    counts: dict[TableName, tuple[int, int]] = field(default_factory=dict)


class AvroStore:
    name = "avro"

    def __init__(self, data_dir: str, catalog: Catalog, *, codec: str = "null",
                 block_size: int = 64 * 1024, max_open_files: int = 256) -> None:
        self.data_dir = data_dir
        self.layout = DataDir(data_dir)
        self.avro_dir = self.layout.avro
        self.state_dir = self.layout.state
        self.checkpoint_path = self.layout.checkpoint
        self.catalog = catalog
        self.codec = codec
        self.block_size = block_size
        self.index: StoreIndex | None = None
        self.position: BinlogPosition | None = None  # after the last committed transaction
        self.durable: BinlogPosition | None = None  # what the checkpoint covers
        self.records_written = 0  # since start, for the metrics
        self._undurable_since: float | None = None  # monotonic: first commit not durable yet
        self.origin: BinlogPosition | None = None  # where the store began replicating
        self._writers: dict[tuple[TableName, int], VersionFileWriter] = {}
        self._files = OpenFiles(max_open_files)  # of the writers: the rest are parked
        self._routes: dict[int, _Route] = {}
        self._fresh: set[TableName] = set()  # re-created tables awaiting their first rows
        self._retired: list[VersionFileWriter] = []  # to close once no flush can use them
        # Writers that may belong to a table's older version, to close after a flush (the
        # flush looks at these, not at every table's writer)
        self._maybe_sealed: set[tuple[TableName, int]] = set()
        self._checkpoints: ckpt.CheckpointWriter | None = None  # set by open()
        self._headers: dict[str, Header] = {}  # read by open()'s recovery, for the catalog
        self._open: _Open | None = None
        self.quarantined: dict[TableName, Quarantined] = {}  # restored from the checkpoint
        self._lock_fd = -1
        self._new_files = False
        self._flush_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> Checkpoint | None:
        """Lock the data directory, repair it back to the checkpoint, load the catalog."""
        os.makedirs(self.avro_dir, exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        self._lock_directory()
        self.index = StoreIndex(self.layout.index)
        checkpoint = ckpt.load(self.checkpoint_path)
        recovery.recover(self.layout, self.index, self._headers, checkpoint)
        if checkpoint is None:  # a new directory: checkpoint "nothing" before any data
            checkpoint = Checkpoint(None)
            ckpt.save(self.checkpoint_path, checkpoint)
        self.catalog.load(self._headers)
        self._headers = {}
        self.index.name_tables(self._stored_table)  # an older index's, once
        self._checkpoints = ckpt.CheckpointWriter(self.checkpoint_path, checkpoint)
        for entry in self.catalog.tables.values():
            for info in entry.versions.values():
                info.notes = self.index.notes(info.table, info.version)
        self.position = self.durable = checkpoint.position
        self._fresh = set(checkpoint.fresh)
        self.origin = checkpoint.origin
        self.quarantined = dict(checkpoint.quarantined)
        for table, why in self.quarantined.items():
            self.catalog.quarantine(table, why)
            log.warning("%s is quarantined since %s: %s", table, why.since, why.cause)
        return checkpoint

    def set_origin(self, position: BinlogPosition) -> None:
        """Record where a new store starts replicating (kept in every checkpoint)."""
        if self.position is None and self.origin is None:
            self.origin = position

    def close(self) -> None:
        for writer in [*self._writers.values(), *self._retired]:
            writer.close()
        self._writers.clear()
        self._retired.clear()
        if self.index is not None:
            self.index.close()
            self.index = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _lock_directory(self) -> None:
        """The data directory's writer lock. Held by another process for a second: in use
        (a dump may hold it shared for an instant to see whether a service runs)."""
        path = self.layout.writer_lock
        self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + 1.0
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(self._lock_fd)
                self._lock_fd = -1
                raise StoreError(f"{self.data_dir} is in use by another cdcserver process") \
                    from None

    # -- the sink interface ------------------------------------------------------------

    async def apply(self, changes: list[Change]) -> None:
        self.apply_now(changes)

    def apply_now(self, changes: list[Change]) -> None:
        try:
            self._apply(changes)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            self.abort(Abort("the data directory is full"))
            raise DiskFull(f"{self.data_dir}: {exc.strerror}") from exc

    def _apply(self, changes: list[Change]) -> None:
        for change in changes:
            if isinstance(change, Rows):
                table = TableName(change.layout.database, change.layout.table)
                if table not in self.quarantined:
                    self._confined(table, self.rows, change)
            elif isinstance(change, Begin):
                self.begin(change)
            elif isinstance(change, Commit):
                self.commit(change)
            elif isinstance(change, Ddl):
                self.ddl(change)
            elif isinstance(change, Abort):
                self.abort(change)
            elif isinstance(change, Quarantine):
                self.quarantine(TableName(change.database, change.table), change.cause)
            elif isinstance(change, Release):
                self.release(TableName(change.database, change.table), change.note)

    def _confined(self, table: TableName, write: Callable[[Any], None], change: Any) -> None:
        """Write one table's change; a fault that concerns that table only quarantines it."""
        try:
            write(change)
        except _TABLE_FAULTS as exc:
            if isinstance(exc, OSError) and exc.errno in _SHARED_ERRNOS:
                raise
            if isinstance(exc, StoreError) and not isinstance(exc, TableFault):
                raise
            log.exception("%s: the store cannot write this change", table)
            self.quarantine(table, f"{type(exc).__name__}: {exc}")

    # -- quarantine ----------------------------------------------------------------------

    def quarantine(self, table: TableName, cause: str) -> None:
        """Stop storing ``table``'s changes from the open transaction on (see the module's
        description); its part of that transaction is rolled back."""
        txn = self._open
        if txn is not None:
            self._drop_from(txn, table)
        self._drop_table_routes(table)
        previous = self.quarantined.get(table)
        if previous is not None:  # a resync failed: the stream still stops where it did
            self.quarantined[table] = why = replace(previous, cause=cause)
            self.catalog.quarantine(table, why)
            log.warning("%s stays quarantined: %s", table, cause)
            return
        since = str(txn.begin.gtid) if txn is not None else \
            str(self.position.gtid_state) if self.position else ""
        why = Quarantined(cause, since, time.time())
        self.quarantined[table] = why
        self.catalog.quarantine(table, why)
        self.catalog.changed.add(table)
        log.error("%s quarantined: %s. Its stream stops at transaction %s; every other "
                  "table goes on. The service resyncs it by itself once it can be read "
                  "again (`cdcserver resync %s` asks at once).", table, cause, since,
                  table_ref(table.database, table.table))

    def release(self, table: TableName, note: str) -> None:
        """Store ``table``'s changes again (its resync follows in this transaction)."""
        if self.quarantined.pop(table, None) is not None:
            self.catalog.quarantine(table, None)
            self.catalog.changed.add(table)
            log.warning("%s: released from quarantine (%s)", table, note)

    def _delete_version(self, table: TableName, version: int) -> None:
        assert self.index is not None
        recovery.delete_version(self.layout, self.index, table, version)

    def _drop_from(self, txn: _Open, table: TableName) -> None:
        """Undo what the open transaction wrote of ``table``."""
        for key in [k for k in txn.targets if k[0] == table]:
            target = txn.targets.pop(key)
            target.writer.rollback()
            if target.new:
                self._retired.append(self._writers.pop(key))
                self._delete_version(*key)
        txn.created.pop(table, None)
        txn.fresh.pop(table, None)
        txn.notes = [note for note in txn.notes if note[0].table != table]

    def begin(self, begin: Begin) -> None:
        if self._open is not None:
            raise StoreError(f"transaction {begin.gtid} begins inside {self._open.begin.gtid}")
        gtid = begin.gtid
        self._open = _Open(begin, record_head(gtid.domain, gtid.server_id, gtid.sequence))

    def rows(self, rows: Rows) -> None:
        txn = self._require_open()
        route = self._routes.get(id(rows.layout))
        if route is None or route.layout is not rows.layout or route.info.sealed:
            route = self._route(rows.layout, txn)
        target = self._target(txn, route.info)
        kinds = _TAILS[rows.kind]
        tails = (record_tail(rows.timestamp, kinds[0]), record_tail(rows.timestamp, kinds[1]))
        writer = target.writer
        if rows.repair:  # a block of its own, so the stream can say why it is there
            writer.end_block()
            txn.notes.append((target.info, writer.size, rows.repair))
        avro = None
        if rows.images is not None and route.transcode is not None:
            avro = route.transcode.rows(*rows.images)
        if avro is not None:
            txn.event_no = records(writer.buffer, txn.head, tails, *avro, txn.event_no)
            count = len(avro[1]) // 4
        else:
            txn.event_no = route.encode(writer.buffer, txn.head, tails, rows.rows, txn.event_no)
            count = len(rows.rows)
        writer.count += count
        self.records_written += count
        table = route.info.table
        before, _ = txn.counts.get(table, (0, 0))
        txn.counts[table] = (before + count, txn.event_no - 1)
        if rows.repair or len(writer.buffer) >= self.block_size:
            writer.end_block()

    def ddl(self, ddl: Ddl) -> None:
        """Make what a schema statement did visible: each table it truncated, dropped,
        created or changed gets a new version whose schema's ``ddl`` key says so. A
        quarantined table's changes are not stored, but for its drop (it is gone, and with
        it the quarantine; a rename carries the quarantine to the new name)."""
        txn = self._require_open()
        for change in ddl.changes:
            table = TableName(change.database, change.table)
            why = self.quarantined.get(table)
            if why is not None:
                if change.kind != "drop":
                    continue
                self.release(table, f"dropped by {ddl.sql[:80]!r}")
                if change.renamed:
                    self.quarantine(TableName.parse(change.renamed), f"{why.cause} (renamed "
                                    f"from {table_ref(table.database, table.table)})")
            self._confined(table, lambda c: self._table_change(txn, ddl, c), change)

    def _table_change(self, txn: _Open, ddl: Ddl, change: TableChange) -> None:
        table = TableName(change.database, change.table)
        self._drop_table_routes(table)
        current = self._current_version(table, txn)
        about: dict[str, Any] = {"kind": change.kind, "statement": own_statement(ddl, change)}
        if change.layout is not None and change.layout.image is not None:
            about["statement"] = RULED_STATEMENT
        if change.note:
            about["note"] = change.note
        if change.renamed:
            about["renamed_to" if change.kind == "drop" else "renamed_from"] = change.renamed
        if change.rewrites:  # rows changed without row events: a repair follows
            about["rewrites"] = change.rewrites
        if change.renamed_columns:  # the rows stored before keep their values, renamed
            about["renamed_columns"] = dict(change.renamed_columns)
        if change.layout is not None:
            if change.kind == "create" or current is None or change.changed:
                self._new_version(table, txn, layout=change.layout, ddl=about)
        elif change.kind in ("truncate", "drop") and current is not None:
            self._new_version(table, txn, base=current.schema, ddl=about)
        elif change.kind == "create":
            txn.fresh[table] = True  # columns unknown: the next rows start a version

    def commit(self, commit: Commit) -> None:
        txn = self._require_open()
        assert self.index is not None
        touched: list[TableName] = []
        for target in txn.targets.values():
            target.writer.end_block()  # all the I/O first: a failure leaves nothing visible
        for (table, version), target in txn.targets.items():
            target.writer.commit()
            if target.new:
                self.catalog.publish(target.info)
            target.info.committed = target.writer.committed
            self.catalog.changed.add(table)
            self.index.note_block(table, version, target.start, txn.begin.gtid)
            touched.append(table)
        for info, offset, note in txn.notes:
            info.notes[offset] = note
            self.index.note_repair(info.table, info.version, offset, note)
        tables = tuple(dict.fromkeys(touched))
        self.index.note_transaction(TransactionInfo(
            txn.begin.gtid, txn.begin.timestamp, txn.event_no - 1, tables,
            commit.position.file, commit.position.pos,
            counts=tuple(txn.counts.get(t, (0, 0)) for t in tables)))
        for table, waiting in txn.fresh.items():
            if waiting:
                self._fresh.add(table)
            else:
                self._fresh.discard(table)
        self.position = commit.position
        if self._undurable_since is None:
            self._undurable_since = time.monotonic()
        self._open = None
        self.catalog.notify(touched)

    def abort(self, abort: Abort) -> None:
        txn, self._open = self._open, None
        if txn is None:
            return
        log.warning("discarding transaction %s: %s", txn.begin.gtid, abort.reason)
        for (table, version), target in txn.targets.items():
            target.writer.rollback()
            if target.new:
                # A flush in progress may be fsyncing it: close it after the next flush.
                self._retired.append(self._writers.pop((table, version)))
                self._delete_version(table, version)
        created = [t.info for t in txn.targets.values() if t.new]
        self._drop_routes(lambda info: any(info is c for c in created))

    def _require_open(self) -> _Open:
        if self._open is None:
            raise StoreError("row data outside a transaction")
        return self._open

    # -- versions ----------------------------------------------------------------------

    def _route(self, layout: TableLayout, txn: _Open) -> _Route:
        """Pick the version rows of ``layout`` belong to: the table's current version if its
        Avro fields are the same, otherwise a new version."""
        table = TableName(layout.database, layout.table)
        candidate = TableSchema.from_layout(layout, 1, "")
        current = self._current_version(table, txn)
        fresh = txn.fresh.get(table, table in self._fresh)
        if current is not None and not fresh and _same_columns(current.schema, candidate):
            info = current
        else:
            info = self._new_version(table, txn, base=candidate)
            if fresh:
                txn.fresh[table] = False
        fields = info.schema.columns
        route = _Route(layout, info, compile_encoder(fields, layout.columns),
                       compile_transcoder(fields, layout.image_columns, layout.salt))
        self._routes[id(layout)] = route
        return route

    def _current_version(self, table: TableName, txn: _Open) -> VersionInfo | None:
        if table in txn.created:
            return txn.created[table]
        entry = self.catalog.get(table)
        return entry.latest() if entry else None

    def _target(self, txn: _Open, info: VersionInfo) -> _Target:
        key = (info.table, info.version)
        target = txn.targets.get(key)
        if target is None:
            writer = self._writer(info)
            new = txn.created.get(info.table) is info
            target = txn.targets[key] = _Target(info, writer, writer.size, new)
        return target

    def _new_version(self, table: TableName, txn: _Open, *, layout: TableLayout | None = None,
                     base: TableSchema | None = None, ddl: dict[str, Any] | None = None
                     ) -> VersionInfo:
        """Create the next version of ``table``, from a layout or with ``base``'s columns;
        it becomes visible when the transaction commits."""
        current = self._current_version(table, txn)
        version = 1 if current is None else current.version + 1
        if version > MAX_VERSION:
            raise TableFault(f"{table} has reached the last version number {MAX_VERSION}")
        gtid = str(txn.begin.gtid)
        if layout is not None:
            schema = TableSchema.from_layout(layout, version, gtid, ddl)
        else:
            assert base is not None
            schema = base.successor(version, gtid, ddl)
        avsc_path = self.layout.table_file(table, version, "avsc")
        path = self.layout.table_file(table, version, "avro")
        try:
            write_atomically(avsc_path, schema.text().encode("utf-8") + b"\n")
            writer = VersionFileWriter.create(path, schema.text(), self.codec, self._files)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(avsc_path)
            raise
        self._writers[(table, version)] = writer
        self._maybe_sealed.add((table, version))
        if current is not None:
            self._maybe_sealed.add((table, current.version))  # sealed once this commits
        self._new_files = True
        self._drop_table_routes(table)
        log.info("%s: version %d (transaction %s%s)", table, version, gtid,
                 f", {ddl['kind']}" if ddl else "")
        info = VersionInfo(table, version, schema, path, writer.header, writer.size)
        txn.created[table] = info
        txn.targets[(table, version)] = _Target(info, writer, writer.size, True)
        return info

    def _writer(self, info: VersionInfo) -> VersionFileWriter:
        key = (info.table, info.version)
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = VersionFileWriter.known(
                info.path, info.header, info.committed, self._files)
            self._maybe_sealed.add(key)
        return writer

    def _drop_table_routes(self, table: TableName) -> None:
        self._routes = {k: r for k, r in self._routes.items() if r.info.table != table}

    def _drop_routes(self, matches: Callable[[VersionInfo], bool]) -> None:
        self._routes = {k: r for k, r in self._routes.items() if not matches(r.info)}

    # -- durability --------------------------------------------------------------------

    async def persist_index(self) -> None:
        """Write the index's new entries without a checkpoint (while none may be written: a
        repair waits). A start drops the entries past its checkpoint (``recovery``), and
        the entries do not pile up in memory with every transaction meanwhile."""
        async with self._flush_lock:
            if self.index is not None:
                await asyncio.to_thread(self.index.persist)

    async def flush(self) -> BinlogPosition | None:
        """Make everything committed so far durable, then write the checkpoint."""
        async with self._flush_lock:
            position = self.position
            if position is None or position == self.durable:
                return self.durable
            dirty = list(self._files.dirty)
            for writer in dirty:
                writer.dirty = False
            changed, self.catalog.changed = self.catalog.changed, set()
            marks = {name: _mark(self.catalog.get(name)) for name in changed}
            new_files, self._new_files = self._new_files, False
            assert self.index is not None
            checkpoint = Checkpoint(position, fresh=frozenset(self._fresh),
                                    origin=self.origin, index_ordinal=self.index.last_id,
                                    quarantined=dict(self.quarantined))
            work = asyncio.ensure_future(asyncio.to_thread(
                self._make_durable, dirty, new_files, checkpoint, marks))
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                # The thread cannot be cancelled: hold the lock until it is done, so two
                # checkpoint writes never overlap, however often this task is cancelled
                # meanwhile. Its own failure must not replace the cancellation (a caller
                # that retries failures would never stop).
                await outlast(work)
                if work.exception() is not None:
                    self._not_durable(dirty, new_files, changed)
                raise
            except BaseException:
                self._not_durable(dirty, new_files, changed)
                raise
            self.durable = position
            if self.position == position:
                self._undurable_since = None
            self._close_sealed()
            return position

    def _stored_table(self, text: str) -> TableName:
        """A table an older index named as "db.table": split at the dot that gives a table
        the store holds (a name may hold dots), else at the first."""
        splits = (TableName(text[:i], text[i + 1:]) for i, c in enumerate(text) if c == ".")
        return next((t for t in splits if t in self.catalog.tables), None) or \
            TableName.parse(text)

    def stats(self) -> StoreStats:
        versions = {}
        for name, entry in self.catalog.tables.items():
            latest = entry.latest()
            if latest is not None:
                versions[name] = latest.version
        return StoreStats(self.records_written, self.checkpoint_age(),
                          len(self.catalog.tables), versions,
                          [q.to_json(t) for t, q in sorted(self.quarantined.items())])

    def checkpoint_age(self) -> float:
        """Seconds the oldest applied transaction not yet covered by the checkpoint has
        waited (0 when the checkpoint covers everything applied)."""
        since = self._undurable_since
        return 0.0 if since is None else time.monotonic() - since

    def _not_durable(self, dirty: list[VersionFileWriter], new_files: bool,
                     changed: set[TableName]) -> None:
        for writer in dirty:  # still not known to be on disk
            writer.dirty = True
        self._new_files |= new_files
        self.catalog.changed |= changed  # their marks go into the next checkpoint

    def _make_durable(self, dirty: list[VersionFileWriter], new_files: bool,
                      checkpoint: Checkpoint, marks: dict[TableName, TableMark | None]
                      ) -> None:
        assert self.index is not None and self._checkpoints is not None
        for writer in dirty:
            try:
                writer.fsync()
            except OSError as exc:
                # After a failed fsync the kernel may have dropped the pages: retrying could
                # "succeed" without the data. Stop; a restart recovers from the checkpoint.
                raise StoreError(f"fsync of {writer.path} failed ({exc.strerror}); restart "
                                 "the service to recover from the checkpoint") from exc
        if new_files:
            fsync_dir(self.avro_dir)
        try:
            self.index.persist()
            self._checkpoints.write(checkpoint, marks)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            raise DiskFull(f"{self.data_dir}: {exc.strerror}; checkpoint not written") from exc
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
                raise
            raise DiskFull(f"{self.data_dir}: the index's disk is full; checkpoint not "
                           "written") from exc

    def _close_sealed(self) -> None:
        """After a flush: close the writers no transaction will write again."""
        for retired in self._retired:
            retired.close()
        self._retired.clear()
        for key in list(self._maybe_sealed):
            writer = self._writers.get(key)
            entry = self.catalog.get(key[0])
            latest = entry.latest() if entry else None
            if writer is None or (latest is not None and latest.version == key[1]):
                self._maybe_sealed.discard(key)  # gone, or the newest: a new version adds it
            elif latest is not None and not writer.dirty \
                    and (self._open is None or key not in self._open.targets):
                writer.close()
                del self._writers[key]
                self._maybe_sealed.discard(key)



def own_statement(ddl: Ddl, change: TableChange) -> str:
    """The statement as a version of ``change``'s table shows it. One that renamed or
    dropped several tables is told as its part for this table alone (``RENAME TABLE a TO
    b``, ``DROP TABLE a``): a user who may read one table does not learn the others'
    names from its schema."""
    own = {(change.database, change.table), tuple(change.renamed.partition(".")[::2])}
    named = {(c.database, c.table) for c in ddl.changes}
    if ddl.kind not in ("rename", "drop") or named <= own:
        return ddl.sql
    this = _quoted(change.database, change.table)
    if change.renamed:
        other = _quoted(*change.renamed.partition(".")[::2])
        return f"RENAME TABLE {this} TO {other}" if change.kind == "drop" else \
            f"RENAME TABLE {other} TO {this}"
    return f"DROP TABLE {this}"


def _quoted(database: str, table: str) -> str:
    return ".".join("`" + name.replace("`", "``") + "`" for name in (database, table))

def _mark(entry: TableEntry | None) -> TableMark | None:
    """A table's mark in the checkpoint: its newest version and that version's committed
    size (None: no version is left)."""
    latest = entry.latest() if entry is not None else None
    return None if latest is None else TableMark(latest.version, latest.committed)


def _same_columns(current: TableSchema, candidate: TableSchema) -> bool:
    return (current.avsc["fields"] == candidate.avsc["fields"]
            and current.avsc.get("primary_key") == candidate.avsc.get("primary_key"))
