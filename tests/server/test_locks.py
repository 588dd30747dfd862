"""What a database user with rights on its own schema only can do to the service with locks
(issue 49, findings 2 and 4): its table's repair may wait for its lock, every other table
may not.

``LOCK TABLES lk WRITE; ALTER TABLE lk ADD COLUMN ... DEFAULT 5`` makes a repair (the ALTER
gives every row a value without row events), whose read waits for the table's metadata
lock; MariaDB's default ``lock_wait_timeout`` is a year, and the stream of every table
waited with it. The read now waits a few seconds at most; the table is then quarantined
alone, said in the log and in ``/health``, and resynced by itself once the lock is gone.
A table whose tablespace is then discarded cannot be read at all: it stays quarantined,
and named, while the rest streams and the service stays ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from cdcserver.core.names import TableName
from cdcserver.ops.metrics import health
from cdcserver.ops.probes import ready
from cdcserver.reread import beside
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, until
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb


@pytest.fixture(params=["in the pipeline", "beside the stream"])
def repair_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a whole-table repair reads: in the pipeline (small tables) and in a process
    of its own beside the stream (big ones: ``MIN_BYTES`` 0 makes every keyed table one)."""
    if request.param == "beside the stream":
        monkeypatch.setattr(beside, "MIN_BYTES", 0)
    return str(request.param)


@pytest.fixture
def schema_user(source: Source) -> Iterator[Any]:
    """A connection as a user with every right on the test's schema and none elsewhere."""
    source.execute("CREATE USER IF NOT EXISTS 'schemaonly'@'localhost' IDENTIFIED BY 'pw'",
                   f"GRANT ALL ON `{source.database}`.* TO 'schemaonly'@'localhost'")
    conn = pymysql.connect(unix_socket=source.server.socket, user="schemaonly", password="pw",
                           database=source.database, autocommit=True, ssl_disabled=True)
    try:
        yield conn
    finally:
        with contextlib.suppress(pymysql.err.MySQLError):
            conn.close()
        source.execute("DROP USER IF EXISTS 'schemaonly'@'localhost'")


def _rows(source: Source, table: str) -> list[tuple[Any, ...]]:
    return sorted(source.query(f"SELECT * FROM `{source.database}`.{table}"))


async def _streamed(cdc: RunningService, source: Source, table: str) -> bool:
    conn = source.server.connect()
    try:
        with contextlib.suppress(AssertionError, ConnectionError, TimeoutError):
            await assert_stream_equals_table(cdc.port, conn, source.database, table,
                                             user=USER, password=PASSWORD, quiet=0.3)
            return True
        return False
    finally:
        conn.close()


async def _until_streamed(cdc: RunningService, source: Source, table: str,
                          timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await _streamed(cdc, source, table):
        assert asyncio.get_running_loop().time() < deadline, f"{table} was not streamed"
        await asyncio.sleep(0.2)


async def _ready(cdc: RunningService) -> None:
    """Ready, the quarantined table notwithstanding: once the lag probe's next sample has
    come (the one read as the stream caught up may be from before: "catching-up")."""
    await until(lambda: ready(cdc.service.stats())[0], 30,
                "ready with a table quarantined")


async def test_a_locked_tables_repair_stops_no_other_table(cdc: RunningService, source: Source,
                                                           schema_user: Any, repair_path: str):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.lk (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE `{db}`.free (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.lk VALUES (1, 1), (2, 2)")
    await cdc.caught_up(source)
    with schema_user.cursor() as cur:
        cur.execute("LOCK TABLES lk WRITE")
        cur.execute("ALTER TABLE lk ADD COLUMN z INT NOT NULL DEFAULT 5")
    released = False
    try:
        # while the lock is held (until the other table is streamed, or the guard ends)
        source.execute(f"INSERT INTO `{db}`.free VALUES (1, 10), (2, 20)")
        await _until_streamed(cdc, source, "free", 120)
        table = TableName(db, "lk")
        await until(lambda: table in cdc.service.data.catalog.quarantined, 60,
                    "the locked table quarantined")
        cause = cdc.service.data.catalog.quarantined[table].cause
        assert "locked by another session" in cause, cause
        good, document = health(cdc.service.stats(), 60)
        assert not good and any(f"{db}.lk" in p for p in document["problems"]), document
        await _ready(cdc)
        with schema_user.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        released = True
        # resynced by itself once the lock is gone: the stream equals the table again (a
        # resync is released at the first transaction past its watermark: the source goes
        # on being written to)
        for n in range(3, 300):
            if table not in cdc.service.data.catalog.quarantined:
                break
            source.execute(f"INSERT INTO `{db}`.free VALUES ({n}, {n})")
            await asyncio.sleep(0.5)
        assert table not in cdc.service.data.catalog.quarantined, "not resynced"
        await _until_streamed(cdc, source, "lk", 60)
        assert [r[2] for r in _rows(source, "lk")] == [5, 5]
    finally:
        if not released:
            with schema_user.cursor() as cur:
                cur.execute("UNLOCK TABLES")


async def test_a_discarded_tablespace_is_quarantined_alone(cdc: RunningService,
                                                           source: Source,
                                                           schema_user: Any, repair_path: str):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.qt (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE `{db}`.free (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.qt VALUES (1, 1)")
    await cdc.caught_up(source)
    with schema_user.cursor() as cur:
        cur.execute("LOCK TABLES qt WRITE")
        cur.execute("ALTER TABLE qt ADD COLUMN z INT NOT NULL DEFAULT 5")
        cur.execute("ALTER TABLE qt DISCARD TABLESPACE")
        cur.execute("UNLOCK TABLES")
    source.execute(f"INSERT INTO `{db}`.free VALUES (1, 10)")
    await _until_streamed(cdc, source, "free", 120)
    table = TableName(db, "qt")
    await until(lambda: table in cdc.service.data.catalog.quarantined, 60, "qt quarantined")
    source.execute(f"INSERT INTO `{db}`.free VALUES (2, 20)")
    await _until_streamed(cdc, source, "free", 60)
    good, document = health(cdc.service.stats(), 60)
    assert not good and document["status"] == "degraded"
    assert [p for p in document["problems"] if f"{db}.qt" in p], document
    await _ready(cdc)
