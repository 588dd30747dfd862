"""Retention: which dumps and versions the cleaner deletes, and that files in use survive it.

The policy tests are pure; the rest run the service against a real MariaDB, with real
transfers over real sockets, and processes that really die.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from cdcserver.core.config import RetentionConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.dump.files import DumpInfo, dump_dir, list_dumps, new_name
from cdcserver.dump.retention import Cleaner, expired_dumps
from cdcserver.store.catalog import Catalog
from cdcserver.store.inuse import delete_unless_in_use, in_use
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client.format.dump import DumpHeader
from mariadb_cdc_client.format.wire import ProtocolError, auth_message
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, wait_until

# -- the policy --------------------------------------------------------------------------------


def _dump(table: str, age: float, size: int, now: float) -> DumpInfo:
    name = TableName("db", table)
    header = DumpHeader("db", table, {}, "0-1-1", "b.000001", 4, 0, "", "", 1)
    return DumpInfo(f"db.{table}.{age}.dump", f"/x/db.{table}.{age}", name, header, size,
                    now - age)


def _names(dumps: list[DumpInfo]) -> list[str]:
    return [d.name for d in dumps]


def test_policy_keeps_a_count_per_table_and_always_the_newest():
    now = time.time()
    dumps = sorted([_dump("a", age, 10, now) for age in (50, 40, 30, 20)] +
                   [_dump("b", 1000, 10, now)], key=lambda d: d.modified)
    doomed = expired_dumps(dumps, RetentionConfig(dumps_keep=2), now)
    assert _names(doomed) == ["db.a.50.dump", "db.a.40.dump"]
    doomed = expired_dumps(dumps, RetentionConfig(dumps_keep=0, dumps_max_age=25), now)
    assert _names(doomed) == ["db.a.50.dump", "db.a.40.dump", "db.a.30.dump"]  # not b's only


def test_policy_total_size_deletes_oldest_first_but_never_a_newest():
    now = time.time()
    dumps = sorted([_dump("a", 30, 100, now), _dump("a", 10, 100, now),
                    _dump("b", 40, 100, now), _dump("b", 20, 100, now)],
                   key=lambda d: d.modified)
    doomed = expired_dumps(dumps, RetentionConfig(dumps_keep=0, dumps_max_bytes=250), now)
    assert _names(doomed) == ["db.b.40.dump", "db.a.30.dump"]
    doomed = expired_dumps(dumps, RetentionConfig(dumps_keep=0, dumps_max_bytes=1), now)
    assert _names(doomed) == ["db.b.40.dump", "db.a.30.dump"]  # the newest two stay


# -- files in use ----------------------------------------------------------------------------

def test_a_file_in_use_is_not_deleted_and_is_once_released(tmp_path):
    path = str(tmp_path / "x.dump")
    with open(path, "wb") as f:
        f.write(b"data")
    with in_use(path) as f:
        assert not delete_unless_in_use(path)
        assert f.read() == b"data"
    assert delete_unless_in_use(path) and not os.path.exists(path)
    with pytest.raises(FileNotFoundError), in_use(path):
        pass


def test_a_file_another_deleter_removes_first_counts_as_deleted(tmp_path):
    # Two cleaner passes (the service's timer and an operator's) can both open the file;
    # the one that locks second finds it unlinked. Seen in CI as a FileNotFoundError.
    path = str(tmp_path / "x.dump")
    with open(path, "wb") as f:
        f.write(b"data")
    assert delete_unless_in_use(path, lambda: os.unlink(path))
    assert not os.path.exists(path)


async def test_cleaner_passes_run_one_at_a_time(tmp_path):
    for n in range(6):
        when = dt.datetime(2026, 1, 1 + n, tzinfo=dt.UTC)
        header = DumpHeader("db", "t", {"type": "record", "name": "t", "fields": []}, "0-1-1",
                            "b.000001", 4, 0, "", when.isoformat(), 1)
        path = os.path.join(dump_dir(str(tmp_path)), new_name(TableName("db", "t"), when))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps(header.to_json()) + "\n")
    assert len(list_dumps(str(tmp_path))) == 6
    cleaner = Cleaner(RetentionConfig(dumps_keep=1, interval=3600), str(tmp_path),
                      Catalog(str(tmp_path)), lambda: None)
    reports = await asyncio.gather(*(cleaner.clean() for _ in range(4)))
    deleted = [name for report in reports for name in report.deleted]
    assert len(deleted) == 5 and len(set(deleted)) == 5  # each file deleted by one pass
    assert cleaner.runs == 4


def test_a_process_that_dies_holding_a_file_leaves_no_lock(tmp_path):
    path = str(tmp_path / "x.dump")
    with open(path, "wb") as f:
        f.write(b"data")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from cdcserver.store.inuse import in_use\n"
         f"with in_use({path!r}):\n"
         "    print('held', flush=True)\n"
         "    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert not delete_unless_in_use(path)
        holder.kill()
        holder.wait(10)
    finally:
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
    assert delete_unless_in_use(path)


# -- against the service ----------------------------------------------------------------------


def _big_table(source: Source, rows: int = 40000) -> None:
    """About 25 MB of dump: more than the socket buffers hold, so a transfer to a client
    that does not read stays in progress."""
    table = f"`{source.database}`.big"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, body TEXT)")
    for start in range(0, rows, 5000):
        source.execute(f"INSERT INTO {table} SELECT seq, REPEAT(CHAR(65 + seq % 26), 450) "
                       f"FROM `{source.database}`.seq_{start + 1}_to_{start + 5000}")


async def _take_dump(running: RunningService, source: Source) -> DumpInfo:
    address = parse_source_url(source.url)
    results = await asyncio.to_thread(dump_tables, address,
                                      running.service.config.store.data_dir,
                                      [TableName(source.database, "big")], DumpOptions())
    return results[0].info


def _open_transfer(running: RunningService, name: str) -> tuple[socket.socket, Any, int]:
    """A client that asks for a dump and reads only the reply line: (socket, its buffered
    reader, size). Its receive buffer is small and fixed (set before connecting, which also
    turns off autotuning), so the transfer cannot complete into kernel buffers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(10)
    sock.connect((running.host, running.port))
    reader = sock.makefile("rb")
    sock.sendall(auth_message(USER, PASSWORD))
    assert reader.readline() == b"OK\n"
    sock.sendall(b"REGISTER UUID=slow, TYPE=JSON")
    assert reader.readline() == b"OK\n"
    sock.sendall(f"REQUEST-DUMP {name}\n".encode())
    line = reader.readline()
    assert line.startswith(b"OK "), line
    return sock, reader, int(line.split()[1])


@pytest.fixture
async def retaining(tmp_path, source: Source, users_file: str):
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         retention={"dumps_keep": 1, "interval": 3600})
    running = await start_service(config)
    yield running
    if not running.task.done():
        await running.stop()


@pytest.mark.mariadb
async def test_the_cleaner_never_deletes_a_dump_being_sent_and_deletes_it_after(
        retaining: RunningService, source: Source):
    _big_table(source)
    old = await _take_dump(retaining, source)
    new = await _take_dump(retaining, source)
    sock, reader, size = await asyncio.to_thread(_open_transfer, retaining, old.name)
    try:
        for _ in range(3):  # the cleaner runs while the client reads nothing
            report = await retaining.service.housekeeping.cleaner.clean()
            assert old.name in report.in_use and os.path.exists(old.path)
        received = bytearray()
        while len(received) < size:  # now the client reads it all
            data = await asyncio.to_thread(reader.read1, 1 << 16)
            assert data, "the server hung up during the transfer"
            received += data
        with open(new.path, "rb") as f:
            assert f.read(1) == b"{"
        header = DumpHeader.from_json(json.loads(bytes(received).split(b"\n")[0]))
        assert header.rows == old.header.rows and header.checksum == old.header.checksum
    finally:
        reader.close()
        sock.close()
    # Released: the transfer's end wakes the cleaner, which deletes it.
    await asyncio.to_thread(wait_until, lambda: not os.path.exists(old.path), 30,
                            "the released dump to be deleted")
    assert [d.name for d in list_dumps(retaining.service.config.store.data_dir)] == [new.name]


def _done(seen: frozenset[str], listing: tuple[set[str], bool]) -> bool:
    """A dump not seen before is listed, and none of the table is being taken."""
    names, taking = listing
    return bool(names - seen) and not taking


@pytest.mark.mariadb
async def test_dumps_asked_for_without_end_are_kept_to_the_policy_as_they_complete(
        retaining: RunningService, source: Source):
    """A user who may read one table sends START-DUMP again each time the last one is done
    (an attack filled 1 GB in 2 s): each completed dump wakes the cleaner, so the table
    keeps ``dumps_keep`` (1 here), not one more per request until the hourly pass. Done is
    what LIST-DUMPS says: the new dump listed, the table no longer taken (the file in
    the directory comes a moment before; the test sent START-DUMP then, and under load it
    was answered "under way")."""
    from tests.helpers import RawClient, eventually

    _big_table(source, rows=5000)
    await retaining.caught_up(source)
    client = await RawClient.connect(retaining.port)
    await client.login()

    async def listing() -> tuple[set[str], bool]:
        await client.send(f"LIST-DUMPS `{source.database}`.big\n".encode())
        answer = await client.json_line()
        return {d["name"] for d in answer["dumps"]}, bool(answer["taking"])

    seen: set[str] = set()
    try:
        for _ in range(4):
            await client.send(f"START-DUMP `{source.database}`.big\n".encode())
            reply = await client.json_line()
            assert reply["started"] == [f"{source.database}.big"], reply
            listed, _ = await eventually(listing, functools.partial(_done, frozenset(seen)),
                                         60, "the dump asked for")
            seen |= listed
            await eventually(listing, lambda found: len(found[0]) == 1, 60,
                             "the older dumps to be deleted")
    finally:
        await client.close()
    assert len(seen) == 4


@pytest.mark.mariadb
async def test_a_client_that_hangs_up_mid_transfer_releases_the_dump(
        retaining: RunningService, source: Source):
    _big_table(source)
    old = await _take_dump(retaining, source)
    await _take_dump(retaining, source)
    sock, reader, _ = await asyncio.to_thread(_open_transfer, retaining, old.name)
    reader.close()
    report = await retaining.service.housekeeping.cleaner.clean()
    assert old.name in report.in_use
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # a reset, as a crashed client leaves
    await asyncio.to_thread(wait_until, lambda: not os.path.exists(old.path), 30,
                            "the abandoned dump to be deleted")


@pytest.mark.mariadb
async def test_a_restarted_service_holds_no_stale_locks(tmp_path, source: Source,
                                                        users_file: str):
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         retention={"dumps_keep": 1, "interval": 3600})
    running = await start_service(config)
    _big_table(source)
    old = await _take_dump(running, source)
    await _take_dump(running, source)
    sock, reader, _ = await asyncio.to_thread(_open_transfer, running, old.name)
    reader.close()
    try:
        await running.stop()  # mid-transfer
        assert os.path.exists(old.path)
        running = await start_service(config)
        report = await running.service.housekeeping.cleaner.clean()
        assert old.name in report.deleted or not os.path.exists(old.path)
    finally:
        sock.close()
        await running.stop()


@pytest.mark.mariadb
async def test_versions_a_newer_dump_replaces_are_deleted_and_streams_start_after_them(
        tmp_path, source: Source, users_file: str):
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         retention={"versions_max_age": 0.001, "interval": 3600})
    running = await start_service(config)
    try:
        table = f"`{source.database}`.t"
        source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                       f"INSERT INTO {table} VALUES (1)",
                       f"ALTER TABLE {table} ADD COLUMN v INT DEFAULT 7",
                       f"INSERT INTO {table} VALUES (2, 8)")
        await running.caught_up(source)
        entry = running.service.data.catalog.get(TableName(source.database, "t"))
        assert entry is not None and len(entry.versions) >= 2
        first = entry.first()
        assert first is not None
        report = await running.service.housekeeping.cleaner.clean()
        assert report.deleted == []  # no dump replaces anything yet
        address = parse_source_url(source.url)
        await asyncio.to_thread(dump_tables, address, config.store.data_dir,
                                [TableName(source.database, "t")], DumpOptions())
        report = await running.service.housekeeping.cleaner.clean()
        assert os.path.basename(first.path) in report.deleted
        assert not os.path.exists(first.path)
        latest = entry.latest()
        assert latest is not None and latest.version > first.version
        assert first.version not in entry.versions
        client = SyncCdcClient(running.host, running.port, USER, PASSWORD)
        events: list[Any] = await asyncio.to_thread(
            lambda: list(client.stream(f"{source.database}.t", idle_timeout=1)))
        records = [e for e in events if isinstance(e, ChangeRecord)]
        # the rows as a consumer applies them: the ADD COLUMN's repair gives row 1 its
        # default (an update pair that may come after the insert of row 2)
        rows: dict[int, dict[str, Any]] = {}
        for r in records:
            if r.event_type in ("insert", "update_after"):
                rows[r.values["id"]] = r.values
            elif r.event_type == "delete":
                rows.pop(r.values["id"], None)
        assert rows == {1: {"id": 1, "v": 7}, 2: {"id": 2, "v": 8}}
        assert all(r.version > first.version for r in records)
    finally:
        await running.stop()


@pytest.mark.mariadb
async def test_scheduled_dumps_run_when_due_and_not_again_after_a_restart(
        tmp_path, source: Source, users_file: str):
    source.execute(f"CREATE TABLE `{source.database}`.a (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{source.database}`.b (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.b VALUES (1), (2)")
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         dump={"tables": f"{source.database}.*", "interval": 3600})
    running = await start_service(config)
    data_dir = config.store.data_dir
    try:
        await asyncio.to_thread(wait_until, lambda: len(list_dumps(data_dir)) == 2, 60,
                                "the scheduled dumps")
        assert sorted(d.table.table for d in list_dumps(data_dir)) == ["a", "b"]
    finally:
        await running.stop()
    running = await start_service(config)
    try:
        scheduler = running.service.dumps.scheduler
        assert scheduler is not None
        wait = await scheduler.run_due()
        assert 3500 < wait <= 3600 and len(list_dumps(data_dir)) == 2
    finally:
        await running.stop()


@pytest.mark.mariadb
async def test_versions_an_older_kept_dump_continues_in_are_kept(tmp_path, source: Source,
                                                                 users_file: str):
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         retention={"versions_max_age": 0.001, "dumps_keep": 5,
                                    "interval": 3600})
    running = await start_service(config)
    try:
        table = f"`{source.database}`.t"
        name = TableName(source.database, "t")
        address = parse_source_url(source.url)
        source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                       f"INSERT INTO {table} VALUES (1)")
        await running.caught_up(source)
        await asyncio.to_thread(dump_tables, address, config.store.data_dir, [name])
        source.execute(f"ALTER TABLE {table} ADD COLUMN v INT", f"INSERT INTO {table} VALUES "
                       "(2, 2)", f"ALTER TABLE {table} ADD COLUMN w INT")
        await running.caught_up(source)
        await asyncio.to_thread(dump_tables, address, config.store.data_dir, [name])
        entry = running.service.data.catalog.get(name)
        assert entry is not None and sorted(entry.versions) == [1, 2, 3]
        report = await running.service.housekeeping.cleaner.clean()
        assert report.deleted == [] and sorted(entry.versions) == [1, 2, 3]
        first = list_dumps(config.store.data_dir, name)[0]
        await asyncio.to_thread(delete_unless_in_use, first.path)  # the older dump goes
        report = await running.service.housekeeping.cleaner.clean()
        assert sorted(entry.versions) == [3]
        # A stream from a version retention deleted is refused, not silently skipped.
        client = SyncCdcClient(running.host, running.port, USER, PASSWORD)
        with pytest.raises(ProtocolError, match="not found"):
            await asyncio.to_thread(lambda: list(client.stream(f"{source.database}.t.000002",
                                                               idle_timeout=1)))
    finally:
        await running.stop()


@pytest.mark.mariadb
async def test_a_stalled_transfer_is_ended_and_releases_the_dump(tmp_path, source: Source,
                                                                 users_file: str):
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         listener={"idle_timeout": 1.0},
                         retention={"dumps_keep": 1, "interval": 3600})
    running = await start_service(config)
    try:
        _big_table(source)
        old = await _take_dump(running, source)
        await _take_dump(running, source)
        sock, reader, _ = await asyncio.to_thread(_open_transfer, running, old.name)
        try:
            await asyncio.to_thread(wait_until, lambda: not os.path.exists(old.path), 30,
                                    "the stalled transfer to end and its dump to go")
        finally:
            reader.close()
            sock.close()
    finally:
        await running.stop()


@pytest.mark.mariadb
async def test_the_schedule_survives_a_table_that_cannot_be_dumped(tmp_path, source: Source,
                                                                   users_file: str):
    source.execute(f"CREATE TABLE `{source.database}`.a (id INT PRIMARY KEY)")
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         dump={"tables": f"{source.database}.missing, {source.database}.a",
                               "interval": 3600})
    running = await start_service(config)
    try:
        await asyncio.to_thread(wait_until, lambda: len(list_dumps(config.store.data_dir)) == 1,
                                60, "the dump of the table that exists")
        assert running.service.dumps.scheduler is not None
        assert not running.task.done()
    finally:
        await running.stop()
