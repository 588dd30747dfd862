"""Writes that survive a crash: a file replaced whole or not at all, and a directory whose
entries are on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any


def write_all(fd: int, data: bytes | bytearray) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomically(path: str, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data``: after a crash the file holds the old bytes or the new,
    never a part. On an error (a full disk) the old file stays and the space is given back.
    The file is created with ``mode`` (less the umask) from its first byte: a secret written
    with 0o600 is never readable by others, not even for an instant."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover would keep its own mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # (the write's error is the one to tell)
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    """Make the directory's entries (a file created, renamed or removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_files(group: bool = False) -> None:
    """Files and directories this process creates from now on are its user's only (0600,
    0700), or also its group's (0640, 0750): rows, dumps, the index, the checkpoint."""
    os.umask(0o027 if group else 0o077)


async def outlast(work: asyncio.Future[Any]) -> None:
    """Wait until ``work`` (a write in a thread, which cannot be cancelled) is done, through
    any number of cancellations of the caller: whoever holds a lock around the write keeps it
    until the write has ended, so two writes of one file never overlap."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({work})
