"""Which faults of the store concern one table, and which every table shares.

A change the store cannot write for one table (a value its encoder refuses, rows that do not
decode, a file of its own that cannot be created) quarantines that table and every other goes
on; a full or failing disk, a store in a state it does not know, stops the store.

A full disk (:func:`disk_full`) pauses replication until there is room; a failing one
(:func:`disk_failed`: an I/O error, a read-only file system) cannot be trusted with what was
written since the checkpoint, and the service starts over from it once the disk works.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import struct

from cdcserver.core.errors import (
    DISK_FAILED_ERRNOS,
    DISK_FULL_ERRNOS,
    DiskFull,
    StoreDamaged,
    StoreError,
    UndecodableEvent,
)

_SQLITE_FULL = (sqlite3.SQLITE_FULL,)
_SQLITE_FAILED = (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY)
# What writing one table's change can raise that concerns that table only: a value its
# encoder does not take, rows that do not decode, a file of its own that cannot be created or
# written (a name, a permission). Not a full or failing disk, which every table shares.
TABLE_FAULTS = (TypeError, ValueError, OverflowError, ArithmeticError, KeyError, IndexError,
                AttributeError, struct.error, UndecodableEvent, StoreError, OSError)
_SHARED_ERRNOS = (*DISK_FULL_ERRNOS, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE,
                  errno.ENOMEM)


class TableFault(StoreError):
    """One table cannot be stored any more (it used up its version numbers...)."""


def concerns_one_table(exc: BaseException) -> bool:
    """Whether a fault raised writing one table's change is that table's alone."""
    if not isinstance(exc, TABLE_FAULTS):
        return False
    if isinstance(exc, OSError) and exc.errno in _SHARED_ERRNOS:
        return False
    return not isinstance(exc, StoreError) or isinstance(exc, TableFault)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the data directory is full."""
    return _caused_by(exc, DiskFull, DISK_FULL_ERRNOS, _SQLITE_FULL)


def disk_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the data directory's disk failed: an
    I/O error, a file system turned read-only (SQLite's index says the same in its codes)."""
    return _caused_by(exc, StoreDamaged, DISK_FAILED_ERRNOS, _SQLITE_FAILED)


def _caused_by(exc: BaseException | None, kind: type[StoreError], errnos: tuple[int, ...],
               sqlite_codes: tuple[int, ...]) -> bool:
    seen: set[int] = set()  # (a cause may lead back to itself)
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            return True
        if isinstance(exc, OSError) and exc.errno in errnos:
            return True
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in sqlite_codes:
            return True
        exc = exc.__cause__
    return False


def unopenable(path: str) -> StoreError | None:
    """Why ``path`` cannot be created or opened to write, when its disk is the reason (full:
    :class:`DiskFull`; failing, read-only: :class:`StoreDamaged`); None otherwise. SQLite
    says only "unable to open database file"."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            return DiskFull(f"{path} cannot be created: {exc.strerror}")
        if exc.errno in DISK_FAILED_ERRNOS:
            return StoreDamaged(f"{path} cannot be created: {exc.strerror}")
    return None
