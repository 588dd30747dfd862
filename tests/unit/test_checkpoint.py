"""The store's checkpoint as a base and a journal: what is read back is always the last whole
checkpoint written, through journal lines, torn lines, folds into a new base, a full disk and
readers racing the writer; and a checkpoint writes the tables that changed, not every table.

A model (a dict per checkpoint number) is the oracle; the files are read only through
``checkpoint.load``, as the dump commands and ``verify`` in other processes read them."""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Iterator

import pytest

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.errors import DiskFull
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.store import checkpoint as ckpt
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore
from tests.helpers import fill, small_tmpfs
from tests.unit.test_store import _Feed

Marks = dict[TableName, ckpt.TableMark]


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


def _random_changes(rng: random.Random, tables: Marks, names: list[TableName]
                    ) -> dict[TableName, ckpt.TableMark | None]:
    changed: dict[TableName, ckpt.TableMark | None] = {}
    for name in rng.sample(names, rng.choice((1, 1, 2, 5, 40))):
        mark = tables.get(name)
        roll = rng.random()
        if mark is not None and roll < 0.05:
            changed[name] = None  # the table's versions are gone
        elif mark is not None and roll < 0.15:
            changed[name] = ckpt.TableMark(mark.version + 1, 30)  # a new version
        else:
            changed[name] = ckpt.TableMark(mark.version if mark else 1,
                                           (mark.size if mark else 30) + rng.randrange(1, 900))
    return changed


def _apply(tables: Marks, changed: dict[TableName, ckpt.TableMark | None]) -> Marks:
    after = dict(tables)
    for name, mark in changed.items():
        if mark is None:
            after.pop(name, None)
        else:
            after[name] = mark
    return after


def _write_random_checkpoints(path: str, count: int, seed: int,
                              models: dict[int, Marks] | None = None
                              ) -> tuple[ckpt.CheckpointWriter, Marks]:
    rng = random.Random(seed)
    names = [TableName("db", f"t{i}") for i in range(300)]
    tables: Marks = {name: ckpt.TableMark(1, 30) for name in names[:200]}
    if models is not None:
        models[0] = tables
    writer = ckpt.CheckpointWriter(path, ckpt.Checkpoint(None, dict(tables)))
    for n in range(1, count + 1):
        changed = _random_changes(rng, tables, names)
        tables = _apply(tables, changed)
        if models is not None:
            models[writer.seq + 1] = tables
        writer.write(ckpt.Checkpoint(_position(n), index_ordinal=n), changed)
    return writer, tables


def test_every_checkpoint_reads_back_as_written_through_journal_lines_and_new_bases(
        tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "JOURNAL_MIN_BYTES", 2048)  # fold into a new base often
    path = str(tmp_path / "checkpoint.json")
    rng = random.Random(7)
    names = [TableName("db", f"t{i}") for i in range(300)]
    tables: Marks = {name: ckpt.TableMark(1, 30) for name in names[:200]}
    writer = ckpt.CheckpointWriter(path, ckpt.Checkpoint(None, dict(tables)))
    bases = 0
    for n in range(1, 400):
        changed = _random_changes(rng, tables, names)
        tables = _apply(tables, changed)
        base_before = os.stat(path).st_ino
        writer.write(ckpt.Checkpoint(_position(n), fresh=frozenset(names[n % 7:n % 7 + 1]),
                                     index_ordinal=n), changed)
        bases += os.stat(path).st_ino != base_before
        loaded = ckpt.load(path)
        assert loaded is not None
        assert loaded.tables == tables, n
        assert (loaded.position, loaded.index_ordinal, loaded.seq) == (_position(n), n, n)
        assert loaded.fresh == frozenset(names[n % 7:n % 7 + 1])
    assert 3 < bases < 200, bases  # both paths ran: journal lines and new bases


def test_a_checkpoint_line_holds_only_the_tables_that_changed(tmp_path):
    path = str(tmp_path / "checkpoint.json")
    tables = {TableName("db", f"t{i}"): ckpt.TableMark(1, 30) for i in range(5000)}
    writer = ckpt.CheckpointWriter(path, ckpt.Checkpoint(None, tables))
    base = os.path.getsize(path)
    changed = {TableName("db", "t42"): ckpt.TableMark(1, 999)}
    writer.write(ckpt.Checkpoint(_position(1)), changed)  # type: ignore[arg-type]
    assert os.path.getsize(path) == base  # the base is not rewritten
    with open(ckpt.journal_path(path), "rb") as f:
        lines = f.read().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400
    assert json.loads(lines[0].partition(b" ")[2])["marks"] == [["db", "t42", 1, 999]]
    loaded = ckpt.load(path)
    assert loaded is not None and loaded.tables == {**tables, **changed}


def test_a_torn_or_damaged_last_line_leaves_the_checkpoint_before_it(tmp_path):
    path = str(tmp_path / "checkpoint.json")
    models: dict[int, Marks] = {}
    writer, _ = _write_random_checkpoints(path, 20, seed=3, models=models)
    journal = ckpt.journal_path(path)
    with open(journal, "rb") as f:
        data = f.read()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    for damaged in (data[:last] + data[last:-7],  # cut inside the last line
                    data[:-1],  # without its newline
                    data[:last + 12] + b"X" + data[last + 13:]):  # a changed byte
        with open(journal, "wb") as f:
            f.write(damaged)
        loaded = ckpt.load(path)
        assert loaded is not None and loaded.seq == writer.seq - 1
        assert loaded.tables == models[writer.seq - 1]
    # a new writer (the service's next start) drops the torn line and goes on from there
    loaded = ckpt.load(path)
    assert loaded is not None
    again = ckpt.CheckpointWriter(path, loaded)
    again.write(ckpt.Checkpoint(_position(99)), {TableName("db", "new"): ckpt.TableMark(1, 5)})
    reread = ckpt.load(path)
    assert reread is not None and reread.seq == writer.seq
    assert reread.tables == {**models[writer.seq - 1], TableName("db", "new"): ckpt.TableMark(1, 5)}


def test_a_reader_racing_the_writer_always_gets_a_whole_checkpoint(tmp_path, monkeypatch):
    """Another process (a dump, verify) reads while the service writes lines and new bases:
    each read is exactly one of the checkpoints written, never a mixture, never older than
    one read before it."""
    monkeypatch.setattr(ckpt, "JOURNAL_MIN_BYTES", 1024)
    path = str(tmp_path / "checkpoint.json")
    models: dict[int, Marks] = {}
    done = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def read() -> None:
        while not done.is_set():
            loaded = ckpt.load(path)
            if loaded is None:
                continue  # the writer has not written its first base yet
            if loaded.tables != models[loaded.seq]:
                failures.append(f"seq {loaded.seq}: not the checkpoint written")
            if seen and loaded.seq < seen[-1]:
                failures.append(f"seq {loaded.seq} after {seen[-1]}")
            seen.append(loaded.seq)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        _write_random_checkpoints(path, 1500, seed=11, models=models)
    finally:
        done.set()
        reader.join()
    assert failures == []
    assert len(set(seen)) > 20  # it did read along


@pytest.fixture
def small_disk(tmp_path) -> Iterator[str]:
    with small_tmpfs(str(tmp_path / "small"), "1m") as mount_point:
        yield mount_point


def _layout(table: str) -> TableLayout:
    return TableLayout("db", table, (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))


async def test_a_checkpoint_refused_by_a_full_disk_is_written_whole_by_the_next_flush(
        small_disk):
    """On a real full disk (a tmpfs) the journal line fails and is cut back; the tables it
    would have carried go into the next checkpoint, which reads back exact."""
    from cdcserver.core.changes import Rows, RowsKind

    store = AvroStore(small_disk, Catalog(DataDir(small_disk).avro))
    store.open()
    feed = _Feed()
    for name in ("a", "b", "c"):
        await store.apply(feed.transaction(Rows(_layout(name), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    await store.flush()
    for name, rows in (("a", [(2,), (3,)]), ("b", [(4,)])):
        await store.apply(feed.transaction(Rows(_layout(name), RowsKind.INSERT, 0, rows)))  # type: ignore[arg-type]
    ballast = os.path.join(small_disk, "ballast")
    fill(ballast)
    with pytest.raises(DiskFull):
        await store.flush()
    os.unlink(ballast)
    await store.apply(feed.transaction(Rows(_layout("c"), RowsKind.INSERT, 0, [(5,)])))  # type: ignore[arg-type]
    await store.flush()
    expected = {name: ckpt.TableMark(e.latest().version, e.latest().committed)  # type: ignore[union-attr]
                for name, e in store.catalog.tables.items()}
    position = store.durable
    store.close()
    loaded = ckpt.load(DataDir(small_disk).checkpoint)
    assert loaded is not None and loaded.tables == expected and loaded.position == position
    reopened = AvroStore(small_disk, Catalog(DataDir(small_disk).avro))
    assert reopened.open() is not None
    assert {n: e.latest().committed for n, e in reopened.catalog.tables.items()} == \
        {n: m.size for n, m in expected.items()}  # nothing cut back: all of it was covered
    reopened.close()


async def test_a_store_checkpoint_carries_the_tables_committed_since_the_last_one(tmp_path):
    from cdcserver.core.changes import Rows, RowsKind

    path = str(tmp_path)
    store = AvroStore(path, Catalog(DataDir(path).avro))
    store.open()
    feed = _Feed()
    await store.apply(feed.transaction(*[Rows(_layout(f"t{i}"), RowsKind.INSERT, 0, [(1,)])
                                         for i in range(300)]))  # type: ignore[arg-type]
    await store.flush()
    await store.apply(feed.transaction(Rows(_layout("t7"), RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    await store.flush()
    with open(DataDir(path).checkpoint_log, "rb") as f:
        last = json.loads(f.read().splitlines()[-1].partition(b" ")[2])
    committed = store.catalog.tables[TableName("db", "t7")].latest().committed  # type: ignore[union-attr]
    assert last["marks"] == [["db", "t7", 1, committed]] and last["gone"] == []
    store.close()


def test_the_layout_names_the_journal_the_checkpoint_reads():
    layout = DataDir("/data")
    assert ckpt.journal_path(layout.checkpoint) == layout.checkpoint_log
