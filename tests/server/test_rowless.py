"""Changes the binlog carries no rows for reach the stream: foreign-key cascades, partition
maintenance, value-rewriting ALTERs. Each table is rebuilt from its JSON stream by the oracle
(``tests/oracle.py``) and compared with SELECT, after the changes and after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER
from tests.oracle import Rebuilt, assert_stream_equals_table

pytestmark = pytest.mark.mariadb


def _run(source: Source, *statements: str, session: tuple[str, ...] = ()) -> None:
    conn = source.server.connect(source.database)
    try:
        with conn.cursor() as cur:
            for statement in (*session, *statements):
                cur.execute(statement)
    finally:
        conn.close()


async def _equal(cdc: RunningService, source: Source, table: str, **kwargs: Any) -> Rebuilt:
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        return await assert_stream_equals_table(cdc.port, conn, source.database, table,
                                                user=USER, password=PASSWORD, **kwargs)
    finally:
        conn.close()


def _repairs(rebuilt: Rebuilt) -> list[dict[str, Any]]:
    return [r for r in rebuilt.records if "cdc:repair" in r]


async def _verified(cdc: RunningService, source: Source, table: str) -> None:
    report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                     cdc.service.config.store.data_dir,
                                     TableName(source.database, table))
    assert report.ok, "\n".join(report.lines())


FK_TABLES = (
    "CREATE TABLE p (id INT PRIMARY KEY, name VARCHAR(20))",
    "CREATE TABLE c (id INT PRIMARY KEY, pid INT, v VARCHAR(20), KEY (pid),"
    " FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE c2 (id INT PRIMARY KEY, pid INT,"
    " CONSTRAINT to_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE SET NULL ON UPDATE SET NULL)",
    "CREATE TABLE g (id INT PRIMARY KEY, cid INT,"
    " FOREIGN KEY (cid) REFERENCES c (id) ON DELETE CASCADE)",
    "CREATE TABLE tree (id INT PRIMARY KEY, up INT,"
    " FOREIGN KEY (up) REFERENCES tree (id) ON DELETE CASCADE)",
    "CREATE TABLE pc (a INT, b VARCHAR(10), PRIMARY KEY (a, b))",
    "CREATE TABLE cc (id INT PRIMARY KEY, a INT, b VARCHAR(10),"
    " FOREIGN KEY (a, b) REFERENCES pc (a, b) ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE ps (code VARCHAR(10) PRIMARY KEY) COLLATE utf8mb4_general_ci",
    "CREATE TABLE cs (id INT PRIMARY KEY, code VARCHAR(10) COLLATE utf8mb4_general_ci,"
    " FOREIGN KEY (code) REFERENCES ps (code) ON UPDATE CASCADE ON DELETE CASCADE)",
    "CREATE TABLE nk (pid INT, v INT,"
    " FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
)
FK_ROWS = (
    "INSERT INTO p VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e'), (6, 'f')",
    "INSERT INTO c VALUES (10, 1, 'x'), (11, 1, 'y'), (12, 2, 'z'), (13, 3, 'w'),"
    " (14, 4, 'v'), (15, NULL, 'orphan'), (16, 6, 'u')",
    "INSERT INTO c2 VALUES (20, 1), (21, 2), (22, 3), (23, 5)",
    "INSERT INTO g VALUES (30, 10), (31, 11), (32, 12), (33, 14)",
    "INSERT INTO tree VALUES (1, NULL), (2, 1), (3, 2), (4, 2), (5, NULL), (6, 5)",
    "INSERT INTO pc VALUES (1, 'x'), (2, 'y')",
    "INSERT INTO cc VALUES (1, 1, 'x'), (2, 2, 'y'), (3, 1, 'x')",
    "INSERT INTO ps VALUES ('abc'), ('def')",
    "INSERT INTO cs VALUES (1, 'ABC'), (2, 'abc '), (3, 'def')",
    "INSERT INTO nk VALUES (1, 1), (1, 1), (2, 2), (3, 3)",
)


async def test_foreign_key_cascades_reach_the_stream(cdc: RunningService, source: Source):
    _run(source, *FK_TABLES, *FK_ROWS)
    await cdc.caught_up(source)
    _run(source,
         "DELETE FROM p WHERE id = 1",  # c 10, 11 and their g 30, 31; c2 20 set null; nk
         "UPDATE p SET id = 22 WHERE id = 2",  # c 12 -> 22, c2 21 set null
         "REPLACE INTO p VALUES (3, 'c again')",  # deletes and re-inserts: c 13 and g go
         "DELETE FROM tree WHERE id = 1",  # 2, 3, 4 down the tree
         "UPDATE pc SET b = 'z' WHERE a = 1",  # cc 1, 3 follow
         "UPDATE ps SET code = 'xyz' WHERE code = 'abc'",  # cs 1, 2 ('ABC', 'abc ') follow
         "DELETE FROM ps WHERE code = 'def'")
    # Several statements in one transaction, the child written after the cascade in it.
    _run(source, "BEGIN", "DELETE FROM p WHERE id = 4", "INSERT INTO c VALUES (40, 5, 'new')",
         "UPDATE c SET v = 'after' WHERE id = 16", "DELETE FROM p WHERE id = 6", "COMMIT")
    # With foreign_key_checks=0 InnoDB runs no cascade: the child keeps its rows.
    _run(source, "DELETE FROM p WHERE id = 5", session=("SET SESSION foreign_key_checks = 0",))
    for table in ("p", "c", "c2", "g", "tree", "pc", "cc", "ps", "cs", "nk"):
        await _equal(cdc, source, table)
    rebuilt = await _equal(cdc, source, "g")
    notes = _repairs(rebuilt)
    child = f"{source.database}.c"  # g's rows went by c's cascade, which p's started
    assert notes and all(n["cdc:repair"]["reason"].startswith("ON DELETE CASCADE of ")
                         and child in n["cdc:repair"]["reason"] for n in notes), notes
    assert {r["event_type"] for r in _repairs(await _equal(cdc, source, "c2"))} == {
        "update_before", "update_after"}
    stats = cdc.service.replication.runner.repair_stats
    assert stats.rowless["foreign key"] >= 8 and stats.repairs >= 6
    for table in ("c", "g", "tree", "cs"):
        await _verified(cdc, source, table)


async def test_statements_that_rewrite_rows_reach_the_stream(cdc: RunningService,
                                                             source: Source):
    _run(source,
         "CREATE TABLE pt (id INT PRIMARY KEY, v INT) PARTITION BY RANGE (id) ("
         " PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (20),"
         " PARTITION p2 VALUES LESS THAN (30), PARTITION p3 VALUES LESS THAN MAXVALUE)",
         "INSERT INTO pt VALUES (1, 1), (2, 2), (11, 11), (12, 12), (21, 21), (31, 31)",
         "CREATE TABLE ex (id INT PRIMARY KEY, v INT)",
         "INSERT INTO ex VALUES (15, 150), (16, 160)",
         "CREATE TABLE n (id INT PRIMARY KEY, s VARCHAR(10), i INT, d DECIMAL(8,3),"
         " t DATETIME(6), e VARCHAR(10)) CHARSET latin1",
         "INSERT INTO n VALUES (1, 'abcdefgh', 1000, 1.25, '2024-01-01 10:00:00.5', 'é'),"
         " (2, 'ab', 5, 2.5, '2024-01-01 10:00:00', 'plain')")
    await cdc.caught_up(source)
    _run(source, "ALTER TABLE pt TRUNCATE PARTITION p0",
         "ALTER TABLE pt EXCHANGE PARTITION p1 WITH TABLE ex",
         "ALTER TABLE pt DROP PARTITION p2",
         "INSERT INTO pt VALUES (3, 3)",
         "ALTER TABLE n MODIFY s VARCHAR(3), MODIFY i TINYINT, MODIFY d DECIMAL(8,1),"
         " MODIFY t DATETIME",
         "UPDATE n SET i = 7 WHERE id = 2",
         "ALTER TABLE n CONVERT TO CHARACTER SET ascii",
         session=("SET SESSION sql_mode = ''",))
    for table in ("pt", "ex", "n"):
        rebuilt = await _equal(cdc, source, table)
        assert _repairs(rebuilt), f"{table}: no repair records"
        assert any(s.get("ddl", {}).get("rewrites") for s in rebuilt.schemas), \
            f"{table}: no version says its statement rewrote rows"
        await _verified(cdc, source, table)


@pytest.fixture
def lagging(tmp_path: os.PathLike[str], source: Source, users_file: str
            ) -> Iterator[tuple[Source, Any]]:
    yield source, make_config(os.path.join(tmp_path, "data"), source.url, users_file)


async def test_a_repair_waits_for_its_watermark_and_keeps_later_changes(
        lagging: tuple[Source, Any]):
    """The service replays a cascade long after it happened: the rows are read where the
    source is now, the repair is attached there, and what the stream changed in between
    stays the stream's."""
    source, config = lagging
    _run(source, *FK_TABLES[:2], *FK_ROWS[:2])
    running = await start_service(config)
    await running.caught_up(source)
    await running.stop()
    _run(source, "DELETE FROM p WHERE id = 1",
         "INSERT INTO p VALUES (1, 'back')", "INSERT INTO c VALUES (10, 1, 'again')",
         *(f"UPDATE c SET v = 'n{i}' WHERE id = 12" for i in range(20)),
         "DELETE FROM p WHERE id = 3")
    running = await start_service(config)
    try:
        for table in ("p", "c"):
            await _equal(running, source, table)
        assert running.service.replication.runner.repair_stats.repairs >= 1
        assert not running.service.replication.runner.pipeline.repair_pending  # type: ignore[union-attr]
    finally:
        await running.stop()
    running = await start_service(config)  # and nothing is repaired twice after a restart
    try:
        rebuilt = await _equal(running, source, "c")
        reasons = [json.dumps(r["cdc:repair"]) for r in _repairs(rebuilt)]
        assert len(reasons) == len({(r["event_type"], r["id"], r["sequence"], r["event_number"])
                                    for r in _repairs(rebuilt)})
    finally:
        await running.stop()
