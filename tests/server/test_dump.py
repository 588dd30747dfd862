"""Dumps against a real MariaDB: snapshot, format, serving, resume, following.

The central property: a client that loads a dump and then applies the changes that follow
it ends up with exactly the table, even when the table was being written to while the dump
was taken. Checked two ways: against the table's rows directly, and with ``verify --dump``.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from decimal import Decimal
from typing import Any

import pytest

from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import (
    DumpBusy,
    DumpInterrupted,
    DumpOptions,
    dump_tables,
    resolve_tables,
)
from cdcserver.ops.verify import verify_table
from cdcserver.store.naming import dump_stem
from mariadb_cdc_client import CdcClient, ChangeRecord, SchemaChange, SyncCdcClient
from mariadb_cdc_client.dump import DumpHeader, DumpRows, apply, read_dump
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, RawClient, joined, kill_when, wait_until

pytestmark = pytest.mark.mariadb


class Writer:
    """Random inserts, updates (including of the key) and deletes on a table, in its own
    thread and connection, until stopped."""

    def __init__(self, source: Source, table: str, first_id: int, seed: int = 7) -> None:
        self.source = source
        self.table = table
        self.next_id = first_id
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.enough = threading.Event()  # set after 50 transactions
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        joined(self.thread)

    def _run(self) -> None:
        conn = self.source.server.connect(self.source.database)
        rnd = self.random
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute("BEGIN")
                    for _ in range(rnd.randint(1, 5)):
                        self._change(cur, rnd)
                    cur.execute("COMMIT")
                    self.transactions += 1
                    if self.transactions >= 50:
                        self.enough.set()
        finally:
            conn.close()

    def _change(self, cur: Any, rnd: random.Random) -> None:
        action = rnd.random()
        target = rnd.randint(1, max(self.next_id, 2))
        if action < 0.4:
            self.next_id += 1
            cur.execute(f"INSERT INTO {self.table} (id, name, amount, note) VALUES "
                        "(%s, %s, %s, %s)", (self.next_id, f"new-{self.next_id}",
                                             Decimal(rnd.randint(0, 99999)) / 100, None))
        elif action < 0.75:
            cur.execute(f"UPDATE {self.table} SET amount = amount + 1, note = %s "
                        "WHERE id = %s", (f"u{rnd.random()}", target))
        elif action < 0.85:
            self.next_id += 1
            cur.execute(f"UPDATE IGNORE {self.table} SET id = %s WHERE id = %s",
                        (self.next_id, target))
        else:
            cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (target,))


def _orders(source: Source, rows: int) -> str:
    table = f"`{source.database}`.orders"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
                   "amount DECIMAL(10,2), note TEXT, f FLOAT DEFAULT 1.1, "
                   "made DATETIME(6) DEFAULT '2024-01-02 03:04:05.123456')")
    for start in range(0, rows, 5000):
        values = ",".join(f"({i}, 'name-{i}', {i % 1000}.{i % 100:02d}, "
                          f"{'NULL' if i % 7 == 0 else repr('note ' * (i % 5))})"
                          for i in range(start + 1, min(start + 5000, rows) + 1))
        source.execute(f"INSERT INTO {table} (id, name, amount, note) VALUES {values}")
    return table


def _table_rows(source: Source, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, name, amount, note FROM {table}")
            return {(r[0],): {"id": r[0], "name": r[1], "amount": r[2], "note": r[3]}
                    for r in cur.fetchall()}
    finally:
        conn.close()


def _loaded(image: dict[tuple[Any, ...], dict[str, Any]]) -> dict[tuple[Any, ...], dict]:
    return {k: {c: v[c] for c in ("id", "name", "amount", "note")} for k, v in image.items()}


async def _dump(cdc: RunningService, source: Source, *tables: str,
                **options: Any) -> list[Any]:
    address = parse_source_url(source.url)
    names = [TableName(source.database, t) for t in tables]
    return await asyncio.to_thread(dump_tables, address, cdc.service.config.store.data_dir,
                                   names, DumpOptions(DumpConfig(**options)))


def _follow_until(client: SyncCdcClient, target: str, image: dict, sentinel: int
                  ) -> tuple[DumpHeader, int]:
    """Load the newest dump of ``target`` and apply what follows it, up to the insert of
    the row whose id is ``sentinel``."""
    header: DumpHeader | None = None
    changes = 0
    before: dict[str, Any] | None = None
    for item in client.dump(target, follow=True):
        if isinstance(item, DumpHeader):
            header = item
        elif isinstance(item, DumpRows):
            apply(image, ["id"], item)
        elif isinstance(item, SchemaChange):
            continue
        elif isinstance(item, ChangeRecord):
            changes += 1
            if item.event_type == "update_before":
                before = item.values
                continue
            if item.event_type == "update_after":
                assert before is not None
                image.pop((before["id"],), None)
            if item.event_type == "delete":
                image.pop((item.values["id"],), None)
            else:
                image[(item.values["id"],)] = item.values
            if item.event_type == "insert" and item.values["id"] == sentinel:
                break
    assert header is not None
    return header, changes


@pytest.mark.parametrize("rows", [0, 1, 2500, 20000])
async def test_dump_plus_followed_changes_equal_the_table_under_concurrent_writes(
        cdc: RunningService, source: Source, rows: int):
    table = _orders(source, rows)
    with Writer(source, table, rows) as writer:
        await asyncio.to_thread(writer.enough.wait, 30)  # writes before and during the dump
        results = await _dump(cdc, source, "orders", chunk_rows=777)
        writer.transactions = 0
        writer.enough.clear()
        await asyncio.to_thread(writer.enough.wait, 30)  # and after it
    sentinel = 10_000_000
    source.execute(f"INSERT INTO {table} (id, name) VALUES ({sentinel}, 'the end')")
    await cdc.caught_up(source)

    header = results[0].info.header
    assert header.gtid and header.binlog_file and header.consistent and not header.resumed
    image: dict[tuple[Any, ...], dict[str, Any]] = {}
    client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
    got, changes = await asyncio.to_thread(_follow_until, client, f"{source.database}.orders",
                                           image, sentinel)
    assert got.checksum == header.checksum and changes > 0
    assert _loaded(image) == _table_rows(source, table)

    report = await asyncio.to_thread(
        verify_table, parse_source_url(source.url), cdc.service.config.store.data_dir,
        TableName(source.database, "orders"), 60.0, results[0].info.path)
    assert report.ok, report.lines()
    assert report.source_rows == len(image)


async def test_dump_rows_decode_to_the_stream_values_for_every_type(cdc: RunningService,
                                                                    source: Source):
    from tests.server.test_types import _fill

    _fill(source)  # every type at its edges, then an update and a delete
    await cdc.caught_up(source)
    results = await _dump(cdc, source, "types", chunk_rows=2)
    dumped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in read_dump(results[0].info.path):
        if isinstance(item, DumpRows):
            apply(dumped, ["id"], item)
    client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
    streamed: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in await asyncio.to_thread(
            lambda: list(client.stream(f"{source.database}.types", idle_timeout=1))):
        if isinstance(event, ChangeRecord):
            if event.event_type in ("insert", "update_after"):
                streamed[(event.values["id"],)] = event.values
            elif event.event_type == "delete":
                del streamed[(event.values["id"],)]
    assert len(streamed) == 5 and dumped.keys() == streamed.keys()
    for key, row in streamed.items():
        for column, value in row.items():
            assert dumped[key][column] == value, (key, column)
            assert type(dumped[key][column]) is type(value), (key, column)


async def test_string_and_composite_keys_are_chunked_in_collation_order(cdc: RunningService,
                                                                        source: Source):
    table = f"`{source.database}`.people"
    source.execute(f"CREATE TABLE {table} (region VARCHAR(20) CHARACTER SET utf8mb4 "
                   "COLLATE utf8mb4_general_ci, code VARBINARY(8), born DATE, n INT, "
                   "PRIMARY KEY (region, code, born))")
    regions = ["abc", "ABD", "Ärger", "zeta", "o'brien", "back\\slash", "日本", ""]
    values = [f"({source.query('SELECT QUOTE(%s)', (r,))[0][0]}, X'{c:04x}', "
              f"'20{d:02d}-01-01', {i})"
              for i, (r, c, d) in enumerate((r, c, d) for r in regions for c in (0, 255, 4096)
                                            for d in (1, 9))]
    source.execute(f"INSERT INTO {table} VALUES {', '.join(values)}")
    await cdc.caught_up(source)
    results = await _dump(cdc, source, "people", chunk_rows=5)
    dumped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in read_dump(results[0].info.path):
        assert not isinstance(item, DumpRows) or item.action == "insert"
        if isinstance(item, DumpRows):
            for row in item.rows:
                key = (row["region"], row["code"], row["born"])
                assert key not in dumped, f"{key} dumped twice"
                dumped[key] = row
    assert len(dumped) == len(values) == results[0].info.header.rows
    assert sorted(r["n"] for r in dumped.values()) == list(range(len(values)))


async def test_a_table_without_a_primary_key_is_dumped_whole_with_duplicates(
        cdc: RunningService, source: Source):
    table = f"`{source.database}`.log"
    source.execute(f"CREATE TABLE {table} (msg VARCHAR(20), n INT)",
                   f"INSERT INTO {table} VALUES ('a', 1), ('a', 1), ('b', NULL)")
    results = await _dump(cdc, source, "log", chunk_rows=1)
    operations = [i for i in read_dump(results[0].info.path) if isinstance(i, DumpRows)]
    rows = [r for op in operations for r in op.rows]
    assert results[0].info.header.rows == 3
    assert sorted((r["msg"], r["n"]) for r in rows) == [("a", 1), ("a", 1), ("b", None)]


async def test_an_interrupted_dump_resumes_consistent_at_its_new_snapshot(
        cdc: RunningService, source: Source):
    table = _orders(source, 6000)
    await cdc.caught_up(source)
    address = parse_source_url(source.url)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    stop = threading.Event()

    def progressed(_: TableName, rows: int) -> None:
        if rows >= 2000:
            stop.set()

    with pytest.raises(DumpInterrupted):  # the single-snapshot path (readers=0)
        await asyncio.to_thread(dump_tables, address, data_dir, [name],
                                DumpOptions(DumpConfig(chunk_rows=500, readers=0)), None,
                                progressed, stop)
    partial = os.path.join(files.dump_dir(data_dir), f"{dump_stem(name)}.partial")
    with open(partial, "ab") as f:
        f.write(b'{"action":"insert","rows":[["torn')  # what a crash mid-write leaves
    assert files.list_dumps(data_dir, name) == []
    # Changes while it was stopped: to rows already dumped, and to rows not yet dumped.
    source.execute(f"UPDATE {table} SET amount = 1.23, note = 'changed' WHERE id % 10 = 0",
                   f"DELETE FROM {table} WHERE id % 13 = 0",
                   f"UPDATE {table} SET id = id + 100000 WHERE id IN (5, 5999)",
                   f"INSERT INTO {table} (id, name) VALUES (-1, 'first'), (7001, 'late')")
    await cdc.caught_up(source)

    results = await asyncio.to_thread(dump_tables, address, data_dir, [name],
                                      DumpOptions(DumpConfig(chunk_rows=500, readers=0)))
    assert results[0].resumed
    header = results[0].info.header
    assert header.resumed and header.rows == len(_table_rows(source, table))
    image: dict[tuple[Any, ...], dict[str, Any]] = {}
    actions = set()
    for item in read_dump(results[0].info.path):
        if isinstance(item, DumpRows):
            actions.add(item.action)
            apply(image, ["id"], item)
    assert actions == {"insert", "update", "delete"}
    assert _loaded(image) == _table_rows(source, table)
    assert not os.path.exists(partial)


async def test_resume_starts_over_when_the_columns_changed(cdc: RunningService,
                                                           source: Source):
    table = _orders(source, 3000)
    address = parse_source_url(source.url)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    stop = threading.Event()
    with pytest.raises(DumpInterrupted):
        await asyncio.to_thread(dump_tables, address, data_dir, [name],
                                DumpOptions(DumpConfig(chunk_rows=500)), None,
                                lambda _t, rows: stop.set() if rows >= 1000 else None, stop)
    source.execute(f"ALTER TABLE {table} ADD COLUMN extra INT DEFAULT 5")
    results = await asyncio.to_thread(dump_tables, address, data_dir, [name],
                                      DumpOptions(DumpConfig(chunk_rows=500)))
    assert not results[0].resumed
    assert [f.column for f in results[0].info.header.columns][-1] == "extra"
    assert results[0].info.header.rows == 3000


async def test_a_killed_dump_process_resumes_from_its_last_chunk(cdc: RunningService,
                                                                 source: Source):
    _orders(source, 30000)
    await cdc.caught_up(source)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    progress = os.path.join(files.dump_dir(data_dir), f"{dump_stem(name)}.progress")
    command = [sys.executable, "-m", "cdcserver.app.cli", "dump", f"{source.database}.orders",
               "--source", source.url, "--data-dir", data_dir, "--readers", "0",
               "--chunk-rows", "100"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        await asyncio.to_thread(kill_when, process, progress,
                                lambda text: '"rows": 0,' not in text)
    finally:
        process.kill()
        process.wait(30)
    assert files.list_dumps(data_dir, name) == []
    source.execute(f"DELETE FROM `{source.database}`.orders WHERE id <= 50")
    await cdc.caught_up(source)
    # In a thread: the service shares this event loop and must keep replicating meanwhile.
    done = await asyncio.to_thread(subprocess.run, [*command[:-2], "--chunk-rows", "5000",
                                                    "--json"],
                                   capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"resumed": true' in done.stdout, done.stderr
    (dump,) = files.list_dumps(data_dir, name)
    image: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in read_dump(dump.path):
        if isinstance(item, DumpRows):
            apply(image, ["id"], item)
    assert len(image) == dump.header.rows == 30000 - 50
    assert min(image)[0] == 51


async def test_two_dumps_of_one_table_cannot_run_at_once(cdc: RunningService, source: Source):
    _orders(source, 10)
    data_dir = cdc.service.config.store.data_dir
    name = TableName(source.database, "orders")
    from cdcserver.dump.dumper import table_lock

    with table_lock(files.dump_dir(data_dir), name), pytest.raises(DumpBusy):
        await _dump(cdc, source, "orders")


async def test_database_patterns_and_unknown_tables(cdc: RunningService, source: Source):
    source.execute(f"CREATE TABLE `{source.database}`.a (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{source.database}`.b (id INT PRIMARY KEY)")
    address = parse_source_url(source.url)
    names = await asyncio.to_thread(resolve_tables, address, [f"{source.database}.*"])
    assert names == [TableName(source.database, "a"), TableName(source.database, "b")]
    from cdcserver.core.errors import SourceError

    with pytest.raises(SourceError, match="no table"):
        await _dump(cdc, source, "missing")


# -- serving ---------------------------------------------------------------------------------

async def test_list_and_request_dumps_over_the_wire(cdc: RunningService, source: Source):
    _orders(source, 300)
    results = await _dump(cdc, source, "orders")
    info = results[0].info
    with open(info.path, "rb") as f:
        content = f.read()
    client = await RawClient.connect(cdc.port)
    await client.login()
    await client.send(b"LIST-DUMPS\n")
    listed = (await client.json_line())["dumps"]
    assert [d["name"] for d in listed] == [info.name]
    assert listed[0]["rows"] == 300 and listed[0]["bytes"] == len(content)
    await client.send(f"LIST-DUMPS {source.database}.nothing\n".encode())
    assert (await client.json_line())["dumps"] == []
    for target in [f"{source.database}.orders", info.name] * 20:
        # The next command follows the last byte at once: it may reach the server as the
        # transfer ends, and must still be answered.
        await client.send(f"REQUEST-DUMP {target}\n".encode())
        assert await client.line() == f"OK {len(content)} {info.name}\n".encode()
        assert await client.read_exactly(len(content)) == content
    # errors leave the session usable
    await client.send(f"REQUEST-DUMP {source.database}.nothing\n".encode())
    assert (await client.line()).startswith(b"ERR NO-FILE no dump of")
    await client.send(b"REQUEST-DUMP a.b.c FOLLOW NOW\n")
    assert (await client.line()).startswith(b"ERR BAD-SYNTAX")
    await client.send(b"REQUEST-DUMP ../../etc/passwd\n")
    assert (await client.line()).startswith(b"ERR NO-FILE")
    # a command sent during a transfer is answered after it
    await client.send(f"REQUEST-DUMP {info.name}\nLIST-DUMPS\n".encode())
    assert (await client.line()).startswith(b"OK ")
    assert await client.read_exactly(len(content)) == content
    assert "dumps" in await client.json_line()
    await client.close()


async def test_request_data_after_a_gtid_state_is_exclusive_in_every_domain(
        cdc: RunningService, source: Source):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
    conn = source.server.connect()
    with conn.cursor() as cur:
        for domain, ids in ((0, (1, 2)), (7, (3, 4)), (0, (5,)), (7, (6,))):
            cur.execute(f"SET SESSION gtid_domain_id = {domain}")
            for i in ids:
                cur.execute(f"INSERT INTO {table} VALUES ({i})")
    conn.close()
    await cdc.caught_up(source)
    client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
    everything = [e for e in await asyncio.to_thread(lambda: list(client.stream(
        f"{source.database}.t", idle_timeout=2))) if isinstance(e, ChangeRecord)]
    by_id = {e.values["id"]: e for e in everything}
    after = f"{by_id[2].gtid},{by_id[3].gtid}"
    for fmt in ("JSON", "AVRO"):
        client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD, format=fmt)
        got = [e.values["id"] for e in await asyncio.to_thread(lambda c=client: list(c.stream(
            f"{source.database}.t", after=after, idle_timeout=2)))
            if isinstance(e, ChangeRecord)]
        assert got == [4, 5, 6], fmt
    raw = await RawClient.connect(cdc.port)
    await raw.login()
    await raw.send(f"REQUEST-DATA {source.database}.t AFTER 0-1\n".encode())
    assert (await raw.line()).startswith(b"ERR BAD-SYNTAX")
    await raw.close()


@pytest.mark.parametrize("fmt", ["JSON", "AVRO"])
async def test_follow_waits_for_a_table_that_had_no_changes_yet(cdc: RunningService,
                                                                source: Source, fmt: str):
    table = f"`{source.database}`.quiet"
    conn = source.server.connect()
    with conn.cursor() as cur:
        cur.execute("SET sql_log_bin = 0")  # a table the stream has never seen
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)")
        cur.execute(f"INSERT INTO {table} VALUES (1, 1), (2, 2)")
    conn.close()
    results = await _dump(cdc, source, "quiet")
    assert results[0].info.header.stream_version == 0
    events: list[Any] = []

    async def follow() -> None:
        async with CdcClient(cdc.host, cdc.port, USER, PASSWORD, format=fmt) as client:
            async for item in client.dump(f"{source.database}.quiet"):
                events.append(item)
                if isinstance(item, ChangeRecord):
                    return

    task = asyncio.create_task(follow())
    await asyncio.to_thread(wait_until, lambda: len(events) >= 2, 30, "the dump")
    source.execute(f"UPDATE {table} SET v = 20 WHERE id = 2")
    await asyncio.wait_for(task, 30)
    assert isinstance(events[1], DumpRows) and len(events[1].rows) == 2
    last = events[-1]
    assert isinstance(last, ChangeRecord) and last.values == {"id": 2, "v": 2}
    assert last.event_type == "update_before"


async def test_the_cdc_and_cdcserver_commands(cdc: RunningService, source: Source, tmp_path):
    table = _orders(source, 500)
    await cdc.caught_up(source)
    bin_dir = os.path.dirname(sys.executable)
    data_dir = cdc.service.config.store.data_dir

    async def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(subprocess.run, list(argv), capture_output=True,
                                       text=True, timeout=120)

    made = await run(f"{bin_dir}/cdcserver", "dump", f"{source.database}.*", "--source",
                     source.url, "--data-dir", data_dir)
    assert made.returncode == 0, made.stderr
    assert "500 rows" in made.stdout
    listed = await run(f"{bin_dir}/cdcserver", "dumps", "--data-dir", data_dir)
    assert listed.returncode == 0 and f"{source.database}.orders." in listed.stdout
    source.execute(f"UPDATE {table} SET name = 'after the dump' WHERE id = 7")
    await cdc.caught_up(source)

    saved = tmp_path / "orders.dump"
    connection = ["-h", cdc.host, "-P", str(cdc.port), "-u", USER, "-p", PASSWORD]
    fetched = await run(f"{bin_dir}/cdc", "dump", f"{source.database}.orders", "-o",
                        str(saved), "--follow", "-t", "1", *connection)
    assert fetched.returncode == 0, fetched.stderr
    assert "saved" in fetched.stderr and "500 rows" in fetched.stderr
    header = next(iter(read_dump(str(saved))))  # also checks the checksum, at the end
    assert isinstance(header, DumpHeader) and header.rows == 500
    lines = fetched.stdout.splitlines()
    assert lines[0].startswith('{"namespace":')  # the stream after the dump: its schema,
    assert "after the dump" in lines[-1]  # then only the change made after it
    assert len(lines) == 3
    dumps = await run(f"{bin_dir}/cdc", "dumps", f"{source.database}.orders", *connection)
    assert dumps.returncode == 0 and '"rows": 500' in dumps.stdout
    missing = await run(f"{bin_dir}/cdc", "dump", f"{source.database}.nothing", *connection)
    assert missing.returncode == 1 and "NO-FILE" in missing.stderr

    verified = await run(f"{bin_dir}/cdcserver", "verify", f"{source.database}.orders",
                         "--dump", "newest", "--json", "--source", source.url,
                         "--data-dir", data_dir)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert '"ok": true' in verified.stdout


async def test_a_schema_change_between_the_snapshot_and_the_read_means_a_new_snapshot(
        cdc: RunningService, source: Source, monkeypatch):
    """An instant ALTER committed just after the snapshot opened, before the dump opened the
    table: InnoDB hands the old read view the new layout without error, so the dump must
    notice and take a new snapshot, whose point includes the ALTER."""
    from cdcserver.core.gtid import GtidState
    from cdcserver.dump import snapshot as snapshot_module

    table = _orders(source, 100)
    original = snapshot_module.Snapshot._open_mariadb
    opened = []

    def open_then_alter(self: Any) -> Any:
        point = original(self)
        opened.append(point)
        if len(opened) == 1:
            source.execute(f"ALTER TABLE {table} ADD COLUMN late INT DEFAULT 1, "
                           "ALGORITHM=INSTANT")
        return point

    monkeypatch.setattr(snapshot_module.Snapshot, "_open_mariadb", open_then_alter)
    results = await _dump(cdc, source, "orders", readers=0)
    assert len(opened) == 2
    header = results[0].info.header
    assert [f.column for f in header.columns][-1] == "late"
    alter = next(iter(source.gtid_state()))
    assert GtidState.parse(header.gtid).covers(alter)
    assert not opened[0].gtid.covers(alter)


async def test_following_starts_in_the_version_the_table_was_in_at_the_dump(
        tmp_path, source: Source, users_file: str):
    """The dump is taken while the service lags behind a TRUNCATE: the dump has the rows
    after it, so the stream that follows must not announce that TRUNCATE (or anything
    before it) as something that happened after the dump."""
    from cdcserver.core.gtid import GtidState
    from tests.conftest import make_config, start_service

    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file)
    table = f"`{source.database}`.t"
    running = await start_service(config)
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {table} VALUES (1, 1), (2, 2)")
    await running.caught_up(source)
    await running.stop()
    source.execute(f"TRUNCATE TABLE {table}", f"INSERT INTO {table} VALUES (10, 10), (11, 11)")
    address = parse_source_url(source.url)
    (result,) = await asyncio.to_thread(dump_tables, address, config.store.data_dir,
                                        [TableName(source.database, "t")])
    header = result.info.header
    assert header.stream_version == 1  # all the stopped service knew: a lower bound
    source.execute(f"INSERT INTO {table} VALUES (12, 12)")
    running = await start_service(config)
    try:
        events: list[Any] = []
        client = SyncCdcClient(running.host, running.port, USER, PASSWORD)

        def follow() -> None:
            for item in client.dump(f"{source.database}.t"):
                events.append(item)
                if isinstance(item, ChangeRecord):
                    return

        await asyncio.to_thread(follow)
        schemas = [e for e in events if isinstance(e, SchemaChange)]
        assert [s.version for s in schemas] == [2]
        assert GtidState.parse(header.gtid).covers(next(iter(GtidState.parse(
            schemas[0].gtid))))  # the version's TRUNCATE precedes the dump
        rows = [r for e in events if isinstance(e, DumpRows) for r in e.rows]
        assert sorted(r["id"] for r in rows) == [10, 11]
        assert events[-1].values == {"id": 12, "v": 12}
        report = await asyncio.to_thread(verify_table, address, config.store.data_dir,
                                         TableName(source.database, "t"), 60.0,
                                         result.info.path)
        assert report.ok and report.source_rows == 3, report.lines()
    finally:
        await running.stop()


async def test_a_client_that_only_shuts_down_its_sending_side_gets_the_whole_dump(
        cdc: RunningService, source: Source):
    _orders(source, 2000)
    (result,) = await _dump(cdc, source, "orders")
    with open(result.info.path, "rb") as f:
        content = f.read()
    client = await RawClient.connect(cdc.port)
    await client.login()
    await client.send(f"REQUEST-DUMP {source.database}.orders\n".encode())
    client.writer.write_eof()  # as `nc -N` does after its input
    assert (await client.line()).startswith(b"OK ")
    assert await client.read_exactly(len(content)) == content
    assert await client.closed() == b""


class _Room:
    """A rawrows.Sink with little room (1 MiB): larger rows come as bytes."""

    def __init__(self) -> None:
        self.area = bytearray(1 << 20)
        self.used = 0
        self.data = bytearray()

    def space(self, need: int = 0) -> tuple[bytearray, int, int] | None:
        if len(self.area) - self.used < max(need, 1):
            self.used = 0
            if need > len(self.area):
                return None
        return self.area, self.used, len(self.area)

    def wrote(self, end: int) -> None:
        self.data += self.area[self.used:end]
        self.used = end

    def write(self, data: bytes) -> None:
        self.data += data


@pytest.mark.parametrize("path", ["compiled", "python", "into", "into-through-python"])
def test_the_row_reader_takes_empty_results_and_rows_larger_than_its_buffer(
        source: Source, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """rawrows reads result rows off the socket into its own buffer: an empty result ends
    at once (its end packet may already sit in pymysql's reader), rows larger than the
    buffer and a row over one 16 MiB packet come out whole, and the connection serves the
    next query. The oracle: base64 of the text values read by a pymysql cursor. ``into``:
    the rows encoded straight into a sink's room (receive and encode in one compiled call;
    ``into-through-python``: each receive through Python, as on a TLS connection)."""
    import base64
    import json

    from cdcserver.dump import rawrows
    from cdcserver.replication import source as source_sql

    if path == "python":
        monkeypatch.setattr(rawrows, "compiled", None)
    elif rawrows.compiled is None:
        pytest.skip("the compiled row path is not built")
    if path == "into-through-python":
        monkeypatch.setattr(rawrows, "socket", type("NoPlainSockets", (), {"socket": None}))
    table = f"`{source.database}`.big"
    source.execute("SET GLOBAL max_allowed_packet = 67108864")  # for the next sessions
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, body LONGBLOB, note VARCHAR(20))",
                   f"INSERT INTO {table} VALUES (1, 'a', NULL), (2, REPEAT('b', 3000000), 'x'), "
                   "(3, NULL, ''), (5, REPEAT('c', 1048570), 'y')",
                   f"INSERT INTO {table} VALUES (4, REPEAT('d', 17000000), 'long')",
                   f"INSERT INTO {table} SELECT seq + 10, REPEAT('e', seq % 300), seq FROM "
                   f"`{source.database}`.seq_1_to_3000")
    conn = source_sql.connect(parse_source_url(source.server.url()))

    def query_lines(sql: str, batch: int = 500) -> list[tuple[bytes, int, bytes]]:
        if not path.startswith("into"):
            return list(rawrows.query_lines(conn, sql, batch))
        room, pieces = _Room(), []
        for count, last in rawrows.query_into(conn, sql, batch, room):
            pieces.append((bytes(room.data), count, last))
            room.data.clear()
        assert not room.data
        return pieces

    try:
        assert query_lines(f"SELECT * FROM {table} WHERE id < 0") == []
        lines = query_lines(f"SELECT * FROM {table} ORDER BY id", 7)
        with conn.cursor() as cur:
            cur.execute(f"SELECT CAST(id AS CHAR), body, note FROM {table} ORDER BY id")
            expected = [[None if v is None else base64.b64encode(
                v if isinstance(v, bytes) else str(v).encode()).decode() for v in row]
                for row in cur.fetchall()]
        rows = [row for data, _, _ in lines for line in data.splitlines()
                for row in json.loads(line)["rows"]]
        assert rows == expected
        assert sum(count for _, count, _ in lines) == len(expected) == 3005
        assert all(json.loads(last) == rows[sum(c for _, c, _ in lines[:i + 1]) - 1]
                   for i, (_, _, last) in enumerate(lines))
        assert all(line.count(b"],[") < 7 for data, _, _ in lines for line in data.splitlines())
        assert source_sql.query(conn, "SELECT 1") == [(1,)]  # the connection goes on
    finally:
        conn.close()
        source.execute("SET GLOBAL max_allowed_packet = 16777216")


async def test_clients_that_reset_right_after_request_dump_are_no_server_fault(
        cdc: RunningService, source: Source, caplog: pytest.LogCaptureFixture):
    """A hundred clients each send the login, REGISTER and REQUEST-DUMP in one write and
    reset the connection (RST) at once, or a moment later: a hang-up is logged as one, never
    as an internal error with a traceback (uvloop, the service's loop, says RuntimeError
    there), and the next client gets the dump whole."""
    import logging
    import socket
    import struct

    from mariadb_cdc_client.format.wire import auth_message

    table = f"`{source.database}`.r"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT)",
                   *(f"INSERT INTO {table} SELECT seq, REPEAT('v', 900) FROM "
                     f"`{source.database}`.seq_{i}_to_{i + 999}" for i in range(1, 20000, 1000)))
    await cdc.caught_up(source)
    await _dump(cdc, source, "r")

    def reset_clients() -> None:
        for i in range(100):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                sock.connect(("127.0.0.1", cdc.port))
                sock.sendall(auth_message(USER, PASSWORD) + b"\nREGISTER UUID=rst, TYPE=JSON\n"
                             + f"REQUEST-DUMP {source.database}.r\n".encode())
                threading.Event().wait(0.002 * (i % 5))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    with caplog.at_level(logging.DEBUG, logger="cdcserver"):
        await asyncio.to_thread(reset_clients)
        await asyncio.sleep(1)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors][:3]
    path = os.path.join(str(cdc.service.config.store.data_dir), "fetched.dump")
    header = await asyncio.to_thread(SyncCdcClient("127.0.0.1", cdc.port, USER, PASSWORD)
                                     .fetch_dump, f"{source.database}.r", path)
    assert header.rows == 20000
