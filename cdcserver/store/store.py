"""The Avro store: per-table versioned container files, written transaction by transaction.

Write path for one transaction: ``begin`` remembers the GTID; ``rows`` encodes each row event
into the block buffer of its table's current version (a layout whose Avro fields differ from the
current version's starts a new version, invisible until commit); a buffer over ``block_size`` is
written out as a block; ``commit`` writes the last blocks, then publishes the new committed sizes
and versions to the :class:`Catalog` and wakes the readers. Memory stays bounded by one block per
table touched, whatever the transaction's size.
(The version files, and which of them rows go to, are :mod:`cdcserver.store.versions`.)

Durability is group-committed: ``flush()`` fsyncs the files written since the last flush,
persists the index, and only then writes the checkpoint (binlog position + newest version and
committed size per table). ``open()`` repairs the directory back to the checkpoint, so a
``kill -9`` at any instant loses nothing and duplicates nothing: the binlog is replayed from
the checkpoint and produces the same bytes again. (The flush's part in a thread is
:mod:`cdcserver.store.durability`.) A disk that fails under it (an ``EIO``, a read-only file
system, a failed fsync) leaves the store *damaged*: it writes nothing more, no checkpoint
above all, and the service starts over from the checkpoint (:mod:`cdcserver.app.recovering`).

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
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cdcserver.core.changes import Abort, Begin, Change, Commit, Ddl, Quarantine, Release, Rows
from cdcserver.core.durable import outlast
from cdcserver.core.errors import DiskFull, StoreDamaged, StoreError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.names import TableName
from cdcserver.store import checkpoint as ckpt
from cdcserver.store import recovery
from cdcserver.store.avrofile import Header, VersionFileWriter
from cdcserver.store.catalog import Catalog
from cdcserver.store.checkpoint import Checkpoint, Quarantined
from cdcserver.store.durability import make_durable, table_mark
from cdcserver.store.encoder import record_head
from cdcserver.store.faults import (
    DISK_FULL_ERRNOS,
    TABLE_FAULTS,
    concerns_one_table,
    disk_failed,
)
from cdcserver.store.index import StoreIndex
from cdcserver.store.layout import DataDir
from cdcserver.store.transactionlog import TransactionInfo
from cdcserver.store.versionnote import version_note
from cdcserver.store.versions import OpenTransaction, VersionFiles
from cdcserver.store.writerlock import lock_for_writing
from mariadb_cdc_client.format.names import table_ref

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreStats:
    """What the store has written, for /metrics and /health."""

    records_written: int
    checkpoint_age: float  # seconds the oldest applied transaction has waited for one
    tables: int
    versions: dict[TableName, int]  # the newest version of each table
    quarantined: list[dict[str, object]] = field(default_factory=list)  # their to_json


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
        self.versions = VersionFiles(self.layout, catalog, codec=codec, block_size=block_size,
                                     max_open_files=max_open_files)
        self._checkpoints: ckpt.CheckpointWriter | None = None  # set by open()
        self._headers: dict[str, Header] = {}  # read by open()'s recovery, for the catalog
        self._open: OpenTransaction | None = None
        self.quarantined: dict[TableName, Quarantined] = {}  # restored from the checkpoint
        self._lock_fd = -1
        self._flush_lock = asyncio.Lock()
        self.damaged = ""  # why the disk cannot be trusted since the checkpoint (StoreDamaged)

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> Checkpoint | None:
        """Lock the data directory, repair it back to the checkpoint, load the catalog."""
        os.makedirs(self.avro_dir, exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        self._lock_fd = lock_for_writing(self.layout.writer_lock, self.data_dir)
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
        self.versions.fresh = set(checkpoint.fresh)
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
        self.versions.close()
        if self.index is not None:
            self.index.close()
            self.index = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- the sink interface ------------------------------------------------------------

    async def apply(self, changes: list[Change]) -> None:
        self.apply_now(changes)

    def apply_now(self, changes: list[Change]) -> None:
        self._refuse_if_damaged()
        try:
            self._apply(changes)
        except (OSError, sqlite3.Error) as exc:
            if disk_failed(exc):
                raise self._damaged_by(exc) from exc
            if not isinstance(exc, OSError) or exc.errno not in DISK_FULL_ERRNOS:
                raise
            self.abort(Abort("the data directory is full"))
            raise DiskFull(f"{self.data_dir}: {exc.strerror}") from exc

    def _damaged_by(self, exc: BaseException) -> StoreDamaged:
        """From now on the store writes nothing (see :class:`StoreDamaged`)."""
        if not self.damaged:
            what = exc.strerror if isinstance(exc, OSError) else str(exc)
            self.damaged = f"{self.data_dir}: {what}" if not isinstance(
                exc, StoreDamaged) else str(exc)
        return exc if isinstance(exc, StoreDamaged) else StoreDamaged(self.damaged)

    def _refuse_if_damaged(self) -> None:
        if self.damaged:
            raise StoreDamaged(f"{self.damaged} (the store writes nothing more until the "
                               "service starts over from its checkpoint)")

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
        except TABLE_FAULTS as exc:
            if not concerns_one_table(exc):
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
        self.versions.drop_table_routes(table)
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

    def _drop_from(self, txn: OpenTransaction, table: TableName) -> None:
        """Undo what the open transaction wrote of ``table``."""
        for key in [k for k in txn.targets if k[0] == table]:
            target = txn.targets.pop(key)
            target.writer.rollback()
            if target.new:
                self.versions.retire(key)
                self._delete_version(*key)
        txn.created.pop(table, None)
        txn.fresh.pop(table, None)
        txn.notes = [note for note in txn.notes if note[0].table != table]

    def begin(self, begin: Begin) -> None:
        if self._open is not None:
            raise StoreError(f"transaction {begin.gtid} begins inside {self._open.begin.gtid}")
        gtid = begin.gtid
        self._open = OpenTransaction(begin, record_head(gtid.domain, gtid.server_id, gtid.sequence))

    def rows(self, rows: Rows) -> None:
        self.records_written += self.versions.write_rows(self._require_open(), rows)

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
                if change.renamed is not None:
                    self.quarantine(change.renamed, f"{why.cause} (renamed "
                                    f"from {table_ref(table.database, table.table)})")
            self._confined(table, lambda c: self.versions.table_change(
                txn, c, version_note(ddl, c)), change)

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
                self.versions.fresh.add(table)
            else:
                self.versions.fresh.discard(table)
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
                self.versions.retire((table, version))
                self._delete_version(table, version)
        created = [t.info for t in txn.targets.values() if t.new]
        self.versions.drop_routes(lambda info: any(info is c for c in created))

    def _require_open(self) -> OpenTransaction:
        if self._open is None:
            raise StoreError("row data outside a transaction")
        return self._open

    # -- versions ----------------------------------------------------------------------

    # -- durability --------------------------------------------------------------------

    async def persist_index(self) -> None:
        """Write the index's new entries without a checkpoint (while none may be written: a
        repair waits). A start drops the entries past its checkpoint (``recovery``), and
        the entries do not pile up in memory with every transaction meanwhile."""
        async with self._flush_lock:
            self._refuse_if_damaged()
            if self.index is not None:
                try:
                    await asyncio.to_thread(self.index.persist)
                except (OSError, sqlite3.Error) as exc:
                    if disk_failed(exc):
                        raise self._damaged_by(exc) from exc
                    raise

    async def flush(self) -> BinlogPosition | None:
        """Make everything committed so far durable, then write the checkpoint."""
        async with self._flush_lock:
            self._refuse_if_damaged()
            position = self.position
            if position is None or position == self.durable:
                return self.durable
            dirty = list(self.versions.files.dirty)
            for writer in dirty:
                writer.dirty = False
            changed, self.catalog.changed = self.catalog.changed, set()
            marks = {name: table_mark(self.catalog.get(name)) for name in changed}
            new_files, self.versions.new_files = self.versions.new_files, False
            assert self.index is not None
            checkpoint = Checkpoint(position, fresh=frozenset(self.versions.fresh),
                                    origin=self.origin, index_ordinal=self.index.last_id,
                                    quarantined=dict(self.quarantined))
            assert self._checkpoints is not None
            work = asyncio.ensure_future(asyncio.to_thread(
                make_durable, self.data_dir, dirty, self.avro_dir if new_files else None,
                self.index, self._checkpoints, checkpoint, marks))
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                # The thread cannot be cancelled: hold the lock until it is done, so two
                # checkpoint writes never overlap, however often this task is cancelled
                # meanwhile. Its own failure must not replace the cancellation (a caller
                # that retries failures would never stop).
                await outlast(work)
                if work.exception() is not None:
                    self._not_durable(dirty, new_files, changed, work.exception())
                raise
            except BaseException as exc:
                self._not_durable(dirty, new_files, changed, exc)
                raise
            self.durable = position
            if self.position == position:
                self._undurable_since = None
            self.versions.close_sealed(self._open)
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
                     changed: set[TableName], exc: BaseException | None) -> None:
        if exc is not None and disk_failed(exc):
            self._damaged_by(exc)
        for writer in dirty:  # still not known to be on disk
            writer.dirty = True
        self.versions.new_files |= new_files
        self.catalog.changed |= changed  # their marks go into the next checkpoint
