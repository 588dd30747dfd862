"""Waiting for room in a full data directory, or for a failed disk to work again: the file
system sends no event for "space was freed" or "the disk is back", so a probe write is tried
again until it fits (and, for a failed disk, is synced)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

ROOM_NEEDED = 16 << 20  # bytes a probe write must fit before replication resumes


async def until_room(probe: str, every: float, needed: int = ROOM_NEEDED) -> None:
    """Until ``ROOM_NEEDED`` bytes can be written at ``probe`` and the file system has
    ``needed`` bytes free (tried every ``every`` s)."""
    await _poll(lambda: _free(probe) >= needed and _room_for(probe, ROOM_NEEDED), every)


class RoomWanted:
    """The free bytes replication waits for after the data directory filled up.

    ``ROOM_NEEDED``, and besides it what the failed work had written (a repair's scratch
    file, removed since: it needs all of it again). And when replication fills the disk
    again before its checkpoint moved (it starts over from the same place: the work that
    filled it is the same, and what the pause removed, such as a repair's scratch file,
    looked like room), twice what was wanted the last time: resuming sooner would only
    fill the disk again, reading the table being repaired from the source again each
    time."""

    def __init__(self) -> None:
        self.base = ROOM_NEEDED
        self.why = ""
        self._start: object = None  # where the last replication started
        self._paused_start: object = None  # where the one the last pause cut had started

    def started_from(self, position: object) -> None:
        self._start = position

    def after(self, cause: BaseException) -> int:
        again = self._paused_start is not None and self._paused_start == self._start
        self.base = self.base * 2 if again else ROOM_NEEDED
        self._paused_start = self._start
        needed = max(0, int(getattr(cause, "needed", 0)))
        self.why = "".join([
            ": it filled up again before the checkpoint moved" if again else "",
            f"; the failed repair had written {needed >> 20} MiB" if needed else ""])
        return self.base + needed


def _free(probe: str) -> int:
    """The bytes free to an unprivileged writer on ``probe``'s file system."""
    try:
        stats = os.statvfs(os.path.dirname(probe) or ".")
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


async def until_writable(probe: str, every: float) -> None:
    """Until a write and an fsync at ``probe`` work (tried every ``every`` s)."""
    await _poll(lambda: _writes_and_syncs(probe), every)


async def _poll(check: Callable[[], bool], every: float) -> None:
    """Until ``check`` (run in a thread) holds: the file system sends no event for "space
    was freed", so polling is the only way to learn it."""
    while True:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(every)


def _room_for(probe: str, size: int) -> bool:
    """Whether ``size`` bytes can be written beside the data (then removed again)."""
    return _probe(probe, lambda fd: os.posix_fallocate(fd, 0, size))


def _writes_and_syncs(probe: str) -> bool:
    """Whether a small file can be written and synced beside the data (then removed)."""
    def write_and_sync(fd: int) -> None:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)

    return _probe(probe, write_and_sync)


def _probe(probe: str, attempt: Callable[[int], object]) -> bool:
    """Whether ``attempt`` on a new file at ``probe`` raises no OSError (the file is removed
    again either way)."""
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return False
    try:
        attempt(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
