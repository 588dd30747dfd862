"""The mirror into lakehouse tables (``client/spark/lakehouse.py``) against the real service,
MariaDB and local Spark: a Delta Lake table and an Iceberg table built from a dump and kept by
the streaming query, read back by tools that share no code with the mirror (polars for Delta;
pyiceberg's reader and duckdb over the Parquet files the Iceberg table names) and compared with
``SELECT`` value by value; and a batch Spark runs again, which must not be committed twice.
Then, on the sinks alone, the schema changes a restarted query can bring: a widened column and
a column no longer read."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from typing import Any

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER
from tests.spark_queries import run_to_end

COLUMNS = ("id", "ubig", "price", "name", "raw", "d", "dtm", "ts", "tm", "f")
EPOCH = dt.datetime(1970, 1, 1)


def _options(cdc: RunningService, tables: str, **extra: str) -> dict[str, str]:
    return {"host": cdc.host, "port": str(cdc.port), "user": USER, "password": PASSWORD,
            "tables": tables, **extra}


async def _take_dump(cdc: RunningService, source: Source, table: str) -> None:
    from cdcserver.core.config import DumpConfig, parse_source_url
    from cdcserver.core.names import TableName
    from cdcserver.dump.dumper import DumpOptions, dump_tables

    await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                            cdc.service.config.store.data_dir,
                            [TableName(source.database, table)],
                            DumpOptions(DumpConfig(chunk_rows=7)))


def _create(source: Source, table: str, rows: range) -> None:
    source.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, ubig BIGINT UNSIGNED, "
        "price DECIMAL(38,10), name VARCHAR(20), raw VARBINARY(8), d DATE, dtm DATETIME(6), "
        "ts TIMESTAMP(6) NULL, tm TIME(6), f DOUBLE)",
        "SET time_zone = '+00:00'",
        f"INSERT INTO {table} VALUES " + ",".join(
            f"({i}, {18446744073709551615 - i}, {i}12345678901234567890.0123456789, 'n{i}', "
            f"x'00ff{i:02x}', '2024-02-{1 + i % 28:02d}', '2024-02-29 23:59:58.{i:06d}', "
            f"'2038-01-19 03:14:07.{i:06d}', '-838:59:{i % 60:02d}.5', {i}.25)"
            for i in rows))


def _expected(source: Source, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The source's rows, read in UTC, as :func:`_canonical` makes the mirror's."""
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id")
            rows = cur.fetchall()
    finally:
        conn.close()
    return [_canonical(dict(zip(columns, r, strict=True)), columns, source=True) for r in rows]


def _canonical(row: dict[str, Any], columns: tuple[str, ...], source: bool = False
               ) -> tuple[Any, ...]:
    """A row as exact Python values: integers, Decimal, bytes, date, naive datetime; TIMESTAMP
    and TIME as microseconds (the mirror keeps TIME as microseconds)."""
    out = dict(row)
    out["ubig"] = None if row["ubig"] is None else int(row["ubig"])
    out["raw"] = None if row["raw"] is None else bytes(row["raw"])
    ts = row["ts"]
    if isinstance(ts, dt.datetime):
        if ts.tzinfo is not None:  # read back as an instant: must be UTC
            assert ts.utcoffset() == dt.timedelta(0), ts
            ts = ts.replace(tzinfo=None)
        ts = (ts - EPOCH) // dt.timedelta(microseconds=1)
    out["ts"] = ts
    if source and row["tm"] is not None:
        out["tm"] = row["tm"] // dt.timedelta(microseconds=1)
    return tuple(out[c] for c in columns)


def _delta_rows(path: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    import polars as pl

    frame = pl.read_delta(path).sort("id")
    return [_canonical(r, columns) for r in frame.select(columns).iter_rows(named=True)]


def _iceberg_rows(catalog: Any, identifier: tuple[str, str], columns: tuple[str, ...]
                  ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The table by pyiceberg's reader, and by duckdb over the data files it names (copy on
    write: no delete files)."""
    import duckdb

    table = catalog.load_table(identifier)
    by_pyiceberg = [_canonical(r, columns)
                    for r in table.scan().to_arrow().sort_by("id").select(columns).to_pylist()]
    tasks = list(table.scan().plan_files())
    assert all(not t.delete_files for t in tasks)
    files = [t.file.file_path.removeprefix("file://") for t in tasks]
    select = ", ".join("epoch_us(ts) AS ts" if c == "ts" else c for c in columns)
    with duckdb.connect() as db:
        cursor = db.execute(f"SELECT {select} FROM read_parquet(?, union_by_name = true) "
                            "ORDER BY id", [files])
        names = [d[0] for d in cursor.description]
        by_duckdb = [_canonical(dict(zip(names, r, strict=True)), columns)
                     for r in cursor.fetchall()]
    return by_pyiceberg, by_duckdb


def _write_out_of_order(source: Source, table: str) -> None:
    """Two updates of one row in a domain whose sequence numbers go down (gtid_strict_mode
    off): the later transaction has the lower number, and must win."""
    source.execute("SET GLOBAL gtid_strict_mode = OFF")
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {table} SET name = 'high seq' WHERE id = 7")
            cur.execute("SET SESSION gtid_seq_no = 1")
            cur.execute(f"UPDATE {table} SET name = 'low seq, later' WHERE id = 7")
        conn.commit()
    finally:
        conn.close()
        source.execute("SET GLOBAL gtid_strict_mode = ON")


def _updates_of_7(spark: Any, options: dict[str, str]) -> list[tuple[int, str]]:
    """(sequence, name) of row 7's update_after records, in the order the mirror applies."""
    from mariadb_cdc_client.spark.lakehouse import POSITION, in_stream_order

    changes = in_stream_order(spark.read.format("cdc").options(**options).load())
    rows = changes.filter("id = 7 AND event_type = 'update_after'").orderBy(POSITION).collect()
    return [(r["sequence"], r["name"]) for r in rows]


def _run_once(spark: Any, options: dict[str, str], table: str, path: str, checkpoint: str,
              format: str, catalog: str | None) -> int:
    """The mirror with trigger availableNow; the number of batches that read rows."""
    from mariadb_cdc_client.spark.mirror import start

    query = run_to_end(lambda: start(spark, options, table, path, checkpoint,
                                     {"availableNow": True}, format, catalog), 180)
    assert query.exception() is None, query.exception()
    return len([p for p in query.recentProgress if p["numInputRows"]])


def _read_back(format: str, path: str, catalog_uri: str, identifier: tuple[str, str],
               columns: tuple[str, ...]) -> list[list[tuple[Any, ...]]]:
    if format == "delta":
        return [_delta_rows(path, columns)]
    from mariadb_cdc_client.spark.lakehouse import iceberg_catalog

    return list(_iceberg_rows(iceberg_catalog(catalog_uri, path), identifier, columns))


def _commits(format: str, path: str, catalog_uri: str, identifier: tuple[str, str]
             ) -> list[dict[str, str]]:
    """Each commit's app id, batch id and operation(s), oldest first: Delta's commit
    metadata, Iceberg's snapshot summaries (a commit may hold several snapshots, all stamped
    alike)."""
    from mariadb_cdc_client.spark.lakehouse import APP_ID, BATCH_ID, iceberg_catalog

    if format == "delta":
        from deltalake import DeltaTable

        history = reversed(DeltaTable(path).history())
        return [{APP_ID: h[APP_ID], BATCH_ID: h[BATCH_ID], "operation": h["operation"]}
                for h in history]
    table = iceberg_catalog(catalog_uri, path).load_table(identifier)
    stamps: list[dict[str, str]] = []
    for snapshot in table.snapshots():
        assert snapshot.summary is not None
        stamp = {k: snapshot.summary[k] for k in (APP_ID, BATCH_ID)}
        operation = snapshot.summary.operation.value
        if stamps and {k: stamps[-1][k] for k in (APP_ID, BATCH_ID)} == stamp:
            stamps[-1]["operation"] += " " + operation
        else:
            stamps.append({**stamp, "operation": operation})
    return stamps


@pytest.mark.parametrize("format", ["delta", "iceberg"])
@pytest.mark.mariadb
@pytest.mark.spark
async def test_a_lakehouse_table_built_from_the_dump_and_kept_by_merge_equals_the_source(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any, format: str):
    """The dump in bulk, then inserts, updates (a key several times in one batch, in a domain
    whose numbers go down), deletes and a primary-key change, each batch one commit; then a
    new column, read by the restarted query and added to the table."""
    t, name = f"`{source.database}`.lake", f"{source.database}.lake"
    _create(source, t, range(1, 31))
    await cdc.caught_up(source)
    await _take_dump(cdc, source, "lake")
    source.execute(f"UPDATE {t} SET price = -0.0000000001, ubig = 0 WHERE id % 3 = 0",
                   f"DELETE FROM {t} WHERE id > 25",
                   f"INSERT INTO {t} (id, name, ts) VALUES (100, 'new', NULL)",
                   f"UPDATE {t} SET id = 101 WHERE id = 1",  # a key change
                   f"UPDATE {t} SET f = f + 1 WHERE id = 2",  # one key, three times
                   f"UPDATE {t} SET f = f + 1 WHERE id = 2",
                   f"UPDATE {t} SET name = 'twice' WHERE id = 2")
    await asyncio.to_thread(_write_out_of_order, source, t)
    await cdc.caught_up(source)
    (high, _), (low, last) = await asyncio.to_thread(
        _updates_of_7, spark, _options(cdc, f"{source.database}.lake"))
    assert low < high and last == "low seq, later"  # (domain, sequence) would pick "high"
    path, checkpoint = str(tmp_path / "lake"), str(tmp_path / "checkpoint")
    catalog = "sqlite:///" + os.path.join(path, "catalog.db")
    identifier = (source.database, "lake")
    options = _options(cdc, "unused", startingPosition="dump")

    batches = await asyncio.to_thread(_run_once, spark, options, name, path, checkpoint,
                                      format, catalog)
    assert batches == 2  # the dump, then the changes after it
    expected = _expected(source, t, COLUMNS)
    assert [r[3] for r in expected if r[0] == 7] == ["low seq, later"]
    for read in await asyncio.to_thread(_read_back, format, path, catalog, identifier, COLUMNS):
        assert read == expected

    source.execute(f"ALTER TABLE {t} ADD COLUMN note VARCHAR(10)",
                   f"UPDATE {t} SET note = 'noted' WHERE id < 6",
                   f"INSERT INTO {t} (id, note) VALUES (200, 'added')",
                   f"DELETE FROM {t} WHERE id = 3")
    await cdc.caught_up(source)
    assert await asyncio.to_thread(_run_once, spark, options, name, path, checkpoint,
                                   format, catalog) == 1  # restarted from its checkpoint
    expected = _expected(source, t, (*COLUMNS, "note"))
    for read in await asyncio.to_thread(_read_back, format, path, catalog, identifier,
                                        (*COLUMNS, "note")):
        assert read == expected

    commits = await asyncio.to_thread(_commits, format, path, catalog, identifier)
    assert [c["mariadb-cdc.batch-id"] for c in commits] == ["0", "1", "2"]  # one each
    assert len({c["mariadb-cdc.app-id"] for c in commits}) == 1  # the query's, kept
    # the dump into the new table: a plain append
    assert commits[0]["operation"] == ("WRITE" if format == "delta" else "append")
    if format == "delta":
        assert [c["operation"] for c in commits[1:]] == ["MERGE", "MERGE"]


def _version(format: str, sink: Any) -> Any:
    """What a commit moves on: Delta's table version, Iceberg's metadata file."""
    if format == "delta":
        from deltalake import DeltaTable

        return DeltaTable(sink.path).version()
    return sink.catalog.load_table(sink.identifier).metadata_location


def _replay(spark: Any, format: str, options: dict[str, str], tmp_path: Any,
            database: str) -> list[tuple[str, Any, bool]]:
    """Batches 7, 7 again (Spark's replay after a crash), 6, then 8, then 7 of another query
    (a new checkpoint); each with the version after it and whether it was applied."""
    from mariadb_cdc_client.spark.lakehouse import Batches, apply_batch

    batches = Batches(spark, format, str(tmp_path / "lake"), str(tmp_path / "checkpoint"),
                      (database, "again"), ["id"])
    sink: Any = batches.make_sink("replay test")
    changes = spark.read.format("cdc").options(**options).load()
    steps = []
    for batch_id in (7, 7, 6, 8):
        applied = apply_batch(sink, changes, batch_id, ["id"])
        steps.append((str(batch_id), _version(format, sink), applied))
    other: Any = batches.make_sink("another query")
    applied = apply_batch(other, changes, 7, ["id"])
    steps.append(("7", _version(format, sink), applied))
    return steps


@pytest.mark.parametrize("format", ["delta", "iceberg"])
@pytest.mark.mariadb
@pytest.mark.spark
async def test_a_batch_run_again_after_a_crash_is_not_committed_twice(
        cdc: RunningService, source: Source, spark: Any, tmp_path: Any, format: str):
    t = f"`{source.database}`.again"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {t} VALUES (1, 1), (2, 2)", f"UPDATE {t} SET v = v + 10")
    await cdc.caught_up(source)
    options = _options(cdc, f"{source.database}.again", startingPosition="earliest")

    steps = await asyncio.to_thread(_replay, spark, format, options, tmp_path,
                                    source.database)
    (_, first, applied), *again, (_, last, applied_last), (_, other, applied_other) = steps
    assert applied and applied_last
    assert again == [("7", first, False), ("6", first, False)]  # recognised: no commit
    assert last != first
    assert applied_other and other != last  # another query's batches are its own


def _changes(batch_id: int, **columns: Any) -> Any:
    """A batch of insert records as the source gives them (metadata, then the columns)."""
    import pyarrow as pa

    n = len(next(iter(columns.values())))
    return pa.table({"domain": [0] * n, "event_type": ["insert"] * n,
                     "_position": list(range(n)), "_version": [batch_id + 1] * n, **columns})


def _sink(format: str, tmp_path: Any) -> Any:
    from mariadb_cdc_client.spark.lakehouse import DeltaSink, IcebergSink, iceberg_catalog

    if format == "delta":
        return DeltaSink(str(tmp_path / "lake"), ["id"], "schema test")
    catalog = iceberg_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path))
    return IcebergSink(catalog, ("db", "t"), ["id"], "schema test")


def _types_and_rows(format: str, sink: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
    if format == "delta":
        import polars as pl

        frame = pl.read_delta(sink.path).sort("id")
        return {n: str(t) for n, t in frame.schema.items()}, frame.to_dicts()
    table = sink.catalog.load_table(sink.identifier)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    return types, table.scan().to_arrow().sort_by("id").to_pylist()


@pytest.mark.parametrize("format", ["delta", "iceberg"])
def test_a_widened_column_is_widened_and_a_column_no_longer_read_is_null_from_then_on(
        tmp_path: Any, format: str):
    """What a query restarted after schema changes brings: ``id`` INT then BIGINT (a value
    only BIGINT holds), ``f`` FLOAT then DOUBLE, and no ``gone`` any more (the versions that
    had it were removed by retention)."""
    import pyarrow as pa

    from mariadb_cdc_client.spark.lakehouse import last_changes

    sink = _sink(format, tmp_path)
    first = _changes(0, id=pa.array([1, 2], pa.int32()), f=pa.array([0.5, 1.5], pa.float32()),
                     gone=["kept", "kept"])
    sink.write(last_changes(first, ["id"]), 0)
    later = _changes(1, id=pa.array([2, 3_000_000_000], pa.int64()),
                     f=pa.array([0.1, 0.2], pa.float64()))
    sink.write(last_changes(later, ["id"]), 1)

    types, rows = _types_and_rows(format, sink)
    if format == "delta":
        assert (types["id"], types["f"], types["gone"]) == ("Int64", "Float64", "String")
    else:
        assert (types["id"], types["f"], types["gone"]) == ("long", "double", "string")
    assert [(r["id"], r["f"], r["gone"]) for r in rows] == [
        (1, 0.5, "kept"), (2, 0.1, None), (3_000_000_000, 0.2, None)]
    assert sink.applied() == 1
