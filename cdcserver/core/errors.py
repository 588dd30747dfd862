"""The service's exceptions.

Each component handles errors on purpose: a *retriable* error (the source went away, a broker
is down) backs off and resumes from the last checkpoint; anything else stops the component
loudly. Protocol errors sent to clients live in :mod:`cdcserver.protocol.grammar`.
"""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FAILED_ERRNOS = (errno.EIO, errno.EROFS)


class CdcError(Exception):
    """Base class of every error the service raises on purpose."""

    retriable = False


class ConfigError(CdcError):
    """The configuration or a command-line argument is invalid."""


class SourceError(CdcError):
    """The MariaDB/MySQL source cannot be replicated from."""


ER_TABLE_DEF_CHANGED = 1412  # "Table definition has changed, please retry transaction"


class DefinitionChanged(SourceError):
    """A table's definition changed after a consistent read (a snapshot, a repair's read
    view) was opened, so it cannot be read in it: open a new one and read again."""


class SourceUnavailable(SourceError):
    """The connection to the source failed or dropped: reconnect with backoff."""

    retriable = True


class SourceRefused(SourceError):
    """The server refused to replicate (its binlog does not hold the position asked for,
    access denied, a replica with the same server_id): retrying that server cannot help,
    another may."""


class BinlogPurged(SourceRefused):
    """The server no longer holds the binlog the stream needs next: the changes between
    are lost to it (``cdcserver resync`` is the way out)."""


class ServerIdInUse(SourceRefused):
    """Another replica reads the source with this service's server_id: the server keeps one
    connection per server_id, so the two would cut each other off forever."""


class UndecodableEvent(SourceError):
    """A binlog event the service cannot decode. Replication stops *before* the checkpoint
    passes the event, so nothing is skipped; fix the cause and restart."""

    def __init__(self, message: str, *, file: str = "", pos: int = 0) -> None:
        where = f" at {file}:{pos}" if file else ""
        super().__init__(f"{message}{where}")
        self.file = file
        self.pos = pos


class SchemaError(SourceError):
    """Row data cannot be matched to a known table layout."""


class StoreError(CdcError):
    """The data directory is unusable or inconsistent."""


class DiskFull(StoreError):
    """The data directory's file system is full (ENOSPC) or over quota (EDQUOT). The store
    undid the transaction it was writing; replication pauses until there is room again.
    ``needed``: bytes the failed work had written when the disk filled (a repair's scratch
    file), all of which it needs again, and more, before trying once more (0: unknown)."""

    retriable = True

    def __init__(self, message: str, needed: int = 0) -> None:
        super().__init__(message)
        self.needed = needed


class StoreDamaged(StoreError):
    """The data directory's disk failed under the store: an I/O error, a file system turned
    read-only, a failed fsync. What the store wrote since its checkpoint may not be on disk
    (after a failed fsync the kernel may have dropped the pages, and a later fsync would
    "succeed" without them), so the store writes nothing more, no checkpoint above all. Once
    the directory takes a write and an fsync again, the service starts over from its
    checkpoint, as after a restart (:mod:`cdcserver.app.recovering`)."""


def disk_refusal(what: str, exc: OSError) -> StoreError | None:
    """``exc`` as the store's errors say a refusal of the data directory's disk (full:
    :class:`DiskFull`, the runner pauses; failing: :class:`StoreDamaged`, the service starts
    over), naming ``what`` was being written; None for another error."""
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFull(f"{what} could not be written: {exc.strerror}")
    if exc.errno in DISK_FAILED_ERRNOS:
        return StoreDamaged(f"{what} could not be written: {exc.strerror}")
    return None


class SinkRewound(CdcError):
    """A sink lost what it had not committed (a Kafka transaction aborted) and stands again at
    its last commit: replication starts over from the sinks' checkpoints, at once."""


class PublisherFenced(CdcError):
    """Another instance publishes the same stream with the same transactional id: this one
    was fenced out and must not publish again (exactly one publishes)."""
