"""What one application's session sets for itself stops no other table (issue 50, item 2).

A session may set ``binlog_row_image`` to ``MINIMAL`` or ``NOBLOB`` for itself: its row events
then miss columns, and the table's stream cannot be exact from them. That table is
quarantined (marked in-band, its readers told), every other table streams on, and the service
resyncs it by itself once it can read it (at once here): the table rebuilt from its raw JSON
stream equals ``SELECT`` on the source. It used to stop the whole service (exit 1)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from prometheus_client import generate_latest

from cdcserver.core.names import TableName
from cdcserver.ops.metrics import ServiceCollector, health, service_registry
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, eventually
from tests.oracle import Rebuilt, assert_stream_equals_table, read_stream

pytestmark = pytest.mark.mariadb


@pytest.mark.parametrize("image", ["MINIMAL", "NOBLOB"])
async def test_a_session_with_a_partial_row_image_quarantines_its_table_alone(
        cdc: RunningService, source: Source, image: str):
    db = source.database
    table = TableName(db, "pi")
    source.execute(f"CREATE TABLE `{db}`.pi (id INT PRIMARY KEY, a VARCHAR(20), b INT, "
                   "t TEXT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.pi VALUES (1, 'one', 1, 'x'), (2, 'two', 2, 'y')")
    await cdc.caught_up(source)
    source.execute(f"SET SESSION binlog_row_image = {image}",
                   f"UPDATE `{db}`.pi SET b = 20 WHERE id = 2",  # a partial image
                   f"INSERT INTO `{db}`.other VALUES (1, 1)",
                   "SET SESSION binlog_row_image = FULL",
                   f"INSERT INTO `{db}`.other VALUES (2, 2)")
    await cdc.caught_up(source)  # the service goes on
    assert table in cdc.service.data.store.quarantined
    assert "binlog_row_image" in cdc.service.data.store.quarantined[table].cause
    others = await read_stream(cdc.port, f"`{db}`.other", user=USER, password=PASSWORD,
                               quiet=0.5)
    assert [r["id"] for r in others if "event_type" in r] == [1, 2]

    async def released() -> bool:  # the resync rides on the source's next transaction
        source.execute(f"INSERT INTO `{db}`.other SELECT MAX(id) + 1, 0 FROM `{db}`.other")
        await asyncio.sleep(0.2)
        return table not in cdc.service.data.store.quarantined

    await eventually(released, bool, 60, "the resync")
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, db, "pi", user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()


async def _bounded(cdc: RunningService, source: Source, table: str) -> list[dict[str, Any]]:
    """The table's stream up to what the source has logged now: it ends by itself."""
    name = f"`{source.database}`.{table}"
    lines = await read_stream(cdc.port, name, user=USER, password=PASSWORD, quiet=60,
                              request=f"REQUEST-DATA {name} UNTIL {source.gtid_state()}")
    assert "end" in lines[-1], "the bounded read was cut"
    return lines


async def _stream_equals(cdc: RunningService, source: Source, *tables: str) -> list[Rebuilt]:
    """Each table rebuilt from its stream equals it (the rebuilds, for more checks)."""
    conn = source.server.connect()
    try:
        return [await assert_stream_equals_table(cdc.port, conn, source.database, table,
                                                 user=USER, password=PASSWORD)
                for table in tables]
    finally:
        conn.close()


async def test_a_session_logging_statements_has_its_tables_read_again(
        cdc: RunningService, source: Source):
    """``SET SESSION binlog_format=STATEMENT`` (or ``MIXED``): the changes come as SQL text,
    no rows. Every table the statement names is read again (a repair, in-band); the
    service used to stop ("a data change was logged as an SQL statement")."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.s (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE `{db}`.u (id INT PRIMARY KEY, w INT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.s VALUES (1, 1), (2, 2)",
                   f"INSERT INTO `{db}`.u VALUES (1, 10)")
    await cdc.caught_up(source)
    source.execute("SET SESSION binlog_format = 'STATEMENT'",
                   f"INSERT INTO `{db}`.s VALUES (3, 3)",
                   f"UPDATE `{db}`.s JOIN `{db}`.u ON s.id = u.id SET s.v = 100, u.w = 1000",
                   "SET SESSION binlog_format = 'MIXED'",
                   f"DELETE FROM `{db}`.s WHERE id = 2",
                   "SET SESSION binlog_format = 'ROW'",
                   f"INSERT INTO `{db}`.other VALUES (1)",
                   f"UPDATE `{db}`.s SET v = 101 WHERE id = 1")
    await cdc.repairs_out(source)
    assert cdc.service.replication.runner.stats().failure == ""
    repairs = [r for r in await _bounded(cdc, source, "s") if "cdc:repair" in r]
    assert repairs and all("as an SQL statement" in r["cdc:repair"]["reason"]
                           for r in repairs), repairs
    _, document = health(cdc.service.stats(), 60.0)  # what /health and `status` name
    named = [r for r in document["repairs"] if r["table"] == f"{db}.s"]
    assert named and "as an SQL statement" in named[-1]["reason"] and named[-1]["at"] > 0
    exposed = generate_latest(service_registry(ServiceCollector(cdc.service.stats))).decode()
    assert re.search(r'cdc_rowless_changes_total\{cause="session"\} [1-9]', exposed)
    await _stream_equals(cdc, source, "s", "u", "other")


async def test_a_rollback_to_a_savepoint_over_a_myisam_table_reads_its_tables_again(
        cdc: RunningService, source: Source):
    """MariaDB logs ``ROLLBACK TO SAVEPOINT`` only when non-transactional tables changed
    after the savepoint, and keeps every row in the group, the undone ones too. The
    transaction's tables are read again at its commit: the undone InnoDB row never goes
    out, the MyISAM row that stayed does. The service used to stop."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.i (id INT PRIMARY KEY) ENGINE=InnoDB",
                   f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY) ENGINE=MyISAM",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.i VALUES (0)")
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            for statement in ("BEGIN", f"INSERT INTO `{db}`.i VALUES (10)", "SAVEPOINT s",
                              f"INSERT INTO `{db}`.i VALUES (11)",
                              f"INSERT INTO `{db}`.m VALUES (11)",
                              "ROLLBACK TO SAVEPOINT s", f"INSERT INTO `{db}`.i VALUES (12)",
                              "COMMIT", f"INSERT INTO `{db}`.other VALUES (1)",
                              "BEGIN", f"INSERT INTO `{db}`.i VALUES (20)",
                              f"INSERT INTO `{db}`.m VALUES (20)", "ROLLBACK"):
                cur.execute(statement)
    finally:
        conn.close()
    await cdc.repairs_out(source)
    assert cdc.service.replication.runner.stats().failure == ""
    inserted = [r["id"] for r in await _bounded(cdc, source, "i")
                if r.get("event_type") == "insert"]
    assert sorted(inserted) == [0, 10, 12], "an undone row went out"
    await _stream_equals(cdc, source, "i", "m", "other")


async def test_changes_before_a_repair_carry_the_rows_the_stream_holds(
        tmp_path, source: Source, users_file: str):
    """While the service was stopped a session logged changes as statements, and later
    changes of the same rows came as row events: their binlog before-images are the source's
    rows after the statements, which the stream never carried. Read as a backlog, the repair
    of the statements waits for its watermark behind them; meanwhile each such change is told
    against the rows the stream holds (issue 50, item 3): every before-image true, no delete
    of a row it never had. An auditing consumer finds nothing untrue."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.s (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.s VALUES (1, 1), (2, 2)")
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    await running.caught_up(source)
    await running.stop()
    source.execute("SET SESSION binlog_format = 'STATEMENT'",
                   f"UPDATE `{db}`.s SET v = 5 WHERE id = 1",
                   f"INSERT INTO `{db}`.s VALUES (3, 3), (4, 4)",
                   "SET SESSION binlog_format = 'ROW'",
                   f"UPDATE `{db}`.s SET v = 6 WHERE id = 1",  # the binlog's before: v = 5
                   f"DELETE FROM `{db}`.s WHERE id = 3",  # a row the stream never had
                   f"UPDATE `{db}`.s SET v = 44 WHERE id = 4",
                   f"INSERT INTO `{db}`.s VALUES (3, 33)")
    running = await start_service(config)
    try:
        await running.repairs_out(source)
        [rebuilt] = await _stream_equals(running, source, "s")
    finally:
        await running.stop()
    assert not rebuilt.inconsistencies, rebuilt.examples
