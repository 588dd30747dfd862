"""The store's flush, the part that runs in a thread: what the store committed made durable,
then the checkpoint; and the mark the checkpoint keeps of each table.

The order is the store's promise (:mod:`cdcserver.store.store`): the version files first, their
directory when files were created, the index, and only then the checkpoint, so a checkpoint
never covers data a crash could take back.
"""

from __future__ import annotations

import sqlite3

from cdcserver.core.durable import fsync_dir
from cdcserver.core.errors import DiskFull, StoreDamaged
from cdcserver.core.names import TableName
from cdcserver.store.avrofile import VersionFileWriter
from cdcserver.store.catalog import TableEntry
from cdcserver.store.checkpoint import Checkpoint, CheckpointWriter, TableMark
from cdcserver.store.faults import disk_failed, disk_full
from cdcserver.store.index import StoreIndex


def make_durable(data_dir: str, dirty: list[VersionFileWriter], new_files_in: str | None,
                 index: StoreIndex, checkpoints: CheckpointWriter, checkpoint: Checkpoint,
                 marks: dict[TableName, TableMark | None]) -> None:
    """Fsync the ``dirty`` writers (and ``new_files_in``, the directory that has new files),
    persist the index, write the checkpoint. A full disk is :class:`DiskFull`; a failing one
    (any failed fsync, an I/O error, a read-only file system) :class:`StoreDamaged`."""
    for writer in dirty:
        try:
            writer.fsync()
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the pages: retrying could
            # "succeed" without the data. No checkpoint may follow; the service starts
            # over from the last one.
            raise StoreDamaged(f"fsync of {writer.path} failed ({exc.strerror})") from exc
    try:
        if new_files_in is not None:
            fsync_dir(new_files_in)
        index.persist()
        checkpoints.write(checkpoint, marks)
    except (OSError, sqlite3.Error) as exc:
        fault = _disk_fault(data_dir, exc)
        if fault is None:
            raise
        raise fault from exc


def _disk_fault(data_dir: str, exc: OSError | sqlite3.Error) -> Exception | None:
    """What a failed index or checkpoint write means: a full disk, a failing one, or (None)
    neither, raised as it is."""
    what = exc.strerror if isinstance(exc, OSError) else str(exc)
    if disk_full(exc):
        return DiskFull(f"{data_dir}: {what}; checkpoint not written")
    if disk_failed(exc):
        return StoreDamaged(f"{data_dir}: {what}; checkpoint not written")
    return None


def table_mark(entry: TableEntry | None) -> TableMark | None:
    """A table's mark in the checkpoint: its newest version and that version's committed
    size (None: no version is left)."""
    latest = entry.latest() if entry is not None else None
    return None if latest is None else TableMark(latest.version, latest.committed)
