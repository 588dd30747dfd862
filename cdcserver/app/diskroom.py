"""Waiting for room in a full data directory, or for a failed disk to work again: the file
system sends no event for "space was freed" or "the disk is back", so a probe write is tried
again until it fits (and, for a failed disk, is synced)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from cdcserver.core.durable import write_all

ROOM_NEEDED = 16 << 20  # bytes a probe write must fit before replication resumes


async def until_room(probe: str, every: float, needed: int = ROOM_NEEDED) -> None:
    """Until ``ROOM_NEEDED`` bytes can be written at ``probe`` and the file system has
    ``needed`` bytes free (tried every ``every`` s)."""
    await _poll(lambda: _free(probe) >= needed and _room_for(probe, ROOM_NEEDED), every)


def room_needed(cause: BaseException) -> tuple[int, str]:
    """The free bytes replication waits for after ``cause`` filled the data directory, and
    why (for the log line): ``ROOM_NEEDED``, and besides it what a failed repair had written
    (``cause.needed``: its scratch file, which the pause removed). A repair that fails
    places nothing, so a resume reads the whole table again and needs all of it again:
    resuming sooner would only fill the disk again, and read the table from the source
    again, in a loop. (A store write that fails while a repair's records go out resumes at
    ``ROOM_NEEDED``: the records written so far stay, and the next try needs less.)"""
    needed = max(0, int(getattr(cause, "needed", 0)))
    why = f": the failed repair had written {needed >> 20} MiB" if needed >> 20 else ""
    return ROOM_NEEDED + needed, why


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
        write_all(fd, b"\0" * 4096)  # (a short write is room for part of it only)
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
