"""The ``cdc`` Spark data source against the real service, MariaDB and local Spark: batch and
streaming reads, restarts from a checkpoint, several tables, dumps, and the Parquet mirror."""

from __future__ import annotations

import asyncio
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER

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
        "domain": "int", "server_id": "bigint", "sequence": "bigint", "event_number": "int",
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
