"""Chunked dumps against a real MariaDB: short reads, several readers, changes merged in.

A chunked dump reads each chunk in a snapshot of its own and merges the changes made between
them from the store. The oracle is the table itself (``SELECT``) and ``verify --dump``: a
client that loads the dump and follows the stream after it must hold exactly the table, with
writes going on in every chunk; an ``ALTER TABLE`` during the dump must not wait for it; a
dump killed with SIGKILL continues and still gives the table exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.ops.verify import verify_table
from cdcserver.store.naming import dump_stem
from mariadb_cdc_client import SyncCdcClient
from mariadb_cdc_client.dump import DumpRows, apply, read_dump
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, eventually, joined, kill_when, wait_until
from tests.server.test_dump import Writer, _follow_until, _loaded, _orders, _table_rows

pytestmark = pytest.mark.mariadb


def _dumped(path: str, key: list[str]) -> tuple[dict[tuple[Any, ...], dict[str, Any]], set[str]]:
    """The table a dump holds, and the actions its lines use."""
    image: dict[tuple[Any, ...], dict[str, Any]] = {}
    actions = set()
    for item in read_dump(path):
        if isinstance(item, DumpRows):
            actions.add(item.action)
            apply(image, key, item)
    return image, actions


async def test_a_chunked_dump_under_writes_in_every_chunk_then_follow_is_the_table(
        cdc: RunningService, source: Source, caplog: pytest.LogCaptureFixture):
    table = _orders(source, 20000)
    await cdc.caught_up(source)
    caplog.set_level(logging.INFO, logger="cdcserver.dump")
    with Writer(source, table, 20000) as writer:
        await asyncio.to_thread(writer.enough.wait, 30)
        before = writer.transactions
        results = await asyncio.to_thread(
            dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
            [TableName(source.database, "orders")],
            DumpOptions(DumpConfig(chunk_rows=300, readers=2)))
        during = writer.transactions - before
        writer.transactions = 0
        writer.enough.clear()
        await asyncio.to_thread(writer.enough.wait, 30)  # and after it
    assert re.search(r"2 readers over \d+ key ranges", caplog.text)
    merged = [r.message for r in caplog.records if "changes merged" in r.message]
    assert merged and " 0 changes merged" not in merged[0], merged
    assert during > 20, "the writer must keep committing while the dump runs"
    sentinel = 10_000_000
    source.execute(f"INSERT INTO {table} (id, name) VALUES ({sentinel}, 'the end')")
    await cdc.caught_up(source)

    info = results[0].info
    image, actions = _dumped(info.path, ["id"])
    assert actions == {"insert"}  # as a single-snapshot dump: the table at one point
    assert info.header.rows == len(image) and not info.header.resumed
    followed: dict[tuple[Any, ...], dict[str, Any]] = {}
    client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
    header, changes = await asyncio.to_thread(_follow_until, client,
                                              f"{source.database}.orders", followed, sentinel)
    assert header.checksum == info.header.checksum and changes > 0
    assert _loaded(followed) == _table_rows(source, table)
    report = await asyncio.to_thread(
        verify_table, parse_source_url(source.url), cdc.service.config.store.data_dir,
        TableName(source.database, "orders"), 60.0, info.path)
    assert report.ok, report.lines()


async def test_an_alter_table_during_a_chunked_dump_does_not_wait_for_it(
        cdc: RunningService, source: Source):
    """The ALTER waits for one chunk's read at most (SHOW PROCESSLIST shows how long it was
    in 'Waiting for table metadata lock'); the dump starts the table over in its new
    definition; a writer commits all along.

    The bounds are fractions of the dump's own time, measured in the same run, so that a busy
    machine slows both sides alike: a dump that held its lock to the end would keep the ALTER
    waiting until after it ended."""
    table = _orders(source, 60000)
    await cdc.caught_up(source)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    altered, finished = threading.Event(), threading.Event()
    seconds: list[float] = []
    ended: list[float] = []
    waited: list[float] = []

    def alter_once_under_way(_: TableName, rows: int) -> None:
        if rows < 6000 or altered.is_set():
            return
        altered.set()
        threading.Thread(target=alter, daemon=True).start()
        # This reader's range stays unfinished until the ALTER has reached the server (or is
        # done): without it, a loaded machine let the dump read every remaining row before
        # the ALTER was even sent, and the dump was rightly of the old definition.
        wait_until(lambda: finished.is_set() or bool(source.query(
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE INFO LIKE 'ALTER TABLE%extra%'")),
            30, "the ALTER to reach the server")

    def alter() -> None:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        source.execute(f"ALTER TABLE {table} ADD COLUMN extra INT DEFAULT 7")
        ended.append(time.monotonic())
        seconds.append(ended[0] - started)
        finished.set()
        watcher.join(5)

    def watch() -> None:  # samples the ALTER's state until it is done
        while not finished.wait(0.005):
            for row in source.query("SELECT STATE, TIME_MS FROM information_schema.PROCESSLIST"
                                    " WHERE INFO LIKE 'ALTER TABLE%extra%'"):
                if row[0] and "metadata lock" in str(row[0]):
                    waited.append(float(row[1]) / 1000)

    with Writer(source, table, 60000) as writer:
        await asyncio.to_thread(writer.enough.wait, 30)
        before = writer.transactions
        dump_started = time.monotonic()
        results = await asyncio.to_thread(
            dump_tables, parse_source_url(source.url), data_dir, [name],
            DumpOptions(DumpConfig(chunk_rows=2000, readers=2)), None, alter_once_under_way)
        dump_ended = time.monotonic()
        during = writer.transactions - before
    assert altered.is_set() and seconds, "the ALTER must run while the dump is under way"
    dump_seconds = dump_ended - dump_started
    assert ended[0] < dump_ended, "the ALTER waited for the dump to end"
    assert seconds[0] < dump_seconds / 2, \
        f"ALTER TABLE took {seconds[0]:.2f}s of the dump's {dump_seconds:.2f}s"
    assert max(waited, default=0.0) < dump_seconds / 4, (waited, dump_seconds)
    assert during > 20
    info = results[0].info
    assert [f.column for f in info.header.columns][-1] == "extra"  # started over, new version
    image, actions = _dumped(info.path, ["id"])
    assert actions == {"insert"}
    assert len(image) == info.header.rows and all(r["extra"] == 7 for r in image.values())
    report = await asyncio.to_thread(verify_table, parse_source_url(source.url), data_dir,
                                     name, 60.0, info.path)
    assert report.ok, "\n".join(report.lines())


async def test_a_composite_string_key_is_ranged_by_sampled_boundaries(
        cdc: RunningService, source: Source, caplog: pytest.LogCaptureFixture):
    table = f"`{source.database}`.people"
    source.execute(f"CREATE TABLE {table} (region VARCHAR(20) CHARACTER SET utf8mb4 "
                   "COLLATE utf8mb4_general_ci, code VARBINARY(8), n INT, "
                   "PRIMARY KEY (region, code))")
    regions = ["abc", "ABD", "Ärger", "zeta", "o'brien", "back\\slash", "日本", "", "m", "Z"]
    rows = [(r, f"{c:04x}", i) for i, (r, c) in
            enumerate((r, c) for r in regions for c in range(0, 3000, 10))]
    for start in range(0, len(rows), 500):
        source.execute(f"INSERT INTO {table} VALUES " + ", ".join(
            f"({source.query('SELECT QUOTE(%s)', (r,))[0][0]}, X'{c}', {n})"
            for r, c, n in rows[start:start + 500]))
    source.execute(f"ANALYZE TABLE {table}")
    await cdc.caught_up(source)
    caplog.set_level(logging.INFO, logger="cdcserver.dump")
    stop = threading.Event()

    def churn() -> None:  # changes in every range while the dump reads
        i = 0
        while not stop.is_set():
            region = source.query("SELECT QUOTE(%s)", (regions[i % len(regions)],))[0][0]
            source.execute(
                f"UPDATE {table} SET n = n + 1000000 WHERE region = {region} AND "
                f"code = X'{i % 300 * 10:04x}'",
                f"DELETE FROM {table} WHERE n = {i * 7 % len(rows)}",
                f"INSERT IGNORE INTO {table} VALUES ('new{i}', X'00', {-i})")
            i += 1

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        results = await asyncio.to_thread(
            dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
            [TableName(source.database, "people")],
            DumpOptions(DumpConfig(chunk_rows=100, readers=3)))
    finally:
        stop.set()
        joined(churner)
    assert "3 readers over 3 key ranges" in caplog.text
    info = results[0].info
    report = await asyncio.to_thread(
        verify_table, parse_source_url(source.url), cdc.service.config.store.data_dir,
        TableName(source.database, "people"), 60.0, info.path)
    assert report.ok, report.lines()
    image, actions = _dumped(info.path, ["region", "code"])
    assert actions == {"insert"} and len(image) == info.header.rows


async def test_a_table_without_a_key_keeps_the_single_read_and_says_so(
        cdc: RunningService, source: Source, caplog: pytest.LogCaptureFixture):
    table = f"`{source.database}`.log"
    source.execute(f"CREATE TABLE {table} (msg VARCHAR(20), n INT)",
                   f"INSERT INTO {table} VALUES ('a', 1), ('a', 1), ('b', NULL)")
    await cdc.caught_up(source)
    caplog.set_level(logging.INFO, logger="cdcserver.dump")
    results = await asyncio.to_thread(
        dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
        [TableName(source.database, "log")], DumpOptions(DumpConfig(chunk_rows=1, readers=2)))
    assert "read in one snapshot" in caplog.text and "no primary key" in caplog.text
    assert results[0].info.header.rows == 3


async def test_a_killed_chunked_dump_continues_and_gives_the_table(cdc: RunningService,
                                                                   source: Source):
    table = _orders(source, 30000)
    await cdc.caught_up(source)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    record = os.path.join(files.dump_dir(data_dir), f"{dump_stem(name)}.chunked")
    command = [sys.executable, "-m", "cdcserver.app.cli", "dump", f"{source.database}.orders",
               "--source", source.url, "--data-dir", data_dir, "--readers", "2",
               "--sync-interval", "0", "--chunk-rows", "200"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        await asyncio.to_thread(kill_when, process, record, lambda text: sum(
            len(r["chunks"]) for r in json.loads(text)["ranges"]) >= 6)
    finally:
        process.kill()
        process.wait(30)
    assert files.list_dumps(data_dir, name) == []
    # changes to rows already read and to rows not read yet, in both ranges
    source.execute(f"DELETE FROM {table} WHERE id <= 50 OR id BETWEEN 20001 AND 20050",
                   f"UPDATE {table} SET note = 'changed', amount = 1.23 WHERE id % 97 = 0",
                   f"UPDATE {table} SET id = id + 100000 WHERE id IN (100, 29999)",
                   f"INSERT INTO {table} (id, name) VALUES (-5, 'first'), (40000, 'last')")
    await cdc.caught_up(source)
    done = await asyncio.to_thread(subprocess.run, [*command, "--json"], capture_output=True,
                                   text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"resumed": true' in done.stdout, done.stderr
    (dump,) = files.list_dumps(data_dir, name)
    image, actions = _dumped(dump.path, ["id"])
    assert actions == {"insert"}
    assert _loaded(image) == _table_rows(source, table)
    assert dump.header.rows == len(image)
    assert not os.path.exists(record)


async def test_an_instant_alter_just_after_a_chunk_opened_its_snapshot_starts_over(
        cdc: RunningService, source: Source, monkeypatch: pytest.MonkeyPatch):
    """InnoDB hands an older read view the new layout of an instant ALTER without error: a
    chunk must see the changed definition under its metadata lock and the dump start over,
    with the ALTER before its point."""
    from cdcserver.core.gtid import GtidState
    from cdcserver.dump import chunkreader

    table = _orders(source, 3000)
    await cdc.caught_up(source)
    original = chunkreader.open_snapshot_position
    opened: list[Any] = []

    def open_then_alter(conn: Any) -> Any:
        point = original(conn)
        opened.append(source.gtid_state())  # the snapshot holds no later transaction
        if len(opened) == 3:  # a chunk's snapshot, after the first chunks were read
            source.execute(f"ALTER TABLE {table} ADD COLUMN late INT DEFAULT 1, "
                           "ALGORITHM=INSTANT")
        return point

    monkeypatch.setattr(chunkreader, "open_snapshot_position", open_then_alter)
    results = await asyncio.to_thread(
        dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
        [TableName(source.database, "orders")], DumpOptions(DumpConfig(chunk_rows=500, readers=1)))
    header = results[0].info.header
    assert [f.column for f in header.columns][-1] == "late"
    alter = next(iter(source.gtid_state()))
    assert GtidState.parse(header.gtid).covers(alter) and not opened[2].covers(alter)
    image, _ = _dumped(results[0].info.path, ["id"])
    assert len(image) == 3000 and all(row["late"] == 1 for row in image.values())


async def test_start_dump_over_the_protocol_while_the_stream_goes_on(
        cdc: RunningService, source: Source, users_file: str):
    """START-DUMP (extension): a new dump taken by the running service, its progress in
    LIST-DUMPS and the metrics, permission-checked as REQUEST-DATA is; the stream goes on."""
    from cdcserver.protocol.users import UsersFile
    from tests.helpers import RawClient

    db = source.database
    table = _orders(source, 5000)
    source.execute(f"CREATE TABLE `{db}`.secret (id INT PRIMARY KEY)")
    await cdc.caught_up(source)
    UsersFile(users_file).add("orders_only", "pw", tables=f"{db}.orders")
    client = await RawClient.connect(cdc.port)
    await client.login()
    limited = await RawClient.connect(cdc.port)
    await limited.login(user="orders_only", password="pw")
    try:
        await limited.send(f"START-DUMP {db}.secret\n".encode())
        assert (await limited.line()).startswith(b"ERR FORBIDDEN")
        await client.send(f"START-DUMP {db}.nothing\n".encode())
        assert (await client.line()).startswith(b"ERR NO-FILE")
        await client.send(b"START-DUMP\n")
        assert (await client.line()).startswith(b"ERR BAD-SYNTAX")

        # The table is locked: the dump starts and cannot read a row until it is let go.
        locker = source.server.connect(db)
        cur = locker.cursor()
        cur.execute("LOCK TABLES orders WRITE")
        try:
            await limited.send(f"START-DUMP {db}.*\n".encode())  # only what it may read
            assert await limited.json_line() == {"started": [f"{db}.orders"],
                                                 "under_way": []}

            async def taking() -> list[dict[str, Any]]:
                await client.send(f"LIST-DUMPS {db}.orders\n".encode())
                return list((await client.json_line())["taking"])

            now = await eventually(taking, lambda t: bool(t) and t[0]["state"] == "running",
                                   what="the requested dump to run")
            assert now[0]["estimated_rows"] > 0, now
            assert now[0]["rows"] == 0
            stats = cdc.service.stats().housekeeping
            assert stats.dump_running and sum(d.estimated_rows for d in stats.dumps) > 0
            await client.send(f"START-DUMP {db}.orders\n".encode())  # once is enough
            assert await client.json_line() == {"started": [], "under_way": [f"{db}.orders"]}
        finally:
            cur.execute("UNLOCK TABLES")
            locker.close()
        source.execute(f"INSERT INTO {table} (id, name) VALUES (99999, 'while dumping')")
        assert await eventually(taking, lambda t: not t, what="the dump to end") == []
        await client.send(f"LIST-DUMPS {db}.orders\n".encode())
        (made,) = (await client.json_line())["dumps"]
    finally:
        await client.close()
        await limited.close()
    await cdc.caught_up(source)
    report = await asyncio.to_thread(
        verify_table, parse_source_url(source.url), cdc.service.config.store.data_dir,
        TableName(db, "orders"), 60.0,
        os.path.join(files.dump_dir(cdc.service.config.store.data_dir), made["name"]))
    assert report.ok, "\n".join(report.lines())


async def test_cdc_dump_new_and_cdcserver_dump_show_progress(cdc: RunningService,
                                                             source: Source, tmp_path):
    db = source.database
    _orders(source, 3000)
    await cdc.caught_up(source)
    cdc_command = os.path.join(os.path.dirname(sys.executable), "cdc")
    out = tmp_path / "orders.dump"
    done = await asyncio.to_thread(
        subprocess.run, [cdc_command, "dump", f"{db}.orders", "--new", "--progress", "-o",
                         str(out), "-P", str(cdc.port), "-u", USER, "-p", PASSWORD],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"dumping {db}.orders" in done.stderr and "saved" in done.stderr
    image, _ = _dumped(str(out), ["id"])
    assert len(image) == 3000

    data_dir = cdc.service.config.store.data_dir
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "cdcserver.app.cli", "dump", f"{db}.orders",
                         "--source", source.url, "--data-dir", data_dir, "--progress"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{db}.orders" in done.stderr and "3.00k" in done.stderr, done.stderr  # rows
    assert len(files.list_dumps(data_dir, TableName(db, "orders"))) == 2


async def test_cdcserver_dump_progress_shows_rows_rate_and_time_left(cdc: RunningService,
                                                                     source: Source):
    """Per table on stderr, as `cdc dump --progress`: rows written of the rows the source
    estimates (ANALYZE TABLE makes InnoDB's estimate), the rate, and the time left; in ten
    chunks, so the bar moves."""
    db = source.database
    _orders(source, 20000)
    source.execute(f"ANALYZE TABLE `{db}`.orders")
    await cdc.caught_up(source)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "cdcserver.app.cli", "dump", f"{db}.orders",
                         "--source", source.url, "--data-dir",
                         cdc.service.config.store.data_dir, "--progress"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "CDCSERVER_DUMP_CHUNK_ROWS": "2000"})
    assert done.returncode == 0, done.stderr
    bars = re.findall(rf"{db}\.orders: +(\d+)%\|[^|]*\| ([\d.]+k?)/([\d.]+k) "
                      r"\[\d\d:\d\d<(\d\d:\d\d|\?), +([\d.]+[kMG]?|\?) rows/s\]",
                      done.stderr)
    assert len(bars) >= 2, done.stderr  # the start, then at least the end
    percent, rows, estimate, left, rate = bars[-1]
    assert (rows, left) == ("20.0k", "00:00") and int(percent) >= 80, bars[-1]
    assert 15 < float(estimate.rstrip("k")) < 25  # the source's estimate of 20,000 rows
    assert float(rate.rstrip("kMG")) > 0


async def _orders_and(cdc: RunningService, source: Source, other: str) -> Any:
    """``orders`` (200 rows) and ``other`` (one row), the service caught up with them, and a
    client logged in (a RawClient)."""
    from tests.helpers import RawClient

    db = source.database
    _orders(source, 200)
    source.execute(f"CREATE TABLE `{db}`.`{other}` (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.`{other}` VALUES (1)")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login()
    return client


async def test_a_requested_dump_that_fails_is_listed_failed_with_its_error(
        cdc: RunningService, source: Source):
    """Two tables requested while the first is locked: the second waits (queued, in the
    metrics); it is dropped meanwhile, so its dump fails and LIST-DUMPS says so, with the
    error, while the first completes."""
    db = source.database
    client = await _orders_and(cdc, source, "gone")

    async def taking() -> dict[str, dict[str, Any]]:
        await client.send(b"LIST-DUMPS\n")
        return {p["table"]: p for p in (await client.json_line())["taking"]}

    locker = source.server.connect(db)
    cur = locker.cursor()
    cur.execute("LOCK TABLES orders WRITE")
    try:
        await client.send(f"START-DUMP {db}.orders\n".encode())
        await client.json_line()
        await eventually(taking, lambda t: t.get("orders", {}).get("state") == "running")
        await client.send(f"START-DUMP {db}.gone\n".encode())
        assert await client.json_line() == {"started": [f"{db}.gone"], "under_way": []}
        assert (await taking())["gone"]["state"] == "queued"
        housekeeping = cdc.service.stats().housekeeping
        assert [d.state for d in housekeeping.dumps if d.table.table == "gone"] == ["queued"]
        source.execute(f"DROP TABLE `{db}`.gone")
    finally:
        cur.execute("UNLOCK TABLES")
        locker.close()
    listed = await eventually(taking, lambda t: "orders" not in t and
                              t.get("gone", {}).get("state") == "failed")
    assert "gone" in listed["gone"]["error"], listed
    assert [d.state for d in cdc.service.stats().housekeeping.dumps] == ["failed"]
    await client.send(f"LIST-DUMPS {db}.orders\n".encode())
    assert len((await client.json_line())["dumps"]) == 1
    await client.close()


async def test_a_table_whose_dump_is_in_place_may_be_asked_for_again_while_its_pass_goes_on(
        cdc: RunningService, source: Source):
    """Two tables in one START-DUMP, the second locked: the first's dump lands, and from
    then on it is no longer listed as taken, so asking for it again queues a new dump (it
    was listed running, and refused as under way, until the whole pass ended). Once a
    table is not taken, its dump is listed (it may be listed a moment before that)."""
    db = source.database
    client = await _orders_and(cdc, source, "first")

    async def listing() -> tuple[list[str], dict[str, str]]:
        await client.send(b"LIST-DUMPS\n")
        answer = await client.json_line()
        return ([d["table"] for d in answer["dumps"] if d["database"] == db],
                {p["table"]: p["state"] for p in answer["taking"] if p["database"] == db})

    locker = source.server.connect(db)
    cur = locker.cursor()
    cur.execute("LOCK TABLES orders WRITE")
    try:
        await client.send(f"START-DUMP {db}.first {db}.orders\n".encode())
        assert await client.json_line() == {"started": [f"{db}.first", f"{db}.orders"],
                                            "under_way": []}
        dumps, taking = await eventually(listing, lambda listed: "first" not in listed[1],
                                         what="the first table's dump")
        assert dumps == ["first"] and taking == {"orders": "running"}
        await client.send(f"START-DUMP {db}.first\n".encode())
        assert await client.json_line() == {"started": [f"{db}.first"], "under_way": []}
        assert (await listing())[1] == {"orders": "running", "first": "queued"}
    finally:
        cur.execute("UNLOCK TABLES")
        locker.close()
    dumps, _ = await eventually(listing, lambda listed: not listed[1],
                                what="both passes to end")
    assert sorted(dumps) == ["first", "first", "orders"]
    await client.close()


async def test_a_table_growing_at_the_end_of_its_key_does_not_keep_the_dump_reading(
        cdc: RunningService, source: Source):
    """The last key range ends at the table's last key when the dump begins; rows added
    after it come from the changes merged in. A dump whose last range was open chased the
    table's end for as long as rows came faster than its chunks read them (here 50 rows a
    transaction against chunks of 2 rows: it never finished). The same for an empty
    table: every row comes from the changes."""
    for name, first_rows in (("grows", 200), ("empty", 0)):
        table = f"`{source.database}`.{name}"
        source.execute(f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
                       *([f"INSERT INTO {table} (v) SELECT seq FROM "
                          f"`{source.database}`.seq_1_to_{first_rows}"]
                         if first_rows else []))
        await cdc.caught_up(source)
        stop = threading.Event()

        def grow(table: str = table, stop: threading.Event = stop) -> None:
            conn = source.server.connect()
            try:
                with conn.cursor() as cur:
                    # 50 rows each 10 ms at most: 5,000 a second, ten times what chunks
                    # of 2 rows read, without taking the machine from the other tests
                    while not stop.wait(0.01):
                        cur.execute(f"INSERT INTO {table} (v) SELECT seq FROM "
                                    f"`{source.database}`.seq_1_to_50")
            finally:
                conn.close()

        grower = threading.Thread(target=grow, daemon=True)
        grower.start()
        try:
            dumping = asyncio.to_thread(
                dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
                [TableName(source.database, name)], DumpOptions(DumpConfig(chunk_rows=2,
                                                                            readers=1)))
            (result,) = await asyncio.wait_for(dumping, 120)  # a hang guard: about 1 s
        finally:
            stop.set()
            joined(grower)
        source.execute(f"INSERT INTO {table} (id, v) VALUES (10000000, -1)")
        await cdc.caught_up(source)
        image: dict[tuple[Any, ...], dict[str, Any]] = {}
        client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
        await asyncio.to_thread(_follow_until, client, f"{source.database}.{name}", image,
                                10000000)
        assert {k: v["v"] for k, v in image.items()} == \
            {(i,): v for i, v in source.query(f"SELECT id, v FROM {table}")}
        assert result.info.header.rows >= first_rows
