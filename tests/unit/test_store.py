"""The Avro store's crash and race behaviour, driven with synthetic changes (no MariaDB)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading

import pytest

from cdcserver.core.changes import (
    Abort,
    Begin,
    ColumnDef,
    Commit,
    Ddl,
    Release,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.store import avrofile
from cdcserver.store.catalog import Catalog
from cdcserver.store.naming import version_file
from cdcserver.store.store import AvroStore
from cdcserver.store.versions import ROUTES_PER_TABLE
from mariadb_cdc_client.format.schema import Field, Kind
from mariadb_cdc_client.resume import Resume
from mariadb_cdc_client.stream import ChangeRecord, SchemaChange


def _layout(table: str) -> TableLayout:
    return TableLayout("db", table, (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))


class _Feed:
    def __init__(self) -> None:
        self.sequence = 0

    def transaction(self, *changes: object, commit: bool = True) -> list[object]:
        self.sequence += 1
        gtid = Gtid(0, 1, self.sequence)
        out: list[object] = [Begin(gtid, 1_700_000_000), *changes]
        if commit:
            out.append(Commit(BinlogPosition(GtidState([gtid]), "bin.000001", self.sequence * 100),
                              1_700_000_000))
        return out


def _open(path: str) -> AvroStore:
    store = AvroStore(path, Catalog(os.path.join(path, "avro")))
    store.open()
    return store


async def test_a_new_directory_is_checkpointed_before_any_data(tmp_path):
    path = str(tmp_path)
    store = _open(path)
    with open(os.path.join(path, "state", "checkpoint.json")) as f:
        assert json.load(f)["position"] is None
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout("t"), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    store.close()  # killed before the first flush: the data is not checkpointed
    assert os.listdir(os.path.join(path, "avro"))
    reopened = _open(path)  # no "refusing to guess": the files postdate the checkpoint
    assert os.listdir(os.path.join(path, "avro")) == [] and reopened.durable is None
    reopened.close()


async def test_an_abort_during_a_flush_does_not_break_checkpointing(tmp_path, monkeypatch):
    store = _open(str(tmp_path))
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout("a"), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    # A transaction creating table b's first version is still open when the flush starts.
    await store.apply(feed.transaction(Rows(_layout("b"), RowsKind.INSERT, 0, [(1,)]),  # type: ignore[arg-type]
                                       commit=False))
    proceed = threading.Event()
    real_fsync = avrofile.VersionFileWriter.fsync

    def slow_fsync(writer: avrofile.VersionFileWriter) -> None:
        assert proceed.wait(10)
        real_fsync(writer)

    monkeypatch.setattr(avrofile.VersionFileWriter, "fsync", slow_fsync)
    flushing = asyncio.create_task(store.flush())
    await asyncio.sleep(0)  # let the flush capture its files and hand them to its thread
    await store.apply([Abort("connection lost")])  # closes nothing the flush is using
    proceed.set()
    assert await flushing is not None
    await store.apply(feed.transaction(Rows(_layout("a"), RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    assert (await store.flush()) == store.position  # checkpointing still works
    assert store.catalog.get(TableName("db", "b")) is None
    store.close()


async def test_a_recreated_table_starts_a_version_even_after_a_restart(tmp_path):
    path = str(tmp_path)
    store = _open(path)
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout("t"), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    # Re-created with columns the schema history could not read: no version yet...
    await store.apply(feed.transaction(Ddl("db", "CREATE TABLE t LIKE unknown", 0, "create",
                                           (TableChange("create", "db", "t"),))))
    await store.flush()
    store.close()
    store = _open(path)  # ...and after a restart its first rows still start one
    await store.apply(feed.transaction(Rows(_layout("t"), RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    entry = store.catalog.get(TableName("db", "t"))
    assert entry is not None and sorted(entry.versions) == [1, 2]
    store.close()


def _schema(version: int) -> SchemaChange:
    return SchemaChange("db", "t", version, "", {}, (Field("id", Kind.INT, "id"),) * 7)


def _record(version: int, domain: int, sequence: int) -> ChangeRecord:
    return ChangeRecord("db", "t", version, domain, 1, sequence, 1, 0, "insert", {"id": 1})


def test_resume_after_a_version_change_starts_at_the_new_version():
    resume = Resume()
    assert resume.accept(_schema(1)) and resume.accept(_record(1, 0, 5))
    assert resume.request() == (1, "0-1-5", None)
    assert resume.accept(_schema(2))
    # Nothing of version 2 was delivered: resume from its start, not from 0-1-5, which
    # would skip version 2's records of other domains that precede domain 0's.
    assert resume.request() == (2, None, None)
    assert resume.accept(_record(2, 1, 7)) and resume.request() == (2, "1-1-7", None)
    assert not resume.accept(_record(2, 1, 7))  # a repeat after a reconnect


@pytest.mark.parametrize("given", [None, "0-1-3"])
def test_resume_keeps_the_requested_gtid_until_a_record_arrives(given: str | None):
    resume = Resume(gtid=given)
    assert resume.accept(_schema(1)) and resume.accept(_schema(2))
    assert resume.request() == (2, given, None)


async def test_a_flush_cancelled_twice_still_holds_off_the_next_checkpoint_write(
        tmp_path, monkeypatch):
    """Shutting down cancels the periodic flush twice (its loop, then gather's cleanup). The
    flush's thread cannot stop: until it is done no other checkpoint write may start, or the
    two race on checkpoint.json.tmp (seen in CI as FileNotFoundError on the rename)."""
    store = _open(str(tmp_path))
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout("a"), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    proceed, entered = threading.Event(), threading.Event()
    real_fsync = avrofile.VersionFileWriter.fsync
    writes_at_once, most_at_once = [0], [0]

    def slow_fsync(writer: avrofile.VersionFileWriter) -> None:
        writes_at_once[0] += 1
        most_at_once[0] = max(most_at_once[0], writes_at_once[0])
        entered.set()
        assert proceed.wait(10)
        real_fsync(writer)
        writes_at_once[0] -= 1

    async def turns(count: int) -> None:
        """Let the loop run ``count`` times: a cancellation takes a few turns to unwind."""
        for _ in range(count):
            await asyncio.sleep(0)

    monkeypatch.setattr(avrofile.VersionFileWriter, "fsync", slow_fsync)
    first = asyncio.create_task(store.flush())
    assert await asyncio.to_thread(entered.wait, 10)  # its thread is in fsync
    first.cancel()
    await turns(1)
    first.cancel()  # again, while it waits for its thread
    await turns(10)
    assert not first.done() and store._flush_lock.locked()  # still holding off others
    await store.apply(feed.transaction(Rows(_layout("a"), RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    second = asyncio.create_task(store.flush())
    await turns(10)
    assert not second.done()  # waiting for the first thread, not writing beside it
    proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == store.position
    assert most_at_once[0] == 1
    store.close()


async def test_a_table_the_store_cannot_write_is_quarantined_and_the_rest_goes_on(tmp_path):
    """One table's fault (a value its encoder refuses) quarantines that table: its part of
    the transaction is rolled back, the other tables of the same transaction are stored, the
    checkpoint records the quarantine, and a restart keeps it until a release."""
    path = str(tmp_path)
    store = _open(path)
    feed = _Feed()
    good, bad = _layout("good"), _layout("bad")
    store.apply_now(feed.transaction(Rows(good, RowsKind.INSERT, 1, [(1,)]),
                                     Rows(bad, RowsKind.INSERT, 1, [(1,)])))
    store.apply_now(feed.transaction(
        Rows(good, RowsKind.INSERT, 1, [(2,)]),
        Rows(bad, RowsKind.INSERT, 1, [(2,)]),
        Rows(bad, RowsKind.INSERT, 1, [("not an int",)]),  # the encoder refuses it
        Rows(good, RowsKind.INSERT, 1, [(3,)])))
    store.apply_now(feed.transaction(Rows(bad, RowsKind.INSERT, 1, [(4,)]),
                                     Rows(good, RowsKind.INSERT, 1, [(4,)])))
    await store.flush()
    assert set(store.quarantined) == {TableName("db", "bad")}
    assert store.quarantined[TableName("db", "bad")].since == "0-1-2"
    assert "TypeError" in store.quarantined[TableName("db", "bad")].cause or \
        "ValueError" in store.quarantined[TableName("db", "bad")].cause

    def ids(table: str) -> list[int]:
        info = store.catalog.get(TableName("db", table)).latest()  # type: ignore[union-attr]
        with open(info.path, "rb") as f:
            import fastavro
            return [r["id"] for r in fastavro.reader(f)]

    assert ids("good") == [1, 2, 3, 4]
    assert ids("bad") == [1]  # its part of transaction 2 was rolled back; 3 was not stored
    store.close()
    store = _open(path)  # the checkpoint keeps the quarantine
    assert set(store.quarantined) == {TableName("db", "bad")}
    assert set(store.catalog.quarantined) == {TableName("db", "bad")}
    store.apply_now(feed.transaction(Release("db", "bad", "resynced"),
                                     Rows(bad, RowsKind.INSERT, 1, [(5,)])))
    await store.flush()
    assert store.quarantined == {} and ids("bad") == [1, 5]
    store.close()

async def _versions_of_t(store: AvroStore, count: int) -> None:
    """``count`` versions of table t (each create makes a new one), a row in each, flushed."""
    feed = _Feed()
    for n in range(1, count + 1):
        change = TableChange("create", "db", "t", _layout("t"))
        await store.apply(feed.transaction(Ddl("db", "CREATE TABLE t (id INT)", 0,  # type: ignore[arg-type]
                                               kind="create", changes=(change,))))
        await store.apply(feed.transaction(Rows(_layout("t"), RowsKind.INSERT, 0, [(n,)])))  # type: ignore[arg-type]
    await store.flush()


async def test_a_store_opens_without_parsing_each_versions_schema(tmp_path):
    """The soak's store held 14,000 versions (its migrations' ALTERs): opening it parsed
    every version's schema, 45 s on every restart, most of a disk fault's recovery. A
    version's schema is now read from its header when first asked for."""
    path = str(tmp_path)
    store = _open(path)
    await _versions_of_t(store, 3)
    written = store.catalog.get(TableName("db", "t"))
    assert written is not None
    eager = {v: info.schema.avsc for v, info in written.versions.items()}
    store.close()

    store = _open(path)
    entry = store.catalog.get(TableName("db", "t"))
    assert entry is not None and sorted(entry.versions) == [1, 2, 3]
    assert all(info.parsed is None for info in entry.versions.values())
    assert {v: info.schema.avsc for v, info in entry.versions.items()} == eager
    store.close()


async def test_a_table_untouched_by_thousands_of_others_ddl_keeps_one_route(tmp_path):
    """The decoder hands a new layout object for every table after any DDL: the store keeps
    the route of each table's latest one, not one per DDL the source ever logged (the old
    ones cost memory and a scan of them all on every DDL)."""
    store = _open(str(tmp_path))
    feed = _Feed()
    for n in range(2_000):
        await store.apply(feed.transaction(Ddl("db", "ALTER TABLE other ...", 0, "alter", (
            TableChange("alter", "db", "other", _layout("other")),))))
        # the ledger's rows with a layout object of their own, as after the decoder cleared
        await store.apply(feed.transaction(Rows(_layout("ledger"), RowsKind.INSERT, 0,  # type: ignore[arg-type]
                                                [(n,)])))
    assert len(store.versions.routes) <= ROUTES_PER_TABLE
    entry = store.catalog.get(TableName("db", "ledger"))
    assert entry is not None and sorted(entry.versions) == [1]
    store.close()


async def test_sealed_versions_keep_no_schema_in_memory_and_read_it_back(tmp_path):
    """The fault soak's store held 20,000 versions, and every one's schema text and parsed
    schema once a repair's fold had walked them: 2 GB. A sealed version keeps neither; it
    reads them back from its file when asked (a thousand kept), and what it reads is what
    the version's ``.avsc`` file says."""
    path = str(tmp_path)
    store = _open(path)
    await _versions_of_t(store, 300)
    entry = store.catalog.get(TableName("db", "t"))
    assert entry is not None and len(entry.versions) == 300
    latest = entry.latest()
    for number, info in entry.versions.items():  # as a fold walks them
        avsc_path = os.path.join(path, "avro", f"db.t.{number:06d}.avsc")
        with open(avsc_path) as f:
            assert json.loads(info.schema_json) == json.load(f) == info.schema.avsc
        assert info.ddl.kind == "create" and info.ddl.gtid == info.schema.gtid
    sealed = [info for info in entry.versions.values() if info is not latest]
    assert len(sealed) == 299
    assert all(info.parsed is None and info.text is None and not info.header.schema_json
               for info in sealed)
    assert latest is not None and latest.parsed is not None
    store.close()


async def test_a_dropped_tables_last_version_keeps_no_schema_in_memory(tmp_path):
    """A soak's migrations renamed 2,600 tables away: the version each DROP (or rename away)
    made is its table's latest for good, and kept its schema in memory as a live table's
    does. It now reads it back when asked for, as a sealed version does."""
    path = str(tmp_path)
    store = _open(path)
    await _versions_of_t(store, 2)
    feed = _Feed()
    feed.sequence = 100
    await store.apply(feed.transaction(Ddl("db", "DROP TABLE t", 0, "drop",  # type: ignore[arg-type]
                                           (TableChange("drop", "db", "t"),))))
    await store.flush()
    entry = store.catalog.get(TableName("db", "t"))
    assert entry is not None
    dropped = entry.latest()
    assert dropped is not None and dropped.version == 3 and not dropped.sealed
    assert dropped.parsed is None and dropped.text is None
    with open(os.path.join(path, "avro", "db.t.000003.avsc")) as f:
        assert json.loads(dropped.schema_json) == json.load(f) == dropped.schema.avsc
    assert dropped.ddl.kind == "drop"
    assert dropped.parsed is None and dropped.text is None  # read back, not kept
    store.close()


_LONG = "т" * 50  # a table name whose files' names are shortened: their header names it


@pytest.mark.parametrize("table", ["short", _LONG], ids=["plain-name", "shortened-name"])
async def test_a_version_file_a_crash_left_without_its_header_is_removed_at_the_next_open(
        tmp_path, table: str):
    """A version's file is created, then its header written: a crash between the two, or a
    power loss before the header reached the disk, leaves it empty, past the checkpoint.
    The next open removes it, for a shortened name too (whose table only its header names:
    the store could not open at all, found in review), and the table starts that version
    again."""
    path = str(tmp_path)
    store = _open(path)
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout("t"), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    await store.flush()
    store.close()
    torn = os.path.join(path, "avro", version_file(TableName("db", table), 1, "avro"))
    open(torn, "wb").close()  # as os.open(O_CREAT) left it: no byte of the header
    store = _open(path)
    assert not os.path.exists(torn)
    await store.apply(feed.transaction(Rows(_layout(table), RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    await store.flush()
    entry = store.catalog.get(TableName("db", table))
    assert entry is not None and sorted(entry.versions) == [1]
    store.close()
    assert os.path.getsize(torn) > 0


async def test_a_version_file_the_checkpoint_covers_without_its_header_stops_the_open(
        tmp_path):
    """The same damage to a file the checkpoint covers is not a crash's: the store refuses
    to open, naming the file, rather than drop rows it promised."""
    path = str(tmp_path)
    store = _open(path)
    feed = _Feed()
    await store.apply(feed.transaction(Rows(_layout(_LONG), RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    await store.flush()
    store.close()
    damaged = os.path.join(path, "avro", version_file(TableName("db", _LONG), 1, "avro"))
    with open(damaged, "r+b") as f:
        f.truncate(10)
    with pytest.raises(StoreError, match=re.escape(f"the checkpoint covers db.{_LONG} version 1")):
        _open(path)
