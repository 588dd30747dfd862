"""The source's host fails under the service (issue 55, item 3): MariaDB killed with -9 while
it logs a transaction of a million rows, while it runs a DDL and while a chunked dump reads
it, then started again; its clock stepped back an hour; its binlog rotated and purged while
the service was away. Each test has a MariaDB server of its own (killing the shared one would
fail the tests beside it), and checks with tests/oracle.py, which shares no code with the
service, that the table rebuilt from the stream equals ``SELECT`` and that no change came
twice."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator

import pymysql
import pytest

from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.store.naming import dump_stem
from mariadb_cdc_client.dump import DumpRows, apply, read_dump
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, kill_when, wait_until
from tests.oracle import assert_each_change_once
from tests.server.test_dump import _loaded, _orders, _table_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DB = "src"


@pytest.fixture
def own_source(tmp_path) -> Iterator[Source]:
    server = EmbeddedMariaDB(str(tmp_path / "mariadb"), port=0, die_with_parent=True)
    server.start()
    try:
        server.execute(f"CREATE DATABASE {DB}")
        yield Source(server, DB)
    finally:
        server.stop()


async def _assert_whole(running: RunningService, source: Source, table: str, *,
                        replicating: bool = False) -> None:
    """The table's stream is the table, each change once (and, ``replicating``, replication
    neither stopped nor paused)."""
    conn = source.server.connect()
    try:
        await assert_each_change_once(running.port, conn, DB, table, user=USER,
                                      password=PASSWORD)
    finally:
        conn.close()
    if replicating:
        stats = running.service.replication.runner.stats()
        assert not stats.stopped and not stats.paused


def _binlog_path(server: EmbeddedMariaDB) -> str:
    name = server.query("SHOW MASTER STATUS")[0][0]
    return os.path.join(server.datadir, str(name))


class Background:
    """``statement`` run in a thread, which the server's death may cut short (and nothing
    else may fail)."""

    LOST = (2006, 2013)  # gone away, lost during the query

    def __init__(self, server: EmbeddedMariaDB, statement: str) -> None:
        self.error: pymysql.err.MySQLError | None = None
        self._thread = threading.Thread(target=self._run, args=(server, statement),
                                        daemon=True)
        self._thread.start()

    def _run(self, server: EmbeddedMariaDB, statement: str) -> None:
        try:
            server.execute(statement)
        except pymysql.err.MySQLError as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(60)
        assert self.error is None or self.error.args[0] in self.LOST, self.error


def _kill_once_the_binlog_grew(server: EmbeddedMariaDB, path: str, grown: int,
                               timeout: float = 180.0) -> int:
    """kill -9 the server once its binlog grew ``grown`` bytes (a commit being logged); the
    bytes it had grown."""
    start = os.path.getsize(path)
    deadline = time.monotonic() + timeout
    while os.path.getsize(path) - start < grown:
        assert time.monotonic() < deadline, "the binlog never grew"
        time.sleep(0.002)
    server.kill()
    return os.path.getsize(path) - start


async def test_the_source_killed_while_it_logs_a_million_row_transaction(
        own_source: Source, tmp_path, users_file: str):
    source = own_source
    source.execute(f"CREATE TABLE {DB}.big (id INT PRIMARY KEY, v INT, pad CHAR(20))",
                   f"INSERT INTO {DB}.big VALUES (0, 0, 'before')")
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file))
    try:
        await running.caught_up(source)
        path = _binlog_path(source.server)
        writer = Background(source.server, f"INSERT INTO {DB}.big SELECT seq, seq, 'x' "
                                               f"FROM {DB}.seq_1_to_1000000")
        grown = await asyncio.to_thread(_kill_once_the_binlog_grew, source.server, path,
                                        4 << 20)
        writer.join()
        await asyncio.to_thread(source.server.start)
        survived = source.server.query(f"SELECT COUNT(*) FROM {DB}.big")[0][0]
        print(f"killed with {grown:,} bytes of the transaction logged; {survived} rows after "
              f"the restart")
        source.execute(f"INSERT INTO {DB}.big VALUES (2000001, 1, 'after')",
                       f"UPDATE {DB}.big SET v = v + 1 WHERE id = 0")
        await running.caught_up(source, timeout=180)
        await _assert_whole(running, source, "big")
    finally:
        await running.stop()


async def test_the_source_killed_during_a_ddl(own_source: Source, tmp_path, users_file: str):
    source = own_source
    source.execute(f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {DB}.t SELECT seq, seq FROM {DB}.seq_1_to_300000")
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file))
    try:
        await running.caught_up(source, timeout=120)
        ddl = Background(source.server, f"ALTER TABLE {DB}.t ADD COLUMN w INT DEFAULT 7, "
                                             f"ALGORITHM=COPY")
        await asyncio.sleep(0.5)  # the copy under way
        await asyncio.to_thread(source.server.kill)
        ddl.join()
        await asyncio.to_thread(source.server.start)
        columns = [r[0] for r in source.server.query(
            f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{DB}' "
            f"AND TABLE_NAME = 't' ORDER BY ORDINAL_POSITION")]
        print(f"after the kill: columns {columns}")
        source.execute(f"UPDATE {DB}.t SET v = -v WHERE id <= 10",
                       f"ALTER TABLE {DB}.t ADD COLUMN IF NOT EXISTS w INT DEFAULT 7",
                       f"UPDATE {DB}.t SET w = 8 WHERE id BETWEEN 5 AND 15",
                       f"DELETE FROM {DB}.t WHERE id > 299990")
        await running.caught_up(source, timeout=120)
        await _assert_whole(running, source, "t")
    finally:
        await running.stop()


async def test_the_sources_clock_stepped_back_an_hour(own_source: Source, tmp_path,
                                                      users_file: str):
    # A session's timestamp stands for the server's clock: the binlog's events carry it.
    source = own_source
    source.execute(f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, at DATETIME)")
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file))
    try:
        source.execute(f"INSERT INTO {DB}.c VALUES (1, NOW())")
        await running.caught_up(source)
        source.execute("SET @@timestamp = UNIX_TIMESTAMP() - 3600",
                       f"INSERT INTO {DB}.c VALUES (2, NOW())",
                       f"UPDATE {DB}.c SET at = NOW() WHERE id = 1")
        source.execute(f"INSERT INTO {DB}.c VALUES (3, NOW())")
        await running.caught_up(source)
        await _assert_whole(running, source, "c", replicating=True)
    finally:
        await running.stop()


async def test_the_binlog_rotated_and_purged_while_the_service_was_away(
        own_source: Source, tmp_path, users_file: str):
    """The binlog the service had read is rotated away and purged while it is stopped: it
    resumes from the files left, by GTID. (Purged past its position, it stops replication
    saying so: tests/server/test_resync.py.)"""
    source = own_source
    source.execute(f"CREATE TABLE {DB}.r (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {DB}.r VALUES (1, 1), (2, 2)")
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    await running.caught_up(source)
    await running.stop()
    read_to = str(source.server.query("SHOW MASTER STATUS")[0][0])
    for n in range(3, 9):  # a change in each new file, then the next file
        source.execute("FLUSH BINARY LOGS", f"INSERT INTO {DB}.r VALUES ({n}, {n})",
                       f"UPDATE {DB}.r SET v = -v WHERE id = {n - 2}")
    files = [str(r[0]) for r in source.server.query("SHOW BINARY LOGS")]
    following = files[files.index(read_to) + 1]

    def purged() -> bool:  # MariaDB keeps a binlog until InnoDB has its transactions durable
        source.execute(f"PURGE BINARY LOGS TO '{following}'")
        return read_to not in [str(r[0]) for r in source.server.query("SHOW BINARY LOGS")]

    wait_until(purged, 30, f"{read_to} purged")

    running = await start_service(config)
    try:
        await running.caught_up(source, timeout=60)
        source.execute(f"DELETE FROM {DB}.r WHERE id = 1")
        await running.caught_up(source)
        await _assert_whole(running, source, "r", replicating=True)
    finally:
        await running.stop()


async def test_the_source_killed_while_a_chunked_dump_reads_it(own_source: Source, tmp_path,
                                                              users_file: str):
    source = own_source
    table = _orders(source, 30000)
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file))
    try:
        await running.caught_up(source, timeout=120)
        data_dir = running.service.config.store.data_dir
        name = TableName(DB, "orders")
        record = os.path.join(files.dump_dir(data_dir), f"{dump_stem(name)}.chunked")
        options = DumpOptions(DumpConfig(chunk_rows=200, readers=2, sync_interval=0))
        address = parse_source_url(source.url)
        first = asyncio.ensure_future(asyncio.to_thread(dump_tables, address, data_dir,
                                                        [name], options))
        assert source.server.process is not None
        await asyncio.to_thread(kill_when, source.server.process, record, lambda text: sum(
            len(r["chunks"]) for r in json.loads(text)["ranges"]) >= 6)
        await asyncio.to_thread(source.server.kill)
        await asyncio.sleep(2)  # the dump finds the source gone, and waits for it
        assert not first.done(), "the dump gave up on a source that was only restarting"
        await asyncio.to_thread(source.server.start)
        source.execute(f"DELETE FROM {table} WHERE id <= 50 OR id BETWEEN 20001 AND 20050",
                       f"UPDATE {table} SET note = 'changed' WHERE id % 97 = 0",
                       f"INSERT INTO {table} (id, name) VALUES (-5, 'first'), (40000, 'last')")
        (result,) = await asyncio.wait_for(first, 180)
        assert result.resumed, "the dump started over instead of continuing"
        await running.caught_up(source, timeout=120)
        (dump,) = files.list_dumps(data_dir, name)
        image: dict[tuple[object, ...], dict[str, object]] = {}
        for item in read_dump(dump.path):
            if isinstance(item, DumpRows):
                apply(image, ["id"], item)
        assert _loaded(image) == _table_rows(source, table)
        await _assert_whole(running, source, "orders")
    finally:
        await running.stop()
