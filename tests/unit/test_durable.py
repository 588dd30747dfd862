"""``write_atomically``: the old file or the new, and nothing else left behind."""

from __future__ import annotations

import os

import pytest

from cdcserver.core.durable import write_atomically


def test_a_replace_that_fails_leaves_no_temporary_file(tmp_path) -> None:
    """The rename can fail after the data was written (here the target is a directory; on a
    failing disk, EIO): the temporary file, as big as the data, is removed, not kept until the
    next write of that file."""
    target = tmp_path / "state"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomically(str(target), b"x" * 100_000)
    assert sorted(os.listdir(tmp_path)) == ["state"]


def test_the_new_bytes_replace_the_old(tmp_path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    write_atomically(str(path), b"new", mode=0o600)
    assert path.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["checkpoint"]
