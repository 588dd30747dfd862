"""System-versioned tables and sequences, replicated and rebuilt from the stream.

A system-versioned table's stream is every row the table has ever had: ``SELECT *,
ROW_START, ROW_END FROM t FOR SYSTEM_TIME ALL``, keyed by the primary key and the row end
(MariaDB logs an UPDATE as the update of the current row plus the insert of its history row,
a DELETE as the update of the row end). A sequence is its one row, updated by each write.
Each table is rebuilt from its JSON stream by the oracle (``tests/oracle.py``) and compared
with the source.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER
from tests.oracle import Rebuilt, assert_stream_equals_table
from tests.server.test_rowless import _repairs, _run, _verified

pytestmark = pytest.mark.mariadb

IMPLICIT = {"row_start": "timestamp", "row_end": "timestamp"}
KEEP = ("SET SESSION system_versioning_alter_history = KEEP",)


async def _all_time(cdc: RunningService, source: Source, table: str, *,
                    key: tuple[str, ...], implicit: bool = True) -> Rebuilt:
    """The stream of ``table`` equals every row it has had (FOR SYSTEM_TIME ALL), and every
    before-image in it is the row a consumer keyed like each version's schema holds."""
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        rebuilt = await assert_stream_equals_table(
            cdc.port, conn, source.database, table, user=USER, password=PASSWORD, key=key,
            extra_columns=IMPLICIT if implicit else None,
            from_clause=f"`{source.database}`.`{table}` FOR SYSTEM_TIME ALL")
    finally:
        conn.close()
    assert not rebuilt.inconsistencies, f"{table}: {rebuilt.examples}"
    return rebuilt


async def _equal(cdc: RunningService, source: Source, table: str, **kwargs: Any) -> Rebuilt:
    """The stream equals the table, and every before-image in it is true (issue 50, item
    4: the history rows DROP SYSTEM VERSIONING removes used to be deleted by id alone, in a
    version without ``row_end``, which is the current row's key too)."""
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        rebuilt = await assert_stream_equals_table(cdc.port, conn, source.database, table,
                                                   user=USER, password=PASSWORD, **kwargs)
    finally:
        conn.close()
    assert not rebuilt.inconsistencies, f"{table}: {rebuilt.examples}"
    return rebuilt


def _changes(table: str) -> tuple[str, ...]:
    return (f"INSERT INTO {table} (id, v) VALUES (1, 1), (2, 2), (3, 3)",
            f"UPDATE {table} SET v = 10 WHERE id = 1",
            f"UPDATE {table} SET v = 11 WHERE id = 1",
            f"DELETE FROM {table} WHERE id = 2")


async def test_system_versioned_tables_stream_their_history(cdc: RunningService,
                                                            source: Source):
    _run(source,
         # implicit row_start/row_end, hidden from SHOW CREATE TABLE
         "CREATE TABLE a (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
         # explicit, invisible period columns
         "CREATE TABLE b (id INT PRIMARY KEY, v INT,"
         " s TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE,"
         " e TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE,"
         " PERIOD FOR SYSTEM_TIME (s, e)) WITH SYSTEM VERSIONING",
         # transaction-precise: the period holds transaction ids
         "CREATE TABLE c (id INT PRIMARY KEY, v INT,"
         " s BIGINT UNSIGNED GENERATED ALWAYS AS ROW START,"
         " e BIGINT UNSIGNED GENERATED ALWAYS AS ROW END,"
         " PERIOD FOR SYSTEM_TIME (s, e)) ENGINE=InnoDB WITH SYSTEM VERSIONING",
         # a column's WITH SYSTEM VERSIONING versions the table
         "CREATE TABLE f (id INT PRIMARY KEY, v INT WITH SYSTEM VERSIONING, w INT)",
         # no primary key: compared as a multiset
         "CREATE TABLE e (id INT, v INT) WITH SYSTEM VERSIONING",
         # versioned and partitioned by time
         "CREATE TABLE g (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING"
         " PARTITION BY SYSTEM_TIME (PARTITION p_hist HISTORY, PARTITION p_cur CURRENT)",
         # an existing table with UUID and INET6 columns gets its period by ALTER
         "CREATE TABLE h (id INT PRIMARY KEY, u UUID, i INET6, v INT)",
         "INSERT INTO h VALUES (1, 'e2af8e16-55b0-11ee-9ddd-0242ac120002', '2001:db8::1', 1)",
         "ALTER TABLE h ADD COLUMN rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE,"
         " ADD COLUMN re TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE,"
         " ADD PERIOD FOR SYSTEM_TIME(rs, re), ADD SYSTEM VERSIONING",
         "UPDATE h SET v = 2, u = 'e2af8e16-55b0-11ee-9ddd-0242ac120003'",
         "INSERT INTO h VALUES (2, '00000000-0000-0000-0000-000000000001', '::1', 3)",
         # versioning added to a table with rows, then a column added while versioned
         "CREATE TABLE k (id INT PRIMARY KEY, v INT)",
         "INSERT INTO k VALUES (7, 7), (8, 8)",
         "ALTER TABLE k ADD SYSTEM VERSIONING")
    for table in ("a", "b", "c", "f", "e", "g", "k"):
        _run(source, *_changes(table))
    _run(source, "ALTER TABLE k ADD COLUMN w INT", "UPDATE k SET w = 5 WHERE id = 1",
         "ALTER TABLE a ADD COLUMN w INT FIRST", "UPDATE a SET w = 7 WHERE id = 3",
         session=KEEP)
    _run(source, "DELETE HISTORY FROM f")  # the history rows go, as row events
    await _all_time(cdc, source, "a", key=("id", "row_end"))
    await _all_time(cdc, source, "b", key=("id", "e"), implicit=False)
    await _all_time(cdc, source, "c", key=("id", "e"), implicit=False)
    await _all_time(cdc, source, "f", key=("id", "row_end"))
    await _all_time(cdc, source, "e", key=())
    await _all_time(cdc, source, "g", key=("id", "row_end"))
    rebuilt = await _all_time(cdc, source, "h", key=("id", "re"), implicit=False)
    uuids = {r["u"] for r in rebuilt.records}
    assert "e2af8e16-55b0-11ee-9ddd-0242ac120003" in uuids, uuids  # a UUID, not hex
    await _all_time(cdc, source, "k", key=("id", "row_end"))

    # DROP SYSTEM VERSIONING takes the history rows and the period with it
    _run(source, "ALTER TABLE a DROP SYSTEM VERSIONING",
         "ALTER TABLE b DROP SYSTEM VERSIONING, DROP PERIOD FOR SYSTEM_TIME,"
         " DROP COLUMN s, DROP COLUMN e", "UPDATE a SET v = 12 WHERE id = 1",
         session=KEEP)
    for table in ("a", "b"):
        rebuilt = await _equal(cdc, source, table, key=("id",))
        assert _repairs(rebuilt), f"{table}: its history rows were not taken away"
        await _verified(cdc, source, table)


async def test_a_sequence_is_one_row(cdc: RunningService, source: Source):
    _run(source,
         "CREATE SEQUENCE s1",
         "SELECT NEXTVAL(s1)", "SELECT NEXTVAL(s1)",
         "CREATE SEQUENCE s2 START WITH 10 INCREMENT BY 5 MINVALUE 1 MAXVALUE 1000 CACHE 2"
         " CYCLE",
         *("SELECT NEXTVAL(s2)" for _ in range(7)),
         "SELECT SETVAL(s2, 500)",
         "ALTER SEQUENCE s2 RESTART WITH 20",
         "CREATE SEQUENCE s3 NOCACHE",
         "SELECT NEXTVAL(s3)",
         "BEGIN", "SELECT NEXTVAL(s3)", "SELECT NEXTVAL(s3)", "COMMIT")
    for name in ("s1", "s2", "s3"):
        rebuilt = await _equal(cdc, source, name, key=())
        assert sum(rebuilt.bag.values()) == 1, f"{name}: {rebuilt.bag}"
        types = {r["event_type"] for r in rebuilt.records}
        assert types <= {"insert", "update_before", "update_after"}, types
        inserts = [r for r in rebuilt.records if r["event_type"] == "insert"]
        assert len(inserts) == 1, f"{name}: {len(inserts)} inserts"
        await _verified(cdc, source, name)



async def test_drop_system_versioning_deletes_the_history_rows_by_their_whole_key(
        cdc: RunningService, source: Source):
    """Issue 50, item 4: the history rows DROP SYSTEM VERSIONING removes were deleted in the
    new version, without ``row_end``: by their id alone, which is the current row's key too
    for a consumer keyed like the stored schema. They go out in the old version now, with
    their ``row_end``; the current rows come back without a period."""
    _run(source, "CREATE TABLE d (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
         *_changes("d"), "ALTER TABLE d DROP SYSTEM VERSIONING", session=KEEP)
    rebuilt = await _equal(cdc, source, "d", key=("id",))
    deletes = [r for r in rebuilt.records if "cdc:repair" in r and r["event_type"] == "delete"]
    assert deletes and all(r.get("row_end") is not None for r in deletes), deletes
    history = [r for r in deletes if not str(r["row_end"]).startswith("2038")]
    assert sorted(r["id"] for r in history) == [1, 1, 2]  # two updates of 1, the deleted 2


async def test_a_change_waiting_for_a_repair_is_told_as_held_where_the_source_is_keyed_otherwise(
        tmp_path: os.PathLike[str], source: Source, users_file: str):
    """Issue 50, item 3 (found by the soak): between DROP SYSTEM VERSIONING and its repair
    the stream holds none of the table's rows, so a delete there goes out as nothing and an
    update as an insert (:mod:`cdcserver.reread.asheld`). The service starts after the
    statements, so its repair reads the table when versioning is on again: the view was
    keyed like that source (``id``, ``row_end``), not like the rows changed in between
    (``id``), and those went out as the binlog has them: a delete of a row never held."""
    _run(source, "CREATE TABLE w (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
         "INSERT INTO w (id, v) VALUES (1, 1), (2, 2), (3, 3)",
         "ALTER TABLE w DROP SYSTEM VERSIONING", "DELETE FROM w WHERE id = 2",
         "UPDATE w SET v = 30 WHERE id = 3", "ALTER TABLE w ADD SYSTEM VERSIONING",
         session=KEEP)
    cdc = await start_service(make_config(os.path.join(tmp_path, "data"), source.url,
                                          users_file))
    try:
        await _all_time(cdc, source, "w", key=("id", "row_end"))
    finally:
        await cdc.stop()
