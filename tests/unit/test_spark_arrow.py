"""Stored Avro blocks into Arrow batches (client/spark/arrow.py), with each decoder and every
block codec the store writes. Pure functions over bytes: no service or Spark session needed;
the Spark tests run the same code against the real service."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("cavro")

import fastavro

from mariadb_cdc_client import arrow as core
from mariadb_cdc_client.arrow import ZeroDateError
from mariadb_cdc_client.ranges import Blocks, Trim
from mariadb_cdc_client.spark import arrow
from mariadb_cdc_client.spark.types import table_schema
from tests.helpers import stored_blocks

AVSC: dict[str, Any] = {
    "namespace": "MaxScaleChangeDataSchema.avro", "type": "record", "name": "ChangeRecord",
    "table": "t", "database": "db", "version": 3, "gtid": "0-1-1",
    "fields": [
        {"name": "domain", "type": "int"}, {"name": "server_id", "type": "int"},
        {"name": "sequence", "type": "long"}, {"name": "event_number", "type": "int"},
        {"name": "timestamp", "type": "long"},
        {"name": "event_type", "type": {"type": "enum", "name": "EVENT_TYPES", "symbols": [
            "insert", "update_before", "update_after", "delete"]}},
        {"name": "id", "type": ["null", "int"]},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 10, "scale": 2}]},
        {"name": "wide", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                           "precision": 60, "scale": 3}]},
        {"name": "name", "type": ["null", "string"]},
        {"name": "key", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
        {"name": "d", "type": ["null", {"type": "int", "logicalType": "date"}, "string"]},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"},
                                "string"]},
        {"name": "tm", "type": ["null", {"type": "long", "logicalType": "time-micros"},
                                "string"]},
        {"name": "raw", "type": ["null", "bytes"]},
    ]}
KEY = uuid.UUID("12345678-1234-5678-1234-567812345678")
RECORDS = [
    {"domain": 0, "server_id": 1, "sequence": 7, "event_number": 1, "timestamp": 100,
     "event_type": "insert", "id": 1, "price": Decimal("-12345678.91"),
     "wide": Decimal("123456789012345678901234567890123456789012.345"), "name": "ä€",
     "key": str(KEY), "d": dt.date(2024, 2, 29),
     "at": dt.datetime(2024, 3, 1, 0, 0, 1, 500000, tzinfo=dt.UTC),
     "tm": 3_020_399_000_000, "raw": b"\x00\xff"},
    {"domain": 0, "server_id": 1, "sequence": 7, "event_number": 2, "timestamp": 100,
     "event_type": "delete", "id": 2, "price": None, "wide": None, "name": None, "key": None,
     "d": ("string", "0000-00-00"), "at": None, "tm": ("string", "-838:59:59"), "raw": None},
]


def _blocks(codec: str) -> tuple[Any, Blocks]:
    """RECORDS in blocks of one record each, compressed the way the store does."""
    return stored_blocks(fastavro.parse_schema(AVSC), RECORDS, codec, sync_interval=1)


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy", "zstandard"])
@pytest.mark.parametrize("decoder", ["_decode_cavro", "_decode_fastavro"])
def test_blocks_become_a_batch_of_the_spark_schema(codec: str, decoder: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "decode", getattr(core, decoder))
    header, blocks = _blocks(codec)
    schema = table_schema([AVSC])
    batch = arrow.BatchMaker(schema, AVSC, header, "null")(blocks, Trim())
    assert batch is not None
    first, second = batch.to_pylist()
    assert (first["_table"], first["_version"], first["event_type"]) == ("db.t", 3, "insert")
    assert (first["price"], first["wide"]) == \
        (Decimal("-12345678.91"), "123456789012345678901234567890123456789012.345")
    assert (first["name"], first["key"], first["raw"]) == ("ä€", str(KEY), b"\x00\xff")
    assert first["d"] == dt.date(2024, 2, 29)
    assert first["at"] == dt.datetime(2024, 3, 1, 0, 0, 1, 500000, tzinfo=dt.UTC)
    assert first["tm"] == dt.timedelta(hours=838, minutes=59, seconds=59)
    assert second["tm"] == -dt.timedelta(hours=838, minutes=59, seconds=59)  # stored as text
    assert (second["d"], second["price"], second["name"]) == (None, None, None)  # zero date


def test_a_trim_drops_the_records_outside_the_range_and_zero_dates_can_fail() -> None:
    header, blocks = _blocks("null")
    maker = arrow.BatchMaker(table_schema([AVSC]), AVSC, header, "null")
    batch = maker(blocks, Trim(skip=(0, None, 7, 1)))
    assert batch is not None and batch.column("event_number").to_pylist() == [2]
    assert maker(blocks, Trim(stop=(0, None, 7, 0))) is None
    strict = arrow.BatchMaker(table_schema([AVSC]), AVSC, header, "error")
    with pytest.raises(ZeroDateError, match="'0000-00-00' is not a valid date"):
        strict(blocks, Trim())


@pytest.mark.parametrize("decoder", ["_decode_cavro", "_decode_fastavro"])
def test_the_gtid_numbers_past_the_signed_range_come_out_unsigned(
        decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MariaDB's domain and server_id are unsigned 32-bit, the sequence 64-bit; the store
    keeps them in Avro's signed int and long. A version's own schema (read_arrow) reads them
    as uint32/uint64, Spark's (domain and server_id bigints) as the unsigned number too."""
    monkeypatch.setattr(core, "decode", getattr(core, decoder))
    big = [{**r, "domain": -1, "server_id": -2, "sequence": -3} for r in RECORDS]
    header, blocks = stored_blocks(fastavro.parse_schema(AVSC), big, "null", sync_interval=1)
    natural = core.BatchMaker(core.version_schema(AVSC), AVSC, header, "null")(blocks, Trim())
    assert natural is not None
    assert natural.select(["domain", "server_id", "sequence"]).to_pylist()[0] == {
        "domain": 2**32 - 1, "server_id": 2**32 - 2, "sequence": 2**64 - 3}
    spark = arrow.BatchMaker(table_schema([AVSC]), AVSC, header, "null")(blocks, Trim())
    assert spark is not None
    assert spark.column("server_id").to_pylist() == [2**32 - 2, 2**32 - 2]
    assert spark.column("domain").to_pylist() == [2**32 - 1, 2**32 - 1]
