"""The ``cdc`` Spark data source against the real service, MariaDB and local Spark: batch and
streaming reads, restarts from a checkpoint, several tables, dumps, and the Parquet mirror."""

from __future__ import annotations

import asyncio
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, wait_until, zero_dates_table
from tests.spark_queries import CONNECT_BACK, STARTS, run_to_end

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]


def _options(cdc: RunningService, tables: str, **extra: str) -> dict[str, str]:
    return {"host": cdc.host, "port": str(cdc.port), "user": USER, "password": PASSWORD,
            "tables": tables, **extra}


def _batch(spark: Any, options: dict[str, str]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Column types and rows (in change order) of a batch read; call it off the event loop,
    which the service runs on."""
    df = spark.read.format("cdc").options(**options).load()
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    rows = df.orderBy("_table", "domain", "sequence", "event_number").collect()
    return types, [r.asDict() for r in rows]


async def test_a_batch_read_has_the_metadata_and_typed_columns(
        cdc: RunningService, source: Source, spark: Any):
    t = f"`{source.database}`.typed"
    source.execute(
        f"CREATE TABLE {t} (id INT PRIMARY KEY, big BIGINT, ubig BIGINT UNSIGNED, "
        "price DECIMAL(10,2), name VARCHAR(20), raw VARBINARY(8), d DATE, dtm DATETIME(6), "
        "ts TIMESTAMP(3) NULL, tm TIME, f FLOAT, dbl DOUBLE)",
        f"INSERT INTO {t} VALUES (1, -5, 18446744073709551615, 12345678.91, 'ä', x'00ff', "
        "'2024-02-29', '2024-02-29 23:59:58.123456', '2024-03-01 00:00:01.500', '-838:59:59', "
        "1.5, 2.25)",
        f"UPDATE {t} SET name = 'b' WHERE id = 1",
        f"DELETE FROM {t} WHERE id = 1")
    await cdc.caught_up(source)

    types, rows = await asyncio.to_thread(_batch, spark,
                                          _options(cdc, f"{source.database}.typed"))
    assert types == {
        "domain": "bigint", "server_id": "bigint", "sequence": "bigint", "event_number": "int",
        "timestamp": "bigint", "event_type": "string", "_table": "string", "_version": "int",
        "id": "int", "big": "bigint", "ubig": "decimal(20,0)", "price": "decimal(10,2)",
        "name": "string", "raw": "binary", "d": "date", "dtm": "timestamp_ntz",
        "ts": "timestamp", "tm": "interval day to second", "f": "float", "dbl": "double"}
    assert [r["event_type"] for r in rows] == ["insert", "update_before", "update_after",
                                               "delete"]
    first = rows[0]
    assert first["_table"] == f"{source.database}.typed" and first["_version"] == 1
    assert (first["id"], first["big"], first["ubig"], first["price"]) == \
        (1, -5, Decimal(18446744073709551615), Decimal("12345678.91"))
    assert (first["name"], first["raw"], first["d"]) == ("ä", bytearray(b"\x00\xff"),
                                                         dt.date(2024, 2, 29))
    assert first["dtm"] == dt.datetime(2024, 2, 29, 23, 59, 58, 123456)
    assert first["ts"] == dt.datetime(2024, 3, 1, 0, 0, 1, 500000)  # session zone UTC
    assert first["tm"] == -dt.timedelta(hours=838, minutes=59, seconds=59)
    assert (first["f"], first["dbl"]) == (1.5, 2.25)
    assert rows[2]["name"] == "b"
    gtids = source.query("SELECT @@gtid_binlog_pos")[0][0]
    assert f"{rows[-1]['domain']}-{rows[-1]['server_id']}-{rows[-1]['sequence']}" == gtids


def _stream(spark: Any, options: dict[str, str], sink: str, checkpoint: str,
            **trigger: Any) -> Any:
    """Start a streaming read into Parquet files (a sink that survives restarts)."""
    df = spark.readStream.format("cdc").options(**options).load()
    return (df.writeStream.format("parquet").option("path", sink)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def _run_available_now(spark: Any, options: dict[str, str], sink: str, checkpoint: str
                       ) -> list[dict[str, Any]]:
    query = run_to_end(lambda: _stream(spark, options, sink, checkpoint, availableNow=True),
                       120)
    assert query.exception() is None, query.exception()
    return [p for p in query.recentProgress if p["numInputRows"]]


def _sink_rows(spark: Any, sink: str) -> list[tuple[Any, ...]]:
    rows = spark.read.parquet(sink).collect()
    return sorted((r["domain"], r["sequence"], r["event_number"], r["event_type"], r["id"])
                  for r in rows)


def _insert(source: Source, table: str, ids: range, per_transaction: int = 1) -> None:
    for first in range(ids.start, ids.stop, per_transaction):
        values = ",".join(f"({i}, 'v{i}')" for i in range(first,
                                                           min(first + per_transaction, ids.stop)))
        source.execute(f"INSERT INTO {table} VALUES {values}")


async def test_available_now_then_a_restart_from_the_checkpoint_reads_each_change_once(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any):
    t = f"`{source.database}`.s"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))")
    _insert(source, t, range(1, 41), per_transaction=4)
    source.execute(f"UPDATE {t} SET v = 'x' WHERE id <= 5")  # one transaction, 10 records
    await cdc.caught_up(source)
    options = _options(cdc, f"{source.database}.s", startingPosition="earliest",
                       maxRowsPerBatch="7")
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    batches = await asyncio.to_thread(_run_available_now, spark, options, sink, checkpoint)
    # 50 records in batches of at most 7; the 10-record update was cut by event number
    assert sum(b["numInputRows"] for b in batches) == 50
    assert max(b["numInputRows"] for b in batches) == 7 and len(batches) >= 8

    _insert(source, t, range(41, 61), per_transaction=5)
    source.execute(f"DELETE FROM {t} WHERE id > 55")
    await cdc.caught_up(source)
    batches = await asyncio.to_thread(_run_available_now, spark, options, sink, checkpoint)
    assert sum(b["numInputRows"] for b in batches) == 25

    rows = await asyncio.to_thread(_sink_rows, spark, sink)
    assert len(rows) == len(set(rows)) == 75  # 40 + 10 + 20 + 5, none twice
    assert sorted(r[4] for r in rows if r[3] == "insert") == list(range(1, 61))
    assert sorted(r[4] for r in rows if r[3] == "delete") == list(range(56, 61))


def _run_until(spark: Any, options: dict[str, str], sink: str, checkpoint: str,
               rows: int) -> Any:
    """A processingTime query, stopped once it has read ``rows`` rows. A start whose Python
    worker missed Spark's hard-coded 10 s to connect back (tests/spark_queries.py) is started
    again from its checkpoint, the same query; its batches' progress counts on."""
    progress: list[Any] = []
    for attempt in range(1, STARTS + 1):
        query = _stream(spark, options, sink, checkpoint, processingTime="200 milliseconds")
        try:
            def ended_or_read(query: Any = query, before: int = sum(
                    p["numInputRows"] for p in progress)) -> bool:
                return query.exception() is not None or before + sum(
                    p["numInputRows"] for p in query.recentProgress) >= rows

            wait_until(ended_or_read, timeout=120, what=f"the stream to read {rows} rows")
            error = query.exception()
            if error is not None and CONNECT_BACK in str(error) and attempt < STARTS:
                progress += list(query.recentProgress)
                continue
            assert error is None, error
            return [*progress, *query.recentProgress]
        finally:
            query.stop()
    raise AssertionError("unreachable")


async def test_processing_time_follows_new_changes_and_survives_a_stop_mid_stream(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any):
    t = f"`{source.database}`.live"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))")
    await cdc.caught_up(source)
    options = _options(cdc, f"{source.database}.live", startingPosition="earliest",
                       maxRowsPerBatch="10")
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    async def write_later() -> None:
        for first in range(1, 36, 5):
            await asyncio.to_thread(_insert, source, t, range(first, first + 5), 2)
        await asyncio.to_thread(_insert, source, t, range(36, 61), 25)  # cut by event number
    writer = asyncio.create_task(write_later())
    progress = await asyncio.to_thread(_run_until, spark, options, sink, checkpoint, 45)
    await writer
    assert max(p["numInputRows"] for p in progress) == 10  # the limit, reached
    first = sum(p["numInputRows"] for p in progress)  # stopped mid-stream, 45 to 60 read

    _insert(source, t, range(61, 71), per_transaction=10)  # while it is stopped
    await cdc.caught_up(source)
    await asyncio.to_thread(_run_until, spark, options, sink, checkpoint, 70 - first)
    rows = await asyncio.to_thread(_sink_rows, spark, sink)
    assert [r[4] for r in rows] == list(range(1, 71))  # each once, none lost


def _partition_tables(spark: Any, options: dict[str, str]) -> list[tuple[int, str, int]]:
    from pyspark.sql import functions as F

    df = spark.read.format("cdc").options(**options).load()
    grouped = df.groupBy(F.spark_partition_id().alias("p"), "_table").count()
    return sorted((r["p"], r["_table"], r["count"]) for r in grouped.collect())


async def test_two_tables_are_read_in_parallel_partitions_and_a_large_one_in_ranges(
        cdc: RunningService, source: Source, spark: Any):
    db = source.database
    for name in ("a", "b", "other"):
        source.execute(f"CREATE TABLE `{db}`.{name} (id INT PRIMARY KEY, v VARCHAR(10))")
    _insert(source, f"`{db}`.a", range(1, 31), per_transaction=3)
    _insert(source, f"`{db}`.b", range(1, 6))
    _insert(source, f"`{db}`.other", range(1, 4))
    await cdc.caught_up(source)

    # a pattern picks a and b (not "other"); a's 30 rows are cut in ranges of at most 12
    parts = await asyncio.to_thread(_partition_tables, spark,
                                    _options(cdc, f"{db}.?", maxRowsPerPartition="12"))
    assert [(table, count) for _, table, count in parts] == \
        [(f"{db}.a", 12), (f"{db}.a", 12), (f"{db}.a", 6), (f"{db}.b", 5)]
    assert len({p for p, _, _ in parts}) == 4  # each range its own partition

    _, rows = await asyncio.to_thread(_batch, spark, _options(cdc, f"{db}.a,{db}.b"))
    assert sorted((r["_table"], r["id"]) for r in rows) == \
        [(f"{db}.a", i) for i in range(1, 31)] + [(f"{db}.b", i) for i in range(1, 6)]


async def test_a_new_column_fails_the_running_query_clearly_and_a_restart_reads_it(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any):
    t = f"`{source.database}`.evolving"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))")
    _insert(source, t, range(1, 4))
    await cdc.caught_up(source)
    options = _options(cdc, f"{source.database}.evolving", startingPosition="earliest")
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    def run_through_the_change() -> str:
        """A running query (its schema has no price) meets the new version."""
        query = _stream(spark, options, sink, checkpoint, processingTime="200 milliseconds")
        try:
            wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 3,
                       timeout=120, what="the first rows")
            source.execute(f"ALTER TABLE {t} ADD COLUMN price DECIMAL(8,2)",
                           f"INSERT INTO {t} VALUES (4, 'v4', 9.99)")
            wait_until(lambda: query.exception() is not None, timeout=120,
                       what="the query to fail")
            return str(query.exception())
        finally:
            query.stop()
    error = await asyncio.to_thread(run_through_the_change)
    assert "changed to version 2" in error and "column 'price' is not in the query's " \
        "schema" in error and "Restart the query" in error

    source.execute(f"ALTER TABLE {t} MODIFY COLUMN id BIGINT",  # widened: still fits
                   f"INSERT INTO {t} VALUES (5, 'v5', 1.50)")
    await cdc.caught_up(source)
    await asyncio.to_thread(_run_available_now, spark, options, sink, checkpoint)
    rows = await asyncio.to_thread(  # the sink's files have id INT, then BIGINT
        lambda: sorted((r["id"], r["price"]) for r in spark.read.schema(
            "id BIGINT, price DECIMAL(8,2)").parquet(sink).collect()))
    assert rows == [(1, None), (2, None), (3, None), (4, Decimal("9.99")),
                    (5, Decimal("1.50"))]  # each once: the failed batch was read again

    from mariadb_cdc_client.spark.types import SchemaError, table_schema
    versions = await asyncio.to_thread(_versions, cdc, source.database, "evolving")
    retyped = {**versions[1], "fields": [*versions[1]["fields"][:-1],
                                         {"name": "price", "type": ["null", "string"]}]}
    with pytest.raises(SchemaError, match=r"'price' is decimal\(8,2\) in .* but string"):
        table_schema([versions[1], retyped])


def _versions(cdc: RunningService, database: str, table: str) -> list[dict[str, Any]]:
    from mariadb_cdc_client.sync import SyncCdcConnection

    conn = SyncCdcConnection.open(cdc.host, cdc.port, USER, PASSWORD)
    try:
        listed = conn.query("LIST-TABLES")["tables"]
    finally:
        conn.close()
    versions: list[dict[str, Any]] = next(
        t["versions"] for t in listed if (t["database"], t["table"]) == (database, table))
    return versions


async def _take_dump(cdc: RunningService, source: Source, table: str) -> None:
    from cdcserver.core.config import DumpConfig, parse_source_url
    from cdcserver.core.names import TableName
    from cdcserver.dump.dumper import DumpOptions, dump_tables

    await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                            cdc.service.config.store.data_dir,
                            [TableName(source.database, table)],
                            DumpOptions(DumpConfig(chunk_rows=7)))


def _mirror_rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    from mariadb_cdc_client.spark.mirror import read_mirror

    return sorted(tuple(r) for r in read_mirror(spark, path).select("id", "name", "qty")
                  .collect())


async def test_a_mirror_built_from_the_latest_dump_equals_the_source_table(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any):
    """The example pipeline of docs/spark.md: snapshot then stream, applied per micro-batch."""
    from mariadb_cdc_client.spark.mirror import start

    t = f"`{source.database}`.stock"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
    source.execute(f"INSERT INTO {t} VALUES " + ",".join(
        f"({i}, 'item{i}', {i * 10})" for i in range(1, 41)))
    await cdc.caught_up(source)
    await _take_dump(cdc, source, "stock")
    source.execute(f"UPDATE {t} SET qty = qty + 1 WHERE id % 3 = 0",  # after the dump
                   f"DELETE FROM {t} WHERE id > 35",
                   f"INSERT INTO {t} VALUES (100, 'new', 1)",
                   f"UPDATE {t} SET id = 101 WHERE id = 1")  # a key change
    await cdc.caught_up(source)

    path, checkpoint = str(tmp_path / "mirror"), str(tmp_path / "checkpoint")
    options = _options(cdc, "unused", startingPosition="dump", maxRowsPerBatch="25")

    def run_once() -> int:
        query = run_to_end(lambda: start(spark, options, f"{source.database}.stock", path,
                                         checkpoint, {"availableNow": True}), 180)
        assert query.exception() is None, query.exception()
        return len([p for p in query.recentProgress if p["numInputRows"]])

    batches = await asyncio.to_thread(run_once)
    assert batches >= 2  # the dump, then the changes after it
    expected = sorted(source.query(f"SELECT id, name, qty FROM {t}"))
    assert await asyncio.to_thread(_mirror_rows, spark, path) == expected

    source.execute(f"UPDATE {t} SET name = 'renamed' WHERE id < 10",
                   f"DELETE FROM {t} WHERE id = 20")
    await cdc.caught_up(source)
    await asyncio.to_thread(run_once)  # restarted from its checkpoint
    expected = sorted(source.query(f"SELECT id, name, qty FROM {t}"))
    assert await asyncio.to_thread(_mirror_rows, spark, path) == expected


async def test_a_mirror_starts_from_the_dump_of_a_table_with_no_change_stored_yet(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any):
    """A table the service has only dumped (created and filled before its start position:
    here, out of the binlog) has no stored version yet; the mirror takes its key from the
    dump. (It failed with "is not a stored table", found by bench/bench_spark_delta.py.)"""
    from mariadb_cdc_client.spark.mirror import start

    t = f"`{source.database}`.quiet"
    source.execute("SET SESSION sql_log_bin = 0",
                   f"CREATE TABLE {t} (code CHAR(3) PRIMARY KEY, qty INT)",
                   f"INSERT INTO {t} VALUES ('a', 1), ('b', 2), ('c', 3)")
    await _take_dump(cdc, source, "quiet")
    path, checkpoint = str(tmp_path / "mirror"), str(tmp_path / "checkpoint")
    options = _options(cdc, "unused", startingPosition="dump")

    def run_once() -> list[tuple[Any, ...]]:
        query = run_to_end(lambda: start(spark, options, f"{source.database}.quiet", path,
                                         checkpoint, {"availableNow": True}), 180)
        assert query.exception() is None, query.exception()
        return sorted(tuple(r) for r in read_mirror(spark, path).select("code", "qty")
                      .collect())

    from mariadb_cdc_client.spark.mirror import read_mirror

    assert await asyncio.to_thread(run_once) == [("a", 1), ("b", 2), ("c", 3)]
    source.execute(f"UPDATE {t} SET qty = 20 WHERE code = 'b'")  # now in the binlog
    await cdc.caught_up(source)
    assert await asyncio.to_thread(run_once) == [("a", 1), ("b", 20), ("c", 3)]


async def test_a_batch_read_from_the_dump_holds_the_dump_rows_then_the_changes(
        cdc: RunningService, source: Source, spark: Any):
    t = f"`{source.database}`.snap"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))")
    _insert(source, t, range(1, 11), per_transaction=10)
    await cdc.caught_up(source)
    await _take_dump(cdc, source, "snap")
    _insert(source, t, range(11, 14))
    await cdc.caught_up(source)

    _, rows = await asyncio.to_thread(
        _batch, spark, _options(cdc, f"{source.database}.snap", startingPosition="dump"))
    dump_rows = [r for r in rows if r["sequence"] == rows[0]["sequence"]]
    assert [r["id"] for r in dump_rows] == list(range(1, 11))
    assert [r["event_number"] for r in dump_rows] == list(range(1, 11))
    assert [r["id"] for r in rows[10:]] == [11, 12, 13]  # the changes after it, once
    assert all(r["event_type"] == "insert" for r in rows)


async def test_zero_dates_fail_the_read_clearly_unless_read_as_null(
        cdc: RunningService, source: Source, spark: Any):
    zero_dates_table(source, "zero")
    await cdc.caught_up(source)
    options = _options(cdc, f"{source.database}.zero")
    with pytest.raises(Exception, match=r"'0000-00-00' is not a valid date .* zeroDates=null"):
        await asyncio.to_thread(_batch, spark, options)
    _, rows = await asyncio.to_thread(_batch, spark, {**options, "zeroDates": "null"})
    assert [(r["id"], r["d"], r["dtm"]) for r in rows] == [
        (1, None, None), (2, dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5))]


async def test_widened_columns_keep_every_versions_values_exactly(
        cdc: RunningService, source: Source, spark: Any):
    """One DataFrame over three versions: DECIMAL(5,2) then DECIMAL(10,4) (rescaled), INT
    then BIGINT, FLOAT then DOUBLE, and a column only the last version has."""
    t = f"`{source.database}`.wide"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, price DECIMAL(5,2), f FLOAT)",
                   f"INSERT INTO {t} VALUES (1, -123.45, 0.5), (2, NULL, NULL)",
                   f"ALTER TABLE {t} MODIFY price DECIMAL(10,4), MODIFY id BIGINT",
                   f"INSERT INTO {t} VALUES (3000000000, 123456.7891, 1.25)",
                   f"ALTER TABLE {t} MODIFY f DOUBLE, ADD COLUMN note TEXT",
                   f"INSERT INTO {t} VALUES (4, 0.0001, 0.1, 'n')")
    await cdc.caught_up(source)
    types, rows = await asyncio.to_thread(_batch, spark,
                                          _options(cdc, f"{source.database}.wide"))
    assert (types["id"], types["price"], types["f"], types["note"]) == \
        ("bigint", "decimal(10,4)", "double", "string")
    assert [(r["_version"], r["id"], r["price"], r["f"], r["note"]) for r in rows] == [
        (1, 1, Decimal("-123.4500"), 0.5, None), (1, 2, None, None, None),
        (2, 3000000000, Decimal("123456.7891"), 1.25, None),
        (3, 4, Decimal("0.0001"), 0.1, "n")]


async def test_a_read_uses_the_first_instance_that_answers(
        cdc: RunningService, source: Source, spark: Any):
    """``host`` names several service instances: every read (the plan and each partition)
    goes to the first that answers, here the second, the first being down."""
    from cdcserver.app.embedded import free_port

    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {t} VALUES (1, 1), (2, 2)", f"UPDATE {t} SET v = 3")
    await cdc.caught_up(source)
    options = {**_options(cdc, f"{source.database}.t"),
               "host": f"127.0.0.1:{free_port()},{cdc.host}:{cdc.port}", "port": "1"}
    _, rows = await asyncio.to_thread(_batch, spark, options)
    _, direct = await asyncio.to_thread(_batch, spark, _options(cdc, f"{source.database}.t"))
    assert rows == direct and len(rows) == 6
