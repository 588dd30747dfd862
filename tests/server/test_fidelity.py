"""Binlog cases that must come out exact, or stop replication loudly: never silently wrong."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER

pytestmark = pytest.mark.mariadb


def _records(port: int, name: str) -> list[ChangeRecord]:
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, format="AVRO") as client:
        return [e for e in client.stream(name, idle_timeout=1) if isinstance(e, ChangeRecord)]


async def _verified(cdc: RunningService, source: Source, table: str) -> None:
    report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                     cdc.service.config.store.data_dir,
                                     TableName(source.database, table))
    assert report.ok, "\n".join(report.lines())


async def test_year_before_numeric_columns_keeps_their_signs(cdc: RunningService,
                                                              source: Source):
    """MariaDB's SIGNEDNESS bitmap has a bit for YEAR (MySQL's has not)."""
    table = f"`{source.database}`.y"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, y YEAR, a INT, "
                   "b INT UNSIGNED, c SMALLINT, d TINYINT UNSIGNED)",
                   f"INSERT INTO {table} VALUES (1, 2024, -1, 4294967295, -2, 255)")
    await cdc.caught_up(source)
    [record] = await asyncio.to_thread(_records, cdc.port, f"{source.database}.y")
    assert record.values == {"id": 1, "y": 2024, "a": -1, "b": 4294967295, "c": -2, "d": 255}
    await _verified(cdc, source, "y")


async def test_rolled_back_rows_of_transactional_tables_are_dropped(cdc: RunningService,
                                                                    source: Source):
    table = f"`{source.database}`.r"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY) ENGINE=InnoDB")
    conn = source.server.connect()
    with conn.cursor() as cur:  # the temporary table makes the server log the group
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1)")
        cur.execute(f"CREATE TEMPORARY TABLE `{source.database}`.tmp (x INT)")
        cur.execute("ROLLBACK")
        cur.execute(f"INSERT INTO {table} VALUES (2)")
    conn.close()
    await cdc.caught_up(source)
    ids = [r.values["id"] for r in await asyncio.to_thread(_records, cdc.port,
                                                           f"{source.database}.r")]
    assert ids == [2]
    await _verified(cdc, source, "r")


async def test_non_transactional_rows_of_a_rolled_back_transaction_are_kept(
        cdc: RunningService, source: Source):
    """MariaDB logs the MyISAM row as its own committed group; the InnoDB row is not logged."""
    innodb, myisam = f"`{source.database}`.i", f"`{source.database}`.m"
    source.execute(f"CREATE TABLE {innodb} (id INT PRIMARY KEY) ENGINE=InnoDB",
                   f"CREATE TABLE {myisam} (id INT PRIMARY KEY) ENGINE=MyISAM")
    conn = source.server.connect()
    with conn.cursor() as cur:
        for statement in ("BEGIN", f"INSERT INTO {innodb} VALUES (1)",
                          f"INSERT INTO {myisam} VALUES (1)", "ROLLBACK"):
            cur.execute(statement)
    conn.close()
    await cdc.caught_up(source)
    [record] = await asyncio.to_thread(_records, cdc.port, f"{source.database}.m")
    assert record.values == {"id": 1}
    await _verified(cdc, source, "m")


@pytest.fixture
def compressed_binlog(source: Source) -> Iterator[Source]:
    source.execute("SET GLOBAL log_bin_compress = ON", "SET GLOBAL log_bin_compress_min_len = 10")
    yield source
    source.execute("SET GLOBAL log_bin_compress = OFF")


async def test_compressed_binlog_events_are_decoded(compressed_binlog: Source,
                                                    cdc: RunningService):
    source = compressed_binlog
    table = f"`{source.database}`.z"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, body TEXT, "
                   "note VARCHAR(200))",
                   f"INSERT INTO {table} VALUES (1, REPEAT('compress me ', 500), 'a'), "
                   "(2, 'short', REPEAT('é', 100))",
                   f"UPDATE {table} SET note = 'changed' WHERE id = 1",
                   f"DELETE FROM {table} WHERE id = 2")
    events = source.query(f"SHOW BINLOG EVENTS IN '{source.query('SHOW BINARY LOGS')[-1][0]}'")
    assert any("compressed" in str(row[2]).lower() for row in events)
    await cdc.caught_up(source)
    records = await asyncio.to_thread(_records, cdc.port, f"{source.database}.z")
    assert [r.event_type for r in records] == ["insert", "insert", "update_before",
                                               "update_after", "delete"]
    assert records[0].values["body"] == "compress me " * 500
    await _verified(cdc, source, "z")


@pytest.fixture
def old_temporal_format(source: Source) -> Iterator[Source]:
    source.execute("SET GLOBAL mysql56_temporal_format = OFF")
    yield source
    source.execute("SET GLOBAL mysql56_temporal_format = ON")


async def test_mariadb_old_temporal_formats(old_temporal_format: Source, cdc: RunningService):
    """Columns created before MariaDB 10.1.2 (or with mysql56_temporal_format=OFF) use
    MariaDB's own fractional formats, whose precision only the schema history knows."""
    source = old_temporal_format
    table = f"`{source.database}`.o"
    conn = source.server.connect()
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, t3 TIME(3), dt6 DATETIME(6), "
                    "ts2 TIMESTAMP(2) NULL, t0 TIME, d0 DATETIME, ts0 TIMESTAMP NULL, "
                    "dt1 DATETIME(1), t6 TIME(6))")
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"INSERT INTO {table} VALUES (1, '-12:34:56.789', "
                    "'2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.12', '-100:00:01', "
                    "'2024-02-29 12:34:56', '2024-02-29 12:34:56', '2024-02-29 12:34:56.5', "
                    "'838:59:59.999999'), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    conn.close()
    await cdc.caught_up(source)
    [first, _] = await asyncio.to_thread(_records, cdc.port, f"{source.database}.o")
    assert first.values["t3"] == -dt.timedelta(hours=12, minutes=34, seconds=56,
                                               milliseconds=789)
    assert first.values["dt6"] == dt.datetime(2024, 2, 29, 12, 34, 56, 123456)
    assert first.values["ts2"] == dt.datetime(2024, 2, 29, 12, 34, 56, 120000, tzinfo=dt.UTC)
    assert first.values["t6"] == dt.timedelta(hours=838, minutes=59, seconds=59,
                                              microseconds=999999)
    await _verified(cdc, source, "o")


async def test_last_transaction_is_known_after_a_restart(tmp_path, source: Source,
                                                        users_file: str):
    from tests.conftest import make_config, start_service
    from tests.helpers import RawClient

    source.execute(f"CREATE TABLE `{source.database}`.q (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.q VALUES (1), (2)")
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    first = await start_service(config)
    await first.caught_up(source)
    await first.stop()
    second = await start_service(config)
    try:
        client = await RawClient.connect(second.port)
        await client.login()
        await client.send(b"QUERY-LAST-TRANSACTION")
        last = await client.json_line()
        await client.close()
        assert last["GTID"] == str(source.gtid_state()) and last["events"] == 2
    finally:
        await second.stop()
