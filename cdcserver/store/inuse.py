"""Marking a file in use, so that the cleaner leaves it alone.

A reader (a dump transfer, a stream reading a table version) holds a shared ``flock`` on the
open file while it uses it; the cleaner deletes a file only under an exclusive, non-blocking
``flock``, so it skips files in use and deletes them on a later pass. flock locks belong to
open files and vanish with the process that held them: a transfer that crashes, a client that
hangs up, a service that restarts, leave no stale lock behind. Files are opened close-on-exec
(Python's default), so no child process inherits a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import BinaryIO


@contextlib.contextmanager
def in_use(path: str) -> Iterator[BinaryIO]:
    """The open file, marked in use until the block ends. Raises FileNotFoundError if the
    file is gone or being deleted (including between the open and the lock)."""
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # the cleaner holds it for deletion
            raise FileNotFoundError(path) from None
        try:
            if os.fstat(f.fileno()).st_ino != os.stat(path).st_ino:
                raise FileNotFoundError(path)
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def delete_unless_in_use(path: str, before_delete: object = None) -> bool:
    """Delete ``path`` unless a reader holds it; True if it was deleted (or already gone).
    ``before_delete`` (a callable) runs while the exclusive lock is held, just before the
    unlink: a reader cannot start using the file from then on."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the lock decision
    except FileNotFoundError:
        return True
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if callable(before_delete):
            before_delete()
        # Another deleter (a second cleaner pass, `cdcserver dumps --delete`) may have
        # unlinked it between our open and our lock: gone is what we wanted.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True
