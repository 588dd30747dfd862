"""Every type of the type table (``mariadb_cdc_client.format.coltypes``) through every codec.

Each SQL type of the table has a sample here: its column as the table map describes it, one
value's bytes as the binlog holds them, and the value they stand for. The sample walks the
whole way a value goes: the table map's metadata, the binlog row decoder (generated Python and
``_rowdecode.pyx``), the Avro mapping, the Avro writers (``encoder.py`` and
``_transcode.pyx``), the JSON renderers (generated Python and ``_jsonlines.pyx``), the databus
rows (Python and ``_databus.pyx``), the client's record decoders (fastavro and
``_records.pyx``), the dump rows (Python and ``_dumprows.pyx``), and the Spark and Arrow
types and batches (Python and ``_avroarrow.pyx``). Each codec must take the type, give what
the table says (kind, real_type, Python value, JSON value, Spark and Arrow type), and its C
path must give what its Python path gives.

A type added to the table without a sample here fails the first test; one a codec does not
know fails that codec's test with the type's name (``CONTRIBUTING.md``, "Adding a column
type"). The random comparisons of each C path with its Python path live in their own tests
(test_rowdecode.py, test_transcode_rules.py, test_records_decoder.py, ...); this one is the
inventory.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import io
import json
import math
import struct
from decimal import Decimal
from typing import Any, NamedTuple

import fastavro
import pytest

from cdcserver.core.changes import ColumnDef, EventType, TableLayout
from cdcserver.core.errors import UndecodableEvent
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.messages import databus
from cdcserver.protocol import render
from cdcserver.replication import rowcodec, tablemap, values
from cdcserver.replication.cursor import Cursor
from cdcserver.schema.avrotypes import map_column
from cdcserver.store import transcoder
from cdcserver.store.encoder import compile_encoder, record_head, record_tail
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client import stream
from mariadb_cdc_client.format import dump
from mariadb_cdc_client.format.avro import container_header, parse_header, write_varint
from mariadb_cdc_client.format.coltypes import BINLOG_TYPES, BY_CODE, KINDS, SqlType
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.gtid import unsigned_metadata
from mariadb_cdc_client.format.schema import (
    METADATA_FIELDS,
    Field,
    Kind,
    field_from_avro,
    from_avro_value,
)
from tests.helpers import binary_decimal


def _compiled(name: str) -> Any:
    """The extension itself, whatever CDC_PURE_PYTHON says: this test compares both paths."""
    return compiled_module(name, unless_pure_python=False)


_ROWDECODE = _compiled("cdcserver.replication._rowdecode")
_JSONLINES = _compiled("cdcserver.protocol._jsonlines")
_DATABUS = _compiled("cdcserver.messages._databus")
_RECORDS = _compiled("mariadb_cdc_client.format._records")
_DUMPROWS = _compiled("mariadb_cdc_client.format._dumprows")


def _string_meta(max_length: int) -> int:
    """A CHAR/BINARY column's table-map metadata for ``max_length`` bytes."""
    return ((0xFE ^ ((max_length & 0x300) >> 4)) << 8) | (max_length & 0xFF)


def _datetime2(year: int, month: int, day: int, hour: int, minute: int, second: int) -> bytes:
    packed = (((year * 13 + month) << 5 | day) << 17 | hour << 12 | minute << 6 | second)
    return (packed + 0x8000000000).to_bytes(5, "big")


class Sample(NamedTuple):
    column: ColumnDef  # named "c", nullable
    image: bytes  # the value's bytes in a row image
    value: Any  # what the binlog decoder makes of them


_UTC = dt.UTC
_MOMENT = dt.datetime(2024, 2, 29, 13, 14, 15)
_STAMP = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=_UTC)


def _col(t: T, meta: int = 0, **kw: Any) -> ColumnDef:
    return ColumnDef("c", t, meta, **kw)


def _text(t: T, meta: int, prefix: int, data: bytes, **kw: Any) -> tuple[ColumnDef, bytes]:
    return _col(t, meta, **kw), len(data).to_bytes(prefix, "little") + data


def _sample(column_and_image: tuple[ColumnDef, bytes], value: Any) -> Sample:
    return Sample(*column_and_image, value)


def _blobs(t: T, meta: int, blob: str, text: str) -> dict[tuple[str, str], Sample]:
    return {(t.name, blob): _sample(_text(t, meta, meta, b"\x00\xff"), b"\x00\xff"),
            (t.name, text): _sample(_text(t, meta, meta, "é".encode(), charset="utf-8"), "é")}


# (binlog type, SQL type) as the table names them -> the sample
SAMPLES: dict[tuple[str, str], Sample] = {
    ("TINY", "TINYINT"): Sample(_col(T.TINY), b"\xfe", -2),
    ("TINY", "TINYINT UNSIGNED"): Sample(_col(T.TINY, unsigned=True), b"\xfe", 254),
    ("SHORT", "SMALLINT"): Sample(_col(T.SHORT), struct.pack("<h", -300), -300),
    ("SHORT", "SMALLINT UNSIGNED"): Sample(_col(T.SHORT, unsigned=True), b"\xff\xff", 65535),
    ("INT24", "MEDIUMINT"): Sample(_col(T.INT24), b"\xfb\xff\xff", -5),
    ("INT24", "MEDIUMINT UNSIGNED"): Sample(_col(T.INT24, unsigned=True), b"\xff\xff\xff",
                                            2**24 - 1),
    ("LONG", "INT"): Sample(_col(T.LONG), struct.pack("<i", -7), -7),
    ("LONG", "INT UNSIGNED"): Sample(_col(T.LONG, unsigned=True), struct.pack("<I", 2**32 - 1),
                                     2**32 - 1),
    ("LONGLONG", "BIGINT"): Sample(_col(T.LONGLONG), struct.pack("<q", -2**40), -2**40),
    ("LONGLONG", "BIGINT UNSIGNED"): Sample(_col(T.LONGLONG, unsigned=True), b"\xff" * 8,
                                            2**64 - 1),
    ("FLOAT", "FLOAT"): Sample(_col(T.FLOAT, 4), struct.pack("<f", 1.5), 1.5),
    ("DOUBLE", "DOUBLE"): Sample(_col(T.DOUBLE, 8), struct.pack("<d", 2.25), 2.25),
    ("NULL", "NULL"): Sample(_col(T.NULL), b"", None),
    ("TIMESTAMP", "TIMESTAMP (old format)"): Sample(
        _col(T.TIMESTAMP), struct.pack("<I", 1_700_000_000), _STAMP),
    ("DATE", "DATE"): Sample(_col(T.DATE), (2024 << 9 | 2 << 5 | 29).to_bytes(3, "little"),
                             dt.date(2024, 2, 29)),
    ("TIME", "TIME (old format)"): Sample(
        _col(T.TIME), (-123456).to_bytes(3, "little", signed=True),
        -dt.timedelta(hours=12, minutes=34, seconds=56)),
    ("DATETIME", "DATETIME (old format)"): Sample(
        _col(T.DATETIME), struct.pack("<Q", 20240229131415), _MOMENT),
    ("YEAR", "YEAR"): Sample(_col(T.YEAR), bytes([124]), 2024),
    ("VARCHAR", "VARCHAR"): _sample(_text(T.VARCHAR, 40, 1, "café".encode(), charset="utf-8"),
                                    "café"),
    ("VARCHAR", "VARBINARY"): _sample(_text(T.VARCHAR, 400, 2, b"\x00\xff"), b"\x00\xff"),
    ("VAR_STRING", "VARCHAR"): _sample(_text(T.VAR_STRING, 40, 1, b"ab", charset="utf-8"),
                                       "ab"),
    ("VAR_STRING", "VARBINARY"): _sample(_text(T.VAR_STRING, 40, 1, b"\x01"), b"\x01"),
    ("BIT", "BIT(1)"): Sample(_col(T.BIT, 1), b"\x01", 1),
    ("BIT", "BIT(2) to BIT(63)"): Sample(_col(T.BIT, 7), b"\x55", 0x55),
    ("BIT", "BIT(64)"): Sample(_col(T.BIT, 8 << 8), b"\xff" * 8, 2**64 - 1),
    ("TIMESTAMP2", "TIMESTAMP"): Sample(
        _col(T.TIMESTAMP2, 3), (1_700_000_000).to_bytes(4, "big") + (4560).to_bytes(2, "big"),
        _STAMP.replace(microsecond=456_000)),
    ("DATETIME2", "DATETIME"): Sample(_col(T.DATETIME2), _datetime2(2024, 2, 29, 13, 14, 15),
                                      _MOMENT),
    ("TIME2", "TIME"): Sample(_col(T.TIME2), (0x800000 + (12 << 12 | 34 << 6 | 56)).to_bytes(
        3, "big"), dt.timedelta(hours=12, minutes=34, seconds=56)),
    ("JSON", "JSON (MySQL)"): _sample(_text(T.JSON, 4, 4, b"\x0c\x02hi", charset="utf-8"),
                                      '"hi"'),
    ("NEWDECIMAL", "DECIMAL"): Sample(
        _col(T.NEWDECIMAL, 10 << 8 | 2), binary_decimal(values.DecimalFormat(10, 2), -12345),
        Decimal("-123.45")),
    ("ENUM", "ENUM"): Sample(_col(T.ENUM, 1, charset="utf-8", enum_values=("a", "b")),
                             b"\x02", "b"),
    ("SET", "SET"): Sample(_col(T.SET, 1, charset="utf-8", set_values=("x", "y")), b"\x03",
                           "x,y"),
    **_blobs(T.TINY_BLOB, 1, "TINYBLOB", "TINYTEXT"),
    **_blobs(T.MEDIUM_BLOB, 3, "MEDIUMBLOB", "MEDIUMTEXT"),
    **_blobs(T.LONG_BLOB, 4, "LONGBLOB", "LONGTEXT"),
    **_blobs(T.BLOB, 2, "BLOB", "TEXT"),
    ("BLOB", "JSON (MariaDB: a LONGTEXT)"): _sample(
        _text(T.BLOB, 4, 4, b'{"a": 1}', charset="utf-8", extended="json"), '{"a": 1}'),
    ("STRING", "CHAR"): _sample(_text(T.STRING, _string_meta(10), 1, b"ab", charset="utf-8"),
                                "ab"),
    ("STRING", "BINARY"): _sample(_text(T.STRING, _string_meta(4), 1, b"ab"), b"ab\0\0"),
    ("STRING", "INET4"): _sample(_text(T.STRING, _string_meta(4), 1, bytes([10, 0, 0, 1]),
                                       extended="inet4"), "10.0.0.1"),
    ("STRING", "INET6"): _sample(_text(T.STRING, _string_meta(16), 1, bytes(15) + b"\x01",
                                       extended="inet6"), "::1"),
    ("STRING", "UUID"): _sample(_text(T.STRING, _string_meta(16), 1, bytes(range(16)),
                                      extended="uuid"), "00010203-0405-0607-0809-0a0b0c0d0e0f"),
    ("GEOMETRY", "GEOMETRY"): _sample(_text(T.GEOMETRY, 4, 4, b"\x01\x02"), b"\x01\x02"),
}

# Where a compiled path hands the type to its Python path on purpose (its module docstring
# says why); any other type it must take.
ROWDECODE_IN_PYTHON = {("TIMESTAMP", "TIMESTAMP (old format)"), ("TIME", "TIME (old format)"),
                       ("DATETIME", "DATETIME (old format)")}
TRANSCODE_IN_PYTHON = ROWDECODE_IN_PYTHON | {
    ("JSON", "JSON (MySQL)"), ("SET", "SET"), ("STRING", "INET4"), ("STRING", "INET6"),
    ("STRING", "UUID"), ("NULL", "NULL")}
ARROW_IN_PYTHON: set[tuple[str, str]] = set()

VARIANTS = [(t.name, s.sql) for t in BINLOG_TYPES for s in t.sql]
IDS = [f"{name}:{sql}" for name, sql in VARIANTS]


def _sql_type(variant: tuple[str, str]) -> SqlType:
    binlog = next(t for t in BINLOG_TYPES if t.name == variant[0])
    return next(s for s in binlog.sql if s.sql == variant[1])


def _typed(value: Any) -> Any:
    """A value with what equality does not compare: its type, a float's sign, a Decimal's
    exponent, a datetime's zone."""
    if isinstance(value, float):
        return float, value.hex() if not math.isnan(value) else "nan"
    if isinstance(value, Decimal):
        return Decimal, value.as_tuple()
    return type(value), value, getattr(value, "tzinfo", None)


# -- the table itself ---------------------------------------------------------------------

def test_the_table_has_every_binlog_type_and_every_sql_type_a_sample():
    assert {(t.code, t.name) for t in BINLOG_TYPES} == {(int(t), t.name) for t in T}
    assert set(SAMPLES) == set(VARIANTS), "a type of the table without a sample here, or back"
    assert set(KINDS) == set(Kind)
    for variant in VARIANTS:
        assert SAMPLES[variant].column.binlog_type == BY_CODE[T[variant[0]]].code


@pytest.mark.parametrize("binlog", [t for t in BINLOG_TYPES if not t.sql], ids=lambda t: t.name)
def test_a_type_with_no_sql_type_is_refused(binlog):
    column = ColumnDef("c", binlog.code)
    with pytest.raises(UndecodableEvent):
        rowcodec.compile_rows_decoder((column,))
    with pytest.raises(ValueError):
        map_column(column)


# -- the binlog -----------------------------------------------------------------------------

def _metadata_bytes(variant: tuple[str, str], meta: int) -> bytes:
    binlog = BY_CODE[T[variant[0]]]
    if binlog.meta_size == 0:
        return b""
    return meta.to_bytes(binlog.meta_size, binlog.meta_order or "little")


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_table_map_reads_the_metadata_the_table_gives(variant):
    column = SAMPLES[variant].column
    metas, types = tablemap._read_metadata(Cursor(_metadata_bytes(variant, column.meta)),
                                           [T(column.binlog_type)])
    assert (metas, types) == ([column.meta], [column.binlog_type])
    binlog = BY_CODE[column.binlog_type]
    assert (T(binlog.code) in tablemap.NUMERIC_TYPES) == binlog.numeric


def _image(sample: Sample) -> bytes:
    return b"\x00" + sample.image  # the NULL bitmap: none


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_binlog_decoders_make_the_value_the_table_says(variant):
    sample, sql = SAMPLES[variant], _sql_type(variant)
    image = _image(sample)
    rows = rowcodec._compile((sample.column,))(image, 0, len(image))
    assert [_typed(v) for v in rows[0]] == [_typed(sample.value)]
    assert isinstance(rows[0][0], sql.value)
    if _ROWDECODE is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rowcodec, "_rowdecode", _ROWDECODE)
        compiled = rowcodec._c_decoder.__wrapped__((sample.column,))
    if variant in ROWDECODE_IN_PYTHON:
        assert compiled is None
        return
    assert compiled is not None, f"{variant}: _rowdecode.pyx does not take it"
    assert [[_typed(v) for v in row] for row in compiled(image, 0, len(image))] == \
        [[_typed(v) for v in row] for row in rows]


# -- Avro -----------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_avro_mapping_is_the_tables(variant):
    sql = _sql_type(variant)
    mapping = map_column(SAMPLES[variant].column)
    assert (mapping.kind, mapping.real_type) == (sql.kind, sql.real_type)
    plain = [{k: v for k, v in b.items() if k not in ("precision", "scale")}
             if isinstance(b, dict) else b for b in mapping.branches]
    assert tuple(plain) == KINDS[sql.kind].avro
    read = field_from_avro({"name": "c", "type": ["null", *mapping.branches]})
    assert read.kind == sql.kind  # what a client's schema reader makes of it


class Written(NamedTuple):
    avsc: dict[str, Any]
    field: Field
    data: bytes  # one record, as the store writes it


HEAD = record_head(0, 1, 42)
TAILS = (record_tail(1_700_000_000, EventType.INSERT), record_tail(1_700_000_000,
                                                                    EventType.INSERT))


def _written(variant: tuple[str, str]) -> Written:
    """The record the Python path writes for the sample (the C path must write the same)."""
    sample = SAMPLES[variant]
    layout = TableLayout("db", "t", (sample.column,))
    schema = TableSchema.from_layout(layout, 1, "0-1-1")
    out = bytearray()
    compile_encoder(schema.columns, layout.columns)(out, HEAD, TAILS, [(sample.value,)], 0)
    return Written(schema.avsc, schema.columns[0], bytes(out))


def _read(written: Written) -> dict[str, Any]:
    return unsigned_metadata(fastavro.schemaless_reader(  # type: ignore[arg-type]
        io.BytesIO(written.data), fastavro.parse_schema(written.avsc), None))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_avro_writers_write_the_same_record(variant):
    sample, sql = SAMPLES[variant], _sql_type(variant)
    written = _written(variant)
    value = from_avro_value(sql.kind, _read(written)["c"])
    assert isinstance(value, KINDS[sql.kind].python)
    if not transcoder.available():
        return
    fields, columns = TableSchema.from_avsc(written.avsc).columns, (sample.column,)
    compiled = transcoder.compile_transcoder(fields, columns)
    if variant in TRANSCODE_IN_PYTHON:
        assert compiled is None
        return
    assert compiled is not None, f"{variant}: _transcode.pyx does not take it"
    image = _image(sample)
    rows = compiled.rows(image, 0, len(image))
    assert rows is not None, f"{variant}: _transcode.pyx handed the row back"
    out = bytearray()
    transcoder.records(out, HEAD, TAILS, rows[0], rows[1], 0)
    assert bytes(out) == written.data


# -- JSON and databus -------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_json_renderers_render_the_same_line(variant):
    sql = _sql_type(variant)
    written = _written(variant)
    schema_json = json.dumps(written.avsc)
    line = render.compile_renderer(schema_json)(_read(written))
    value = json.loads(line, parse_float=Decimal)["c"]
    expected = {"number": (int, Decimal), "boolean": bool, "string": str, "null": type(None)}
    assert isinstance(value, expected[KINDS[sql.kind].json])
    if _JSONLINES is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "_jsonlines", _JSONLINES)
        patch.delenv("CDC_PURE_PYTHON", raising=False)
        render.compile_block_renderer.cache_clear()
        block = render.compile_block_renderer(schema_json)
        assert block is not None, f"{variant}: _jsonlines.pyx does not take it"
        assert block.render(written.data, 1) == line
        render.compile_block_renderer.cache_clear()


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_databus_writers_write_the_same_row(variant):
    sample = SAMPLES[variant]
    field = _written(variant).field
    encoder = dump.value_encoder(field)
    python = b"null" if sample.value is None else \
        b'"' + binascii.b2a_base64(encoder(sample.value), newline=False) + b'"'
    if _DATABUS is None:
        return
    op = databus._C_DATETIME.get(field.fsp, databus._C_CALL) if field.kind == Kind.DATETIME \
        else databus._C_OPS.get(field.kind, databus._C_CALL)
    assert bytes(_DATABUS.rows_json([(sample.value,)], (op,), (encoder,))) == \
        b"[" + python + b"]"


# -- the client library ---------------------------------------------------------------------

SYNC = bytes(range(16))


def _avro_stream(written: Written) -> bytes:
    return (container_header(json.dumps(written.avsc), "null", SYNC) + write_varint(1)
            + write_varint(len(written.data)) + written.data + SYNC)


def _records(written: Written, compiled: Any) -> list[Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "_records", compiled)
        return [e.values["c"] for e in stream.AvroStreamDecoder().feed(_avro_stream(written))
                if isinstance(e, stream.ChangeRecord)]


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_client_record_decoders_give_the_same_value(variant):
    sql = _sql_type(variant)
    written = _written(variant)
    python = _records(written, None)
    assert len(python) == 1 and isinstance(python[0], KINDS[sql.kind].python)
    if _RECORDS is not None:
        assert [_typed(v) for v in _records(written, _RECORDS)] == [_typed(v) for v in python]


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_dump_row_decoders_give_the_same_value(variant):
    sample, sql = SAMPLES[variant], _sql_type(variant)
    field = _written(variant).field
    text = None if sample.value is None else dump.encode_value(field, sample.value)
    line = json.dumps({"action": "insert", "rows": [
        [None if text is None else base64.b64encode(text).decode()]]}).encode()
    metadata = tuple(Field(name, Kind.LONG, name) for name in METADATA_FIELDS)
    header = dump.DumpHeader("db", "t", {"fields": []}, "0-1-1", "f", 4, 0, "sha256:", "",
                             1, fields=(*metadata, field))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dump, "_compiled", None)
        python = dump._OperationParser(header).parse_in_python(line).rows
    value = python[0]["c"]
    assert value is None or isinstance(value, (KINDS[sql.kind].python, str))
    if _DUMPROWS is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dump, "_compiled", _DUMPROWS)
        parser = dump.compiled_rows_parser((field,), ["c"])
        compiled = parser.parse(line)
    assert compiled is not None, f"{variant}: _dumprows.pyx handed the line back"
    assert [_typed(v) for v in compiled.rows[0].values()] == [_typed(value)]


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_the_spark_and_arrow_types_and_batches_are_the_tables(variant):
    pytest.importorskip("pyspark")
    pa = pytest.importorskip("pyarrow")
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructField, StructType

    from mariadb_cdc_client import arrow as core
    from mariadb_cdc_client.ranges import Blocks, Trim
    from mariadb_cdc_client.spark import arrow
    from mariadb_cdc_client.spark.types import spark_type, table_schema

    sql = _sql_type(variant)
    written = _written(variant)
    form = KINDS[sql.kind]
    spark = spark_type(written.field)
    assert type(spark).__name__ == form.spark
    arrow_type = to_arrow_schema(StructType([StructField("c", spark)]),
                                 timezone="UTC").field("c").type  # as arrow.py asks
    assert str(arrow_type).startswith(form.arrow)
    assert core.arrow_type(written.field) == arrow_type  # read_arrow's, without Spark
    schema = table_schema([written.avsc])
    header = parse_header(container_header(json.dumps(written.avsc), "null", SYNC))
    blocks = Blocks(write_varint(1) + write_varint(len(written.data)) + written.data + SYNC, 1)
    avroarrow = _compiled("mariadb_cdc_client.spark._avroarrow")
    batches = []
    for module in (None, avroarrow) if avroarrow is not None else (None,):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(core, "_avroarrow", module)
            maker = arrow.BatchMaker(schema, written.avsc, header, "null")
            if module is not None and variant not in ARROW_IN_PYTHON:
                assert maker._compiled is not None, f"{variant}: _avroarrow.pyx does not take it"
            batches.append(maker(blocks, Trim()))
    assert batches[0].column("c").type == arrow_type
    assert all(isinstance(b, pa.RecordBatch) and b.equals(batches[0]) for b in batches)
