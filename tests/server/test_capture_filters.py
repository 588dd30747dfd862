"""``[capture] include`` and ``exclude`` against a real MariaDB: a table left out never reaches
the store, a dump, a client or a log line, even through a cascade a repair reads; the tables
selected stream exactly (the independent oracle: the table rebuilt from its raw JSON stream
against ``SELECT``); a restart with new filters stops an excluded table; ``cdcserver check``
shows what the filters select on the source."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import fastavro
import pytest

from cdcserver.app.cli import main as cdcserver_main
from cdcserver.core.config import Config, parse_source_url
from cdcserver.core.errors import SourceError
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import dump_tables
from cdcserver.dump.files import list_dumps
from cdcserver.store.layout import DataDir
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client.format.dump import DumpRows
from tests.conftest import Source, make_config, start_service
from tests.helpers import PASSWORD, USER, files_holding, reply_to, until
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb

SECRET = "s3cr3t-value-7731"  # written only to tables left out: it must be found nowhere


async def test_tables_left_out_reach_nothing_and_the_selected_stream_exactly(
        tmp_path, source: Source, users_file: str, capfd: pytest.CaptureFixture[str]):
    db = source.database
    config = make_config(str(tmp_path / "data"), source.url, users_file, capture={
        "include": f"`{db}`.kept*, `{db}`.parent", "exclude": f"`{db}`.kept_secret"})
    source.execute(
        f"CREATE TABLE `{db}`.kept_a (id INT PRIMARY KEY, v VARCHAR(40))",
        f"CREATE TABLE `{db}`.kept_secret (id INT PRIMARY KEY, v VARCHAR(40))",
        f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v VARCHAR(40))",
        f"CREATE TABLE `{db}`.parent (id INT PRIMARY KEY)",
        f"CREATE TABLE `{db}`.child (id INT PRIMARY KEY, pid INT, v VARCHAR(40), KEY (pid), "
        f"FOREIGN KEY (pid) REFERENCES `{db}`.parent (id) ON DELETE CASCADE)")
    running = await start_service(config)
    try:
        source.execute(
            f"INSERT INTO `{db}`.kept_a VALUES (1, 'a'), (2, 'b')",
            f"INSERT INTO `{db}`.kept_secret VALUES (1, '{SECRET}')",
            f"INSERT INTO `{db}`.other VALUES (1, '{SECRET}')",
            f"INSERT INTO `{db}`.parent VALUES (1), (2)",
            f"INSERT INTO `{db}`.child VALUES (1, 1, '{SECRET}'), (2, 2, '{SECRET}')",
            f"UPDATE `{db}`.kept_a SET v = 'c' WHERE id = 2",
            f"UPDATE `{db}`.other SET v = '{SECRET}!' WHERE id = 1",
            f"DELETE FROM `{db}`.parent WHERE id = 1")  # cascades into the excluded child
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            for table in ("kept_a", "parent"):
                await assert_stream_equals_table(running.port, conn, db, table, user=USER,
                                                 password=PASSWORD, quiet=0.5)
        finally:
            conn.close()
        stored = {t.table for t in running.service.data.catalog.tables if t.database == db}
        assert stored == {"kept_a", "parent"}
        for table in ("kept_secret", "other", "child"):
            reply = await reply_to(running.port, f"REQUEST-DATA `{db}`.{table}")
            assert reply.startswith(b"ERR FORBIDDEN") and b"not captured: [capture]" in reply
            reply = await reply_to(running.port, f"START-DUMP `{db}`.{table}")
            assert reply.startswith(b"ERR FORBIDDEN"), reply
        with pytest.raises(SourceError, match="exclude leaves it out"):
            dump_tables(parse_source_url(source.url), config.store.data_dir,
                        [TableName(db, "kept_secret")], capture=running.service.replication.capture)
        assert cdcserver_main(["dump", f"`{db}`.kept_secret", "--source", source.url,
                               "--data-dir", config.store.data_dir, "--exclude",
                               f"`{db}`.kept_secret"]) == 1
        reply = await reply_to(running.port, f"START-DUMP `{db}`.*")  # the selected ones only
        assert b'"started":[' in reply and b"kept_secret" not in reply and b"other" not in reply
    finally:
        await running.stop()
    assert files_holding(config.store.data_dir, SECRET.encode()) == []
    assert SECRET not in capfd.readouterr().err  # nor in a log line


async def test_a_restart_with_a_table_newly_excluded_stops_its_stream(
        tmp_path, source: Source, users_file: str):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE `{db}`.b (id INT PRIMARY KEY, v INT)")
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    source.execute(f"INSERT INTO `{db}`.a VALUES (1, 1)", f"INSERT INTO `{db}`.b VALUES (1, 1)")
    await running.caught_up(source)
    await running.stop()
    narrowed = make_config(config.store.data_dir, source.url, users_file,
                           source={"server_id": config.source.server_id},
                           capture={"exclude": f"`{db}`.b"})
    running = await start_service(narrowed)
    try:
        source.execute(f"INSERT INTO `{db}`.a VALUES (2, 2)",
                       f"INSERT INTO `{db}`.b VALUES (2, 2)")
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            await assert_stream_equals_table(running.port, conn, db, "a", user=USER,
                                             password=PASSWORD, quiet=0.5)
        finally:
            conn.close()
        reply = await reply_to(running.port, f"REQUEST-DATA `{db}`.b")
        assert reply.startswith(b"ERR FORBIDDEN") and b"exclude leaves it out" in reply
        b = running.service.data.catalog.get(TableName(db, "b"))
        assert b is not None  # what was stored stays (retention ages it out), and no more
        ids = []
        for info in b.versions.values():
            with open(info.path, "rb") as f:
                ids += [r["id"] for r in fastavro.reader(f)]
        assert ids == [1]
    finally:
        await running.stop()


def test_check_shows_what_the_filters_select(source: Source,
                                             capsys: pytest.CaptureFixture[str]):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.kept_1 (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{db}`.dropped_1 (id INT PRIMARY KEY)")
    assert cdcserver_main(["check", "--source", source.url, "--include", f"`{db}`.*",
                           "--exclude", f"`{db}`.dropped_*"]) in (0, 1)
    out = capsys.readouterr().out
    assert f"{db}.kept_1" in out
    assert f"left out, [capture] exclude leaves it out (`{db}`.dropped_*): {db}.dropped_1" \
        in out


async def test_a_table_a_restart_newly_includes_gets_a_dump_its_stream_follows(
        tmp_path, source: Source, users_file: str):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE `{db}`.b (id INT PRIMARY KEY, v INT)")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         capture={"include": f"`{db}`.a"})
    running = await start_service(config)
    source.execute(f"INSERT INTO `{db}`.a VALUES (1, 1)",
                   f"INSERT INTO `{db}`.b VALUES (1, 10), (2, 20)")
    await running.caught_up(source)
    await running.stop()
    assert list_dumps(config.store.data_dir) == []
    widened = make_config(config.store.data_dir, source.url, users_file,
                          source={"server_id": config.source.server_id},
                          capture={"include": f"`{db}`.a, `{db}`.b"})
    running = await start_service(widened)
    try:
        source.execute(f"UPDATE `{db}`.b SET v = 21 WHERE id = 2",
                       f"INSERT INTO `{db}`.b VALUES (3, 30)")
        await until(lambda: list_dumps(config.store.data_dir, TableName(db, "b")), timeout=60)
        await running.caught_up(source)
        rows: dict[int, int] = {}
        with SyncCdcClient("127.0.0.1", running.port, USER, PASSWORD) as client:
            events = await asyncio.to_thread(lambda: list(client.dump(
                f"`{db}`.b", idle_timeout=1.5)))
        for event in events:
            if isinstance(event, DumpRows):
                assert event.action == "insert"
                rows.update({r["id"]: r["v"] for r in event.rows})
            elif isinstance(event, ChangeRecord):
                if event.event_type in ("delete", "update_before"):
                    rows.pop(event.values["id"], None)
                else:
                    rows[event.values["id"]] = event.values["v"]
        assert rows == {1: 10, 2: 21, 3: 30}
        # the record of dumps owed is settled by its own loop after the dump lands
        record = DataDir(config.store.data_dir).capture
        await until(lambda: _owed(record) == [], timeout=30)
    finally:
        await running.stop()


def _owed(record: str) -> list[object]:
    with open(record, encoding="utf-8") as f:
        return list(json.load(f)["owed"])


def _owing_table_c(tmp_path: Any, source: Source, users_file: str) -> tuple[Config, str]:
    """Table ``c`` on the source, a configuration that includes it, and a capture record
    that owes it a dump; the configuration and the record's path."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.c (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.c VALUES (1, 1), (2, 2)")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         capture={"include": f"`{db}`.c"})
    record = DataDir(config.store.data_dir).capture
    os.makedirs(os.path.dirname(record), exist_ok=True)
    with open(record, "w", encoding="utf-8") as f:
        json.dump({"include": f"`{db}`.c", "exclude": "", "system_tables": "",
                   "owed": [[db, "c", 0.0]]}, f)
    return config, record


async def test_a_dump_owed_by_an_earlier_start_is_taken_at_the_next(
        tmp_path, source: Source, users_file: str):
    """A start killed before the dump of a newly included table was taken left it owed in
    state/capture.json: the next start, with the same filters, takes it and clears it."""
    db = source.database
    config, record = _owing_table_c(tmp_path, source, users_file)  # as a killed start left it
    running = await start_service(config)
    try:
        await until(lambda: list_dumps(config.store.data_dir, TableName(db, "c")), timeout=60)
        await until(lambda: _owed(record) == [], timeout=30)
    finally:
        await running.stop()


async def test_a_record_of_dumps_owed_that_the_disk_refuses_is_written_once_it_takes_it(
        tmp_path, source: Source, users_file: str, caplog: pytest.LogCaptureFixture):
    """Once an owed dump is taken, the record is written without it. A refused write (a full
    disk) ended the loop that keeps the record, saying nothing, and the table stayed owed
    until the next start (found in review). Now it says so and writes the record once the
    disk takes it. (The refusal is real: the record's temporary file's name is taken by a
    directory, which the write cannot replace.)"""
    db = source.database
    config, record = _owing_table_c(tmp_path, source, users_file)
    written = os.stat(record).st_mtime_ns
    running = await start_service(config)
    try:
        # the start's own write of the record, then every later one refused
        await until(lambda: os.stat(record).st_mtime_ns != written, timeout=60)
        os.mkdir(record + ".tmp")
        await until(lambda: list_dumps(config.store.data_dir, TableName(db, "c")), timeout=60)
        await until(lambda: "cannot record which newly included tables" in caplog.text,
                    timeout=30)
        assert _owed(record) == [[db, "c", 0.0]]
        os.rmdir(record + ".tmp")
        await until(lambda: _owed(record) == [], timeout=90)
    finally:
        await running.stop()
