"""Writes that survive a crash: a file replaced whole or not at all, and a directory whose
entries are on disk."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes | bytearray) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: after a crash the file holds the old bytes or the new,
    never a part. On an error (a full disk) the old file stays and the space is given back."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    """Make the directory's entries (a file created, renamed or removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
