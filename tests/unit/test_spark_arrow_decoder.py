"""The compiled Avro-to-Arrow decoder (client/spark/_avroarrow.pyx) against the Python path it
replaces (cavro, then pa.array per column): the same blocks must give equal record batches, or
the same error. The table has a column of every type the store writes (its schema comes from
the store's own type mapping), edge values, NULLs and a few hundred random rows, in every
block codec; then the query types wider than a version's, trims, zero dates, TIME text, and
the data the compiled decoder must hand back to Python (invalid UTF-8, out-of-range values,
broken framing). Pure functions over bytes: no service or Spark session needed."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import fastavro
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T
from mariadb_cdc_client import arrow as core
from mariadb_cdc_client.arrow import ZeroDateError
from mariadb_cdc_client.format.avro import (
    SYNC_SIZE,
    block_at,
    write_varint,
)
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.ranges import Blocks, Trim
from mariadb_cdc_client.spark import arrow
from mariadb_cdc_client.spark.types import table_schema
from tests.avro_samples import (
    AVSC,
    CODECS,
    DAYS,
)
from tests.avro_samples import avsc_of as _avsc
from tests.avro_samples import decimal as _decimal
from tests.avro_samples import float32 as _float32
from tests.avro_samples import metadata as _metadata
from tests.avro_samples import sample_records as _records
from tests.helpers import stored_blocks

# the module itself, whatever CDC_PURE_PYTHON says: these tests compare both paths
_avroarrow = compiled_module("mariadb_cdc_client.spark._avroarrow", unless_pure_python=False)

def _blocks(avsc: dict[str, Any], records: list[dict[str, Any]], codec: str = "null",
            sync_interval: int = 4000) -> tuple[Any, Blocks]:
    """``records`` written under the plain schema (the encoding is the stored one), in
    blocks of about ``sync_interval`` bytes, compressed the way the store does."""
    plain_schema = fastavro.parse_schema(_ints_as_longs(core.plain_reader_schema(avsc)))
    return stored_blocks(plain_schema, records, codec, sync_interval)


def _ints_as_longs(schema: Any) -> Any:
    """The same encoding (an Avro int is a long's varint), so that values beyond 32 bits
    can be written where the store never would."""
    if schema == "int":
        return "long"
    if isinstance(schema, list):
        return [_ints_as_longs(branch) for branch in schema]
    if isinstance(schema, dict) and schema.get("type") == "record":
        return {**schema, "fields": [{**f, "type": _ints_as_longs(f["type"])}
                                     for f in schema["fields"]]}
    if isinstance(schema, dict):
        return {**schema, "type": _ints_as_longs(schema["type"])}
    return schema


def _python_fell_back(container: bytes) -> core.Records:
    raise AssertionError("the compiled decoder handed this chunk to the Python path")


def _make(schema: Any, avsc: dict[str, Any], header: Any, blocks: Blocks, trim: Trim,
          zero_dates: str, compiled: bool, fallback: bool) -> pa.RecordBatch | None:
    """One batch by the compiled decoder (``fallback``: it may hand the chunk to Python)
    or by the Python path alone."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core, "_avroarrow", _avroarrow if compiled else None)
        if compiled and not fallback:
            patch.setattr(core, "decode", _python_fell_back)
        maker = arrow.BatchMaker(schema, avsc, header, zero_dates)
        assert (maker._compiled is not None) == compiled
        return maker(blocks, trim)


def _both(avsc: dict[str, Any], records: list[dict[str, Any]], *, schema: Any = None,
          codec: str = "null", trim: Trim | None = None, zero_dates: str = "null",
          fallback: bool = False) -> tuple[Any, Any]:
    """What each path makes of the same blocks: a batch (or None), or the error raised."""
    header, blocks = _blocks(avsc, records, codec)
    schema = schema or table_schema([avsc])
    trim = trim or Trim()
    compiled, python = (_outcome(lambda c=c: _make(schema, avsc, header, blocks, trim,
                                                   zero_dates, c, fallback))
                        for c in (True, False))
    return compiled, python


def _outcome(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - both paths must raise the same
        return (type(exc), str(exc))


def _assert_equal(compiled: Any, python: Any) -> None:
    if isinstance(python, pa.RecordBatch):
        assert isinstance(compiled, pa.RecordBatch), compiled
        assert compiled.schema == python.schema
        for name in python.schema.names:
            assert compiled.column(name).equals(python.column(name)), name
        assert compiled.equals(python)
    else:
        assert compiled == python


@pytest.fixture(autouse=True)
def _built() -> None:
    assert _avroarrow is not None, "the C extension was not built (is a C compiler missing?)"


@pytest.mark.parametrize("codec", CODECS)
def test_every_stored_type_decodes_to_the_same_batch(codec: str) -> None:
    records = _records()
    compiled, python = _both(AVSC, records, codec=codec)
    _assert_equal(compiled, python)
    assert python.num_rows == len(records)
    assert python.column("n").null_count == len(records)
    assert python.column("dt").null_count > python.column("i").null_count  # zero dates


def test_records_split_into_blocks_of_one_decode_the_same() -> None:
    header, blocks = _blocks(AVSC, _records(50), sync_interval=1)
    schema = table_schema([AVSC])
    compiled, python = (_make(schema, AVSC, header, blocks, Trim(), "null", c, False)
                        for c in (True, False))
    _assert_equal(compiled, python)


def test_a_query_type_wider_than_the_versions_is_filled_the_same_way() -> None:
    """INT read as BIGINT, FLOAT as DOUBLE, DECIMAL(10,2) as DECIMAL(12,4), INT as a decimal,
    a column the version lacks; then the other version into the same schema."""
    old = _avsc([ColumnDef("id", T.LONG), ColumnDef("f", T.FLOAT),
                 ColumnDef("d", T.NEWDECIMAL, meta=(10 << 8) | 2), ColumnDef("x", T.LONG),
                 ColumnDef("gone", T.VARCHAR, meta=10, charset="utf-8")])
    new = _avsc([ColumnDef("id", T.LONGLONG), ColumnDef("f", T.DOUBLE),
                 ColumnDef("d", T.NEWDECIMAL, meta=(12 << 8) | 4),
                 ColumnDef("x", T.NEWDECIMAL, meta=(10 << 8) | 2),
                 ColumnDef("added", T.DATE)], version=2)
    schema = table_schema([old, new])
    assert {f.name: f.dataType.simpleString() for f in schema.fields[8:]} == {
        "id": "bigint", "f": "double", "d": "decimal(12,4)", "x": "decimal(21,2)",
        "gone": "string", "added": "date"}
    rng = random.Random(7)
    old_rows = [{**_metadata(i), "id": rng.randint(-2**31, 2**31 - 1), "f": _float32(rng),
                 "d": _decimal(10)(rng), "x": rng.randint(-2**31, 2**31 - 1),
                 "gone": None if i % 3 else b"g"} for i in range(200)]
    new_rows = [{**_metadata(i), "id": rng.randint(-2**63, 2**63 - 1),
                 "f": rng.uniform(-1e300, 1e300), "d": _decimal(12)(rng),
                 "x": _decimal(10)(rng), "added": rng.randint(*DAYS)} for i in range(200)]
    for avsc, rows in ((old, old_rows), (new, new_rows)):
        compiled, python = _both(avsc, rows, schema=schema)
        _assert_equal(compiled, python)
    assert python.column("gone").null_count == 200


@pytest.mark.parametrize("trim", [
    Trim(skip=(0, None, 12, 2)), Trim(stop=(0, None, 30, 1)), Trim(skip=(0, 2, 11, 3)),
    Trim(skip=(0, None, 10, 4), stop=(0, 1, 99, 0)), Trim(skip=(1, None, 10, 9)),
    Trim(stop=(0, None, 10, 0))])
def test_trims_drop_the_same_records(trim: Trim) -> None:
    """Records of four events per transaction, cut at either end, by GTID with or without its
    server id; nothing dropped; everything dropped (then no batch at all)."""
    records = [{**r, "domain": 0} for r in _records(120)]
    _assert_equal(*_both(AVSC, records, trim=trim))


def test_everything_trimmed_gives_no_batch_on_both_paths() -> None:
    records = _records(40)
    trim = Trim(stop=(0, None, records[0]["sequence"], 0))
    records = [{**r, "sequence": records[0]["sequence"]} for r in records]
    assert _both(AVSC, records, trim=trim) == (None, None)


def _valid_dates() -> list[dict[str, Any]]:
    return [{**r, "dt": 19_000, "dtm": 0, "ts": None} for r in _records(30)]


def test_zero_dates_are_refused_the_same_way() -> None:
    records = _valid_dates()
    records[7] = {**records[7], "dtm": b"0000-00-00 00:00:00"}
    compiled, python = _both(AVSC, records, zero_dates="error", fallback=True)
    assert python[0] is ZeroDateError
    assert "'0000-00-00 00:00:00' is not a valid date" in python[1]
    assert compiled == python


def test_with_zero_dates_refused_the_compiled_decoder_still_takes_chunks_without_any() -> None:
    _assert_equal(*_both(AVSC, _valid_dates(), zero_dates="error"))


@pytest.mark.parametrize("text", [b" 1:00:00", b"--1:00:00", b"1:00:00.", b"1:00",
                                  b"1:100:00", b"+1:00:00", b"1:00:00.1234567", b"\xff"])
def test_time_text_the_compiled_decoder_does_not_read_is_read_by_python(text: bytes) -> None:
    """parse_time reads (or rejects) TIME text beyond MariaDB's own forms: the compiled
    decoder hands those chunks back, so the outcome is parse_time's."""
    records = _records(30)
    records[3] = {**records[3], "tm": text}
    _assert_equal(*_both(AVSC, records, fallback=True))


@pytest.mark.parametrize("column", ["vc", "j", "u", "dt"])
@pytest.mark.parametrize("invalid", [
    b"\xff", b"a\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"ok \xf0\x9f\x8e",
    b"a" * 40 + b"\xff", ("é" * 9).encode() + b"\xed\xa0\x80" + b"b" * 20,
    b"x" * 17 + "€".encode()[:2]])
def test_invalid_utf8_is_refused_the_same_way(column: str, invalid: bytes) -> None:
    """Invalid text in a string column (Arrow's UTF-8 check) or in a zero date's branch
    (Python's decode): the compiled decoder hands the chunk back, Python raises."""
    records = _records(30)
    records[5] = {**records[5], column: invalid}
    compiled, python = _both(AVSC, records, fallback=True)
    assert isinstance(python, tuple), "the Python path took invalid UTF-8"
    assert compiled == python
    header, blocks = _blocks(AVSC, records)
    decoder = core.compiled_decoder(AVSC, _targets(AVSC), "null")
    assert decoder.decode(blocks.data, header.sync) is None


def _targets(avsc: dict[str, Any]) -> dict[str, pa.DataType]:
    """The Arrow types of a Spark read of ``avsc`` alone, by column."""
    return {a.name: a.type for a in to_arrow_schema(table_schema([avsc]), timezone="UTC")}


@pytest.mark.parametrize(("column", "value"), [
    ("d38", (2**127).to_bytes(17, "big", signed=True)),   # beyond the decimal128
    ("d38", (-(2**127)).to_bytes(17, "big", signed=True)),  # the int128's least: fits
    ("d2", (10**30).to_bytes(13, "big", signed=True)),    # beyond its precision: both keep it
    ("d2", b"\x00" * 20 + b"\x01"),                        # sign extension past 16 bytes
    ("d2", b""),                                            # int.from_bytes(b""): 0
    ("biu", b"\xff" * 9),                                   # -1 in nine bytes
    ("i", 2**31), ("ti", -(2**31) - 1), ("dt", 2**40),      # an Avro int beyond 32 bits
])
def test_values_beyond_their_columns_range_give_the_same_outcome(column: str, value: Any) -> None:
    records = _records(30)
    records[2] = {**records[2], column: value}
    _assert_equal(*_both(AVSC, records, fallback=True))


def test_long_varints_at_the_end_of_a_block_decode_the_same() -> None:
    """Blocks of one record that end in a BIGINT: its varint of up to ten bytes is read
    byte by byte there, with the bounds checked (elsewhere ten bytes at once)."""
    avsc = _avsc([ColumnDef("id", T.LONG), ColumnDef("bi", T.LONGLONG)])
    values = [0, -1, 63, -64, 64, 2**31, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63)]
    records = [{**_metadata(i), "id": i, "bi": value} for i, value in enumerate(values)]
    header, blocks = _blocks(avsc, records, sync_interval=1)
    schema = table_schema([avsc])
    compiled, python = (_make(schema, avsc, header, blocks, Trim(), "null", c, False)
                        for c in (True, False))
    _assert_equal(compiled, python)
    assert python.column("bi").to_pylist() == values


def test_a_varint_cut_off_at_the_end_of_a_block_is_left_to_the_python_path() -> None:
    avsc = _avsc([ColumnDef("bi", T.LONGLONG)])
    header, blocks = _blocks(avsc, [{**_metadata(0), "bi": 2**62}])
    count, start, end = block_at(blocks.data, 0, header.sync)
    records = blocks.data[start:end - SYNC_SIZE - 1]  # the last byte of the varint is gone
    cut = write_varint(count) + write_varint(len(records)) + records + header.sync
    decoder = core.compiled_decoder(avsc, _targets(avsc), "null")
    assert decoder.decode(blocks.data, header.sync) is not None
    assert decoder.decode(cut, header.sync) is None


def test_broken_framing_is_left_to_the_python_path() -> None:
    header, blocks = _blocks(AVSC, _records(30))
    decoder = core.compiled_decoder(AVSC, _targets(AVSC), "null")
    assert decoder.decode(blocks.data, header.sync) is not None
    wrong_sync = bytes(b ^ 1 for b in header.sync)
    assert decoder.decode(blocks.data, wrong_sync) is None
    assert decoder.decode(blocks.data[:-1], header.sync) is None
    count, start, end = block_at(blocks.data, 0, header.sync)
    longer = write_varint(count) + write_varint(end - SYNC_SIZE - start + 1) + \
        blocks.data[start:end - SYNC_SIZE] + b"\x00" + header.sync  # a byte after the records
    assert decoder.decode(longer, header.sync) is None


def test_a_version_of_a_shape_the_compiled_decoder_does_not_take_stays_on_python() -> None:
    odd = {**AVSC, "fields": [*AVSC["fields"][:6], {"name": "v", "type": ["int", "null"]}]}
    assert core.compiled_decoder(odd, _targets(odd), "null") is None
    fixed = {**AVSC, "fields": [*AVSC["fields"][:6], {"name": "v", "type": ["null", {
        "type": "fixed", "name": "d", "size": 8, "logicalType": "decimal", "precision": 10,
        "scale": 2}]}]}
    assert core.compiled_decoder(fixed, _targets(fixed), "null") is None


@pytest.mark.parametrize(("environ", "path"), [({"CDC_PURE_PYTHON": "1"}, "Python (cavro"),
                                               ({}, "compiled")])
def test_cdc_pure_python_keeps_executors_on_the_python_path(environ: dict[str, str],
                                                            path: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CDC_PURE_PYTHON"} | environ
    said = subprocess.run([sys.executable, "-c", "from mariadb_cdc_client import arrow; "
                           "print(arrow.decoder_path())"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert said.startswith(path)
