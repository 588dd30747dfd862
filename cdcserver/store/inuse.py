"""Marking a file in use, so that the cleaner leaves it alone.

A reader (a dump transfer, a stream reading a table version) holds a shared ``flock`` on the
open file while it uses it; the cleaner deletes a file only under an exclusive, non-blocking
``flock``, so it skips files in use and deletes them on a later pass. flock locks belong to
open files and vanish with the process that held them: a transfer that crashes, a client that
hangs up, a service that restarts, leave no stale lock behind. Files are opened close-on-exec
(Python's default), so no child process inherits a lock.

A version file is read by every stream of its table, often thousands at once: they share one
open descriptor (:meth:`StoredFiles.shared`), which holds the shared lock while at least one
of them reads, and which they read at explicit offsets (``pread``, ``sendfile`` with an
offset), never through its file position. A dump keeps a descriptor of its own
(:func:`in_use`: its transfer may read it by position). Every descriptor either way counts in
one budget (:data:`FILES`, set from the process's limit at start): past it, a reader is refused
(:class:`TooManyOpen`) rather than the process running out of descriptors.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

log = logging.getLogger(__name__)
WARN_EVERY = 60.0  # seconds between two warnings that the budget refused readers


class TooManyOpen(OSError):
    """The budget of stored files open for reading is spent (retry once readers leave)."""


@dataclass(eq=False)
class SharedFile:
    """A file open once for all its readers, marked in use while any holds it. Read it at
    explicit offsets only: the file position belongs to no one."""

    path: str
    fd: int
    identity: tuple[int, int]  # (st_dev, st_ino): which file the path named when opened
    users: int = 1

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)


class StoredFiles:
    """The descriptors readers hold on stored files, at most ``limit`` (None: no limit)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.open = 0  # descriptors counted now, shared or not
        self.refused = 0  # readers refused since start
        self._shared: dict[str, SharedFile] = {}
        self._lock = threading.Lock()  # a dump's reader may run on a thread
        self._warned = -WARN_EVERY
        self._refused_warned = 0

    @contextlib.contextmanager
    def shared(self, path: str) -> Iterator[SharedFile]:
        """``path``'s file, opened by its first reader and closed by its last, marked in use
        meanwhile. Raises FileNotFoundError if it is gone or being deleted, TooManyOpen if it
        is not open yet and the budget is spent."""
        held = self._acquire(path)
        try:
            yield held
        finally:
            self._release(held)

    @contextlib.contextmanager
    def counted(self, count: int = 1) -> Iterator[None]:
        """``count`` descriptors a reader opens itself, counted until the block ends."""
        with self._lock:
            self._take(count)
        try:
            yield
        finally:
            with self._lock:
                self.open -= count

    def _acquire(self, path: str) -> SharedFile:
        with self._lock:
            identity = _identity(os.stat(path))  # FileNotFoundError: gone
            held = self._shared.get(path)
            if held is not None and held.identity == identity:
                held.users += 1
                return held
            # Not open, or the path names another file now (a resync replaced it): open
            # that one. The old one stays open for its readers until the last leaves.
            self._take(1)
            try:
                fd = _open_marked(path)
            except BaseException:
                self.open -= 1
                raise
            held = self._shared[path] = SharedFile(path, fd, _identity(os.fstat(fd)))
            return held

    def _release(self, held: SharedFile) -> None:
        with self._lock:
            held.users -= 1
            if held.users:
                return
            if self._shared.get(held.path) is held:
                del self._shared[held.path]
            self.open -= 1
        os.close(held.fd)  # the lock goes with the last descriptor of the open file

    def _take(self, count: int) -> None:
        """Count ``count`` more descriptors (the lock held), or refuse them."""
        if self.limit is not None and self.open + count > self.limit:
            self.refused += 1
            self._warn_refused()
            raise TooManyOpen(errno.EMFILE, f"{self.open} stored files are open for reading, "
                              f"the most the file descriptor limit leaves room for")
        self.open += count

    def _warn_refused(self) -> None:
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            log.warning("%d readers refused: %d stored files are open for reading, the "
                        "budget's most (raise the file descriptor limit to serve more)",
                        self.refused - self._refused_warned, self.open)
            self._warned, self._refused_warned = now, self.refused


FILES = StoredFiles()  # the process's; the service sets its limit at start


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _open_marked(path: str) -> int:
    """A descriptor of ``path`` holding the shared lock that marks it in use. Raises
    FileNotFoundError if the file is gone or being deleted (including between the open and
    the lock)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _mark(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mark(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # the cleaner holds it for deletion
        raise FileNotFoundError(path) from None
    if os.fstat(fd).st_ino != os.stat(path).st_ino:  # deleted between the open and the lock
        raise FileNotFoundError(path)


@contextlib.contextmanager
def in_use(path: str) -> Iterator[BinaryIO]:
    """The open file, a descriptor of its own counted in :data:`FILES`, marked in use until
    the block ends. Raises FileNotFoundError if the file is gone or being deleted (including
    between the open and the lock), TooManyOpen if the budget is spent."""
    with FILES.counted(), open(path, "rb") as f:
        _mark(f.fileno(), path)
        try:
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
