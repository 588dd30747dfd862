"""Which errors say the data directory's disk is full, and which that it failed: what decides
between a pause (full) and a start over from the checkpoint (failed), through the causes an
error was raised from, SQLite's codes included."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from cdcserver.core.errors import DiskFull, StoreDamaged, StoreError
from cdcserver.store.faults import disk_failed, disk_full


def _sqlite(code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("from SQLite")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]  # as the module sets it
    return exc


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise StoreError("wrapped") from exc
    except StoreError as wrapped:
        return wrapped


@pytest.mark.parametrize("exc, full, failed", [
    (OSError(errno.ENOSPC, "full"), True, False),
    (OSError(errno.EDQUOT, "quota"), True, False),
    (OSError(errno.EIO, "io"), False, True),
    (OSError(errno.EROFS, "read-only"), False, True),
    (OSError(errno.EACCES, "denied"), False, False),
    (DiskFull("full"), True, False),
    (StoreDamaged("failed"), False, True),
    (_sqlite(sqlite3.SQLITE_FULL), True, False),
    (_sqlite(sqlite3.SQLITE_IOERR | (3 << 8)), False, True),  # an extended I/O error code
    (_sqlite(sqlite3.SQLITE_READONLY), False, True),
    (_sqlite(sqlite3.SQLITE_BUSY), False, False),
    (ValueError("not a disk's"), False, False),
])
def test_a_full_disk_and_a_failed_one_are_told_apart(exc, full, failed):
    assert (disk_full(exc), disk_failed(exc)) == (full, failed)
    assert (disk_full(_raised_from(exc)), disk_failed(_raised_from(exc))) == (full, failed)


def test_a_cause_that_leads_back_to_itself_ends_the_search():
    exc = StoreError("its own cause")
    exc.__cause__ = exc
    assert not disk_full(exc) and not disk_failed(exc)
