"""A full data directory: replication pauses without corrupting anything, clients are still
served, and replication resumes, losing and duplicating nothing, once there is room; a dump
that fills it fails in one line, and the next one completes; retention frees it, and
replication resumes by itself.

The data directory is a real, small tmpfs (mounting one needs root, which the suite's machines
give; elsewhere the test is skipped and says so)."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import fastavro
import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.ops.verify import verify_table
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.dump import DumpRows, apply, read_dump
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, fill, small_tmpfs
from tests.oracle import assert_each_change_once, assert_stream_equals_table
from tests.server.test_dump import _loaded, _orders, _table_rows
from tests.server.test_probes import fetch_probe
from tests.server.test_retention import _big_table

T = TypeVar("T")

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

SIZE_MIB = 64


@pytest.fixture
def small_disk(tmp_path) -> Iterator[str]:
    with small_tmpfs(str(tmp_path / "data"), f"{SIZE_MIB}m") as mount_point:
        yield mount_point


async def test_a_full_disk_pauses_replication_and_loses_nothing(small_disk: str,
                                                                 source: Source,
                                                                 users_file: str):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, body TEXT)",
                   f"INSERT INTO {table} VALUES (1, 'before')")
    config = make_config(small_disk, source.url, users_file,
                         store={"disk_full_retry": 0.1})
    cdc = await start_service(config)
    try:
        await cdc.caught_up(source)
        ballast = os.path.join(small_disk, "ballast")
        await asyncio.to_thread(fill, ballast)

        for i in range(2, 62):  # 60 transactions of 60 KB: far more than is left
            source.execute(f"INSERT INTO {table} VALUES ({i}, REPEAT('x', 60000))")
        while not cdc.service.replication.runner.paused:
            await asyncio.wait({cdc.task}, timeout=0.05)
            assert not cdc.task.done(), "the service stopped instead of pausing"
        assert "paused" in cdc.service.replication.runner.paused
        status, doc = await fetch_probe(cdc, "/ready")  # live, and says why it is not ready
        assert status == 503 and doc["reason"] == "paused" and "No space" in doc["message"]
        assert (await fetch_probe(cdc, "/live"))[0] == 200

        # Serving continues from what was committed.
        client = await RawClient.connect(cdc.port)
        await client.login()
        await client.send(f"REQUEST-DATA {source.database}.t\n".encode())
        assert (await client.json_line())["table"] == "t"
        assert (await client.json_line())["body"] == "before"
        await client.close()

        os.unlink(ballast)  # room again
        await cdc.caught_up(source, timeout=120)
        assert not cdc.service.replication.runner.paused
    finally:
        await cdc.stop()

    report = await asyncio.to_thread(verify_table, parse_source_url(source.url), small_disk,
                                     TableName(source.database, "t"))
    assert report.ok and report.duplicates == 0, "\n".join(report.lines())
    assert report.source_rows == report.stream_rows == 61
    for name in os.listdir(os.path.join(small_disk, "avro")):
        if name.endswith(".avro"):
            with open(os.path.join(small_disk, "avro", name), "rb") as f:
                assert sum(1 for _ in fastavro.reader(f)) > 0


async def test_a_dump_that_fills_the_disk_fails_in_one_line_and_the_next_completes(
        small_disk: str, source: Source, users_file: str, caplog):
    """A requested dump meets a full data directory half way: it fails, saying so in one
    line (no traceback), no dump of it is listed, replication goes on; once there is room,
    the next request completes, and the dump is the table."""
    table = _orders(source, 60000)
    name = TableName(source.database, "orders")
    cdc = await start_service(make_config(small_disk, source.url, users_file,
                                          store={"disk_full_retry": 0.1}))
    try:
        await cdc.caught_up(source, timeout=120)
        ballast = os.path.join(small_disk, "ballast")
        await asyncio.to_thread(fill, ballast)
        os.truncate(ballast, os.path.getsize(ballast) - (1 << 20))  # 1 MiB left: too little
        scheduler = cdc.service.dumps.scheduler
        assert scheduler.request([name]) == [name]
        failed = await _until(lambda: next((e for e in scheduler.entries()
                                            if e.state == "failed"), None), 60)
        assert "No space left on device" in failed.error, failed.error
        assert not files.list_dumps(small_disk, name)
        # Chosen by logger, not by the word "dump": the test's own temporary directory and
        # table are named after it, so every warning naming a path would match.
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        said = [r for r in warned if r.name.startswith("cdcserver.dump")]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert "No space left on device" in said[0].getMessage()
        assert not [r.getMessage() for r in warned if r.exc_info], "a traceback was logged"

        os.unlink(ballast)
        source.execute(f"UPDATE {table} SET note = 'after' WHERE id % 1000 = 0")
        assert scheduler.request([name]) == [name]
        await _until(lambda: not scheduler.entries() and files.list_dumps(small_disk, name),
                     120)
        (dump,) = files.list_dumps(small_disk, name)
        image: dict[tuple[object, ...], dict[str, object]] = {}
        for item in read_dump(dump.path):
            if isinstance(item, DumpRows):
                apply(image, ["id"], item)
        assert _loaded(image) == _table_rows(source, table)
        await cdc.caught_up(source)
        await _stream_checked(cdc, source, "orders", assert_each_change_once)
    finally:
        await cdc.stop()


async def _stream_checked(cdc: RunningService, source: Source, table: str,
                          oracle: Callable[..., Awaitable[object]]) -> None:
    """The table's stream checked against ``SELECT`` by ``oracle`` (of :mod:`tests.oracle`)."""
    conn = source.server.connect()
    try:
        await oracle(cdc.port, conn, source.database, table, user=USER, password=PASSWORD)
    finally:
        conn.close()


async def _until(found: Callable[[], T | None], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s")


async def test_retention_frees_a_full_disk_and_replication_resumes_by_itself(
        tmp_path, source: Source, users_file: str):
    """Retention keeps working under pressure: with the data directory full and replication
    paused, the cleaner still deletes a version a newer dump replaced (its index entries
    too, though SQLite has no room for a journal), and the room it frees lets replication
    resume by itself. The store stays whole: a restart opens it and the stream after the
    dump, with the dump, is the table."""
    with small_tmpfs(str(tmp_path / "data"), "96m") as data_dir:
        _big_table(source, rows=40000)  # about 20 MB in version 1
        name = TableName(source.database, "big")
        config = make_config(data_dir, source.url, users_file,
                             store={"disk_full_retry": 0.1},
                             retention={"versions_max_bytes": 1, "interval": 3600})
        cdc = await start_service(config)
        try:
            await cdc.caught_up(source, timeout=120)
            # version 2, which a dump then replaces version 1 with (an ALTER that fills no
            # row: one that did would be repaired, which on this disk does not fit beside
            # the rest: the next test)
            source.execute(f"ALTER TABLE {source.database}.big ADD COLUMN x INT")
            await cdc.caught_up(source)
            (result,) = await asyncio.to_thread(
                dump_tables, parse_source_url(source.url), data_dir, [name], DumpOptions())
            assert result.info.header.stream_version == 2
            await asyncio.to_thread(fill, os.path.join(data_dir, "ballast"))
            source.execute(f"UPDATE {source.database}.big SET x = 2 WHERE id <= 2000")
            await _until(lambda: cdc.service.replication.runner.paused, 60)

            report = await cdc.service.housekeeping.cleaner.clean()
            assert report.deleted == [os.path.basename(
                DataDir(data_dir).table_file(name, 1, "avro"))], report
            await cdc.caught_up(source, timeout=120)  # resumed by itself
            assert not cdc.service.replication.runner.paused
        finally:
            await cdc.stop()
        os.unlink(os.path.join(data_dir, "ballast"))
        cdc = await start_service(config)  # the store opens whole after it all
        try:
            source.execute(f"DELETE FROM {source.database}.big WHERE id > 39990")
            await cdc.caught_up(source)
            image: dict[tuple[object, ...], dict[str, object]] = {}
            for item in read_dump(result.info.path):
                if isinstance(item, DumpRows):
                    apply(image, ["id"], item)
            client = await RawClient.connect(cdc.port)
            await client.login()
            await client.send(f"REQUEST-DATA {source.database}.big\n".encode())
            assert (await client.json_line())["version"] == 2  # the schema: version 1 gone
            for _ in range(2 * 2000 + 10):  # 2,000 updates (before, after), 10 deletes
                record = await client.json_line()
                key = (record["id"],)
                if record["event_type"] in ("insert", "update_after"):
                    image[key] = {c: record[c] for c in ("id", "body", "x")}
                elif record["event_type"] == "delete":
                    image.pop(key, None)
            await client.close()
            rows = source.query(f"SELECT id, body, x FROM {source.database}.big")
            assert {k: (v["body"], v["x"]) for k, v in image.items()} == \
                {(r[0],): (r[1], r[2]) for r in rows}
        finally:
            await cdc.stop()



async def test_a_repair_that_does_not_fit_waits_for_room_without_reading_the_table_again_and_again(
        tmp_path, source: Source, users_file: str, caplog: pytest.LogCaptureFixture):
    """A whole table's repair beside the stream (an ALTER that gives every row a value)
    needs the table's rows twice in its scratch file, besides the records it writes: on a
    disk with room for less, the repair fails and replication pauses; resuming then, as the
    pause removed the scratch file, would fill the disk again and read the whole table from
    the source again, in a loop. Replication waits for room for that file again besides,
    so it stays paused; once room is freed it resumes by itself, and the stream is the
    table."""
    caplog.set_level("INFO", logger="cdcserver")
    with small_tmpfs(str(tmp_path / "data"), "160m") as data_dir:
        ballast = os.path.join(data_dir, "ballast")
        with open(ballast, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 112 << 20)  # 48 MiB left: less than it needs
        _big_table(source, rows=40000)
        config = make_config(data_dir, source.url, users_file, store={"disk_full_retry": 0.1})
        cdc = await start_service(config)
        try:
            await cdc.caught_up(source, timeout=120)
            source.execute(f"ALTER TABLE {source.database}.big ADD COLUMN x INT DEFAULT 1")
            await cdc.caught_up(source)
            tick = f"`{source.database}`._tick"
            source.execute(f"CREATE TABLE {tick} (id INT AUTO_INCREMENT PRIMARY KEY)")

            def stays_paused() -> bool:
                source.execute(f"INSERT INTO {tick} VALUES ()")  # the repair's records' ride
                wanted = [int(m) for r in caplog.records
                          for m in re.findall(r"has room again \((\d+) MiB free",
                                              r.getMessage())]
                scratch = glob.glob(os.path.join(data_dir, "state", "*.repair-*"))
                return bool(wanted) and not scratch and wanted[-1] << 20 > _free(data_dir) \
                    and cdc.service.replication.runner.paused is not None

            await _until(stays_paused, 180)
            reads = _repair_reads(caplog)
            assert 1 <= reads <= 5, f"the repair was read {reads} times while the disk was full"
            os.unlink(ballast)
            await cdc.repairs_out(source, timeout=180)
            assert not cdc.service.replication.runner.paused
            await _stream_checked(cdc, source, "big", assert_stream_equals_table)
        finally:
            await cdc.stop()


def _repair_reads(caplog: pytest.LogCaptureFixture) -> int:
    return sum("is read beside the stream" in r.getMessage() for r in caplog.records)


def _free(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
