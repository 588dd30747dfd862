"""The data directory's writer lock: one service writes a data directory.

An exclusive ``flock`` on the directory's lock file, held while the store is open; it vanishes
with the process, so a crash leaves no stale lock. A dump may hold it shared for an instant to
see whether a service runs, so a lock held elsewhere is waited for a second before the
directory counts as in use.
"""

from __future__ import annotations

import fcntl
import os
import time

from cdcserver.core.errors import StoreError


def lock_for_writing(path: str, data_dir: str) -> int:
    """The descriptor that holds the lock at ``path`` (close it to release the lock)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    deadline = time.monotonic() + 1.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            os.close(fd)
            raise StoreError(f"{data_dir} is in use by another cdcserver process") from None


def held(path: str) -> bool:
    """Whether a process holds the writer lock at ``path``: a shared lock cannot be had then.
    (Had, it is let go at once; a service starting in that instant waits for it: see
    :func:`lock_for_writing`.)"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the lock
    return False
