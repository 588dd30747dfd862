"""Files in use (``cdcserver/store/inuse.py``): every reader of a file shares one descriptor of
it, which marks it in use for the cleaner until the last reader leaves; a file replaced under
its readers is opened afresh for the next ones; the budget counts descriptors, not readers."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os

import pytest

from cdcserver.store.inuse import FILES, StoredFiles, TooManyOpen, delete_unless_in_use, in_use
from tests.helpers import read_descriptors_of


def _file(tmp_path, name: str, data: bytes) -> str:
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_readers_of_a_file_share_one_descriptor_until_the_last_leaves(tmp_path):
    path = _file(tmp_path, "t.000001.avro", b"0123456789")
    files = StoredFiles()
    with contextlib.ExitStack() as last:
        held = last.enter_context(files.shared(path))
        with contextlib.ExitStack() as others:
            more = [others.enter_context(files.shared(path)) for _ in range(49)]
            assert all(h is held for h in more) and held.users == 50
            assert read_descriptors_of(path) == [held.fd] and files.open == 1
            assert not delete_unless_in_use(path)  # the cleaner's exclusive lock fails
            assert more[7].pread(3, 4) == b"456" and more[8].pread(2, 0) == b"01"
        assert read_descriptors_of(path) == [held.fd] and held.users == 1
        assert not delete_unless_in_use(path)
    assert read_descriptors_of(path) == [] and files.open == 0
    assert delete_unless_in_use(path) and not os.path.exists(path)
    with pytest.raises(FileNotFoundError), files.shared(path):
        pass


def test_a_file_replaced_under_its_readers_is_opened_afresh_for_the_next(tmp_path):
    path = _file(tmp_path, "t.000001.avro", b"old")
    files = StoredFiles()
    with files.shared(path) as old:
        os.replace(_file(tmp_path, "resynced", b"new"), path)  # a resync's new file
        with files.shared(path) as new, files.shared(path) as again:
            assert new.fd != old.fd and again is new
            assert (old.pread(3, 0), new.pread(3, 0)) == (b"old", b"new")
            assert files.open == 2
        assert files.open == 1 and old.pread(3, 0) == b"old"
        with files.shared(path) as third:  # the replaced one is no one's to share any more
            assert third is not old and third.pread(3, 0) == b"new"
    assert files.open == 0 and read_descriptors_of(path) == []


def test_a_file_the_cleaner_is_deleting_is_not_opened(tmp_path):
    path = _file(tmp_path, "t.000001.avro", b"data")
    files = StoredFiles()
    with open(path, "rb") as cleaner:
        fcntl.flock(cleaner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(FileNotFoundError), files.shared(path):
            pass
    assert files.open == 0 and read_descriptors_of(path) == []
    os.unlink(path)
    with pytest.raises(FileNotFoundError), files.shared(path):
        pass
    assert files.open == 0


def test_the_budget_counts_descriptors_not_readers(tmp_path):
    a = _file(tmp_path, "a.000001.avro", b"a")
    b = _file(tmp_path, "b.000001.avro", b"b")
    files = StoredFiles(limit=2)
    with contextlib.ExitStack() as readers:
        for _ in range(100):
            readers.enter_context(files.shared(a))
        with files.counted():  # a dump's own descriptor
            assert files.open == 2
            with pytest.raises(TooManyOpen), files.shared(b):
                pass
            with files.shared(a):  # open already: the budget does not grow
                pass
        assert files.refused == 1 and files.open == 1
        with files.shared(b) as held:
            assert held.pread(1, 0) == b"b" and files.open == 2
    assert files.open == 0


def test_a_dump_reader_has_its_own_descriptor_counted_in_the_budget(tmp_path, monkeypatch):
    a = _file(tmp_path, "a.dump", b"line one\nline two\n")
    b = _file(tmp_path, "b.dump", b"x")
    monkeypatch.setattr(FILES, "limit", FILES.open + 1)
    with in_use(a) as f:
        assert f.readline() == b"line one\n"  # its own position
        assert not delete_unless_in_use(a)
        with pytest.raises(TooManyOpen), in_use(b):
            pass
    with in_use(b) as f:
        assert f.read() == b"x"
    assert delete_unless_in_use(a)


def test_a_reader_cancelled_while_others_read_leaves_them_the_file(tmp_path):
    path = _file(tmp_path, "t.000001.avro", bytes(range(256)))
    files = StoredFiles()

    async def reader(offset: int, release: asyncio.Event) -> bytes:
        with files.shared(path) as held:
            await release.wait()
            return held.pread(4, offset)

    async def body() -> list[bytes]:
        release = asyncio.Event()
        tasks = [asyncio.create_task(reader(n, release)) for n in range(5)]
        await asyncio.sleep(0)
        assert files.open == 1 and len(read_descriptors_of(path)) == 1
        tasks[2].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[2]
        assert files.open == 1 and len(read_descriptors_of(path)) == 1
        release.set()
        return [await t for n, t in enumerate(tasks) if n != 2]

    assert asyncio.run(body()) == [bytes(range(n, n + 4)) for n in (0, 1, 3, 4)]
    assert files.open == 0 and read_descriptors_of(path) == []
