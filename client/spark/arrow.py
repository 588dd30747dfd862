"""Stored Avro blocks straight into Arrow record batches of the query's schema, on executors.

A chunk of blocks is decoded (by cavro, or fastavro) against the version's schema stripped
of its logical types, so values come out as Avro stores them: days, microseconds, unscaled
decimals as bytes, text as UTF-8 bytes. Each Arrow column is then built from one list in one
call (dates, timestamps and TIME durations take the integers as they are; decimals are
assembled into 128-bit buffers; text is checked as UTF-8 a column at a time), and Spark takes
the batch without looking at a single row again. That is what lets a partition run at the
speed of the decoder instead of the per-row path of Python data sources.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

import fastavro
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DataType, DecimalType, StringType, StructType

from mariadb_cdc_client.format.avro import (
    SYNC_SIZE,
    AvroFormatError,
    Header,
    block_at,
    container_header,
    decompress,
    write_varint,
)
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.schema import Field, Kind, fields_from_schema, parse_time
from mariadb_cdc_client.ranges import Blocks, Trim
from mariadb_cdc_client.spark.types import invalid_date

Records = list[dict[str, Any]]
Values = tuple[Any, ...]  # one column's values
Column = Callable[[Values], pa.Array]

_DATES = (Kind.DATE, Kind.DATETIME, Kind.TIMESTAMP)  # a string branch: zero dates


def plain_reader_schema(schema: Any) -> Any:
    """An Avro type with every ``logicalType`` removed and ``string`` read as ``bytes``: the
    same binary encoding, decoded to the plain values underneath and without building a
    Python string per value (Arrow checks the UTF-8 of a whole column at once)."""
    if schema == "string":
        return "bytes"
    if isinstance(schema, list):
        return [plain_reader_schema(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    plain = {k: v for k, v in schema.items() if k != "logicalType"}
    if plain.get("type") == "record":
        plain["fields"] = [{**f, "type": plain_reader_schema(f["type"])}
                           for f in plain["fields"]]
    elif plain.get("type") not in ("enum", "fixed"):
        plain["type"] = plain_reader_schema(plain["type"])
    return plain


class BatchMaker:
    """Turns chunks of one version's blocks into record batches of ``schema``."""

    def __init__(self, schema: StructType, avsc: dict[str, Any], header: Header,
                 zero_dates: str) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # decoders differ in the codecs they know: blocks are decompressed here instead
        self._header = container_header(json.dumps(plain_reader_schema(avsc)), "null",
                                        header.sync)
        self._codec, self._sync = header.codec, header.sync
        # _table: the table as commands name it, the same text as the offsets' keys
        table, version = table_ref(avsc["database"], avsc["table"]), int(avsc["version"])
        by_name = {f.name: f for f in fields_from_schema(avsc)}
        self._read = [f.name for f in by_name.values()]  # the stored fields, in order
        self._columns: list[tuple[int | None, Column]] = []  # (stored field, builder)
        for target, arrow_field in zip(schema.fields, self.arrow_schema, strict=True):
            field = by_name.get(target.name)
            if target.name in ("_table", "_version"):
                value = table if target.name == "_table" else version
                self._columns.append((None, _constant(value, arrow_field.type)))
            elif field is None:
                self._columns.append((None, _nulls(arrow_field.type)))
            else:
                self._columns.append((self._read.index(field.name),
                                      _column(field, target.dataType, arrow_field.type,
                                              zero_dates)))

    def __call__(self, blocks: Blocks, trim: Trim) -> pa.RecordBatch | None:
        records = decode(self._header + self._plain(blocks.data))
        if trim:
            records = [r for r in records if trim.keeps(r)]
        if not records:
            return None
        # one C-level pass turns the records into one tuple of values per stored field
        stored = list(zip(*map(dict.values, records), strict=True))
        empty: tuple[Any, ...] = (None,) * len(records)
        return pa.RecordBatch.from_arrays(
            [build(empty if i is None else stored[i]) for i, build in self._columns],
            schema=self.arrow_schema)


    def _plain(self, data: bytes) -> bytes:
        """Blocks as the null codec frames them."""
        if self._codec == "null":
            return data
        out, pos = bytearray(), 0
        while pos < len(data):
            block = block_at(data, pos, self._sync)
            if block is None:
                raise AvroFormatError("a chunk of blocks ends inside a block")
            count, start, pos = block
            plain = decompress(self._codec, data[start:pos - SYNC_SIZE])
            out += write_varint(count) + write_varint(len(plain)) + plain + self._sync
        return bytes(out)


def _decode_cavro(container: bytes) -> Records:
    import cavro

    options = cavro.Options(record_decodes_to_dict=True)
    return cast(Records, list(cavro.ContainerReader(io.BytesIO(container), options=options)))


def _decode_fastavro(container: bytes) -> Records:
    return cast(Records, list(fastavro.reader(io.BytesIO(container))))


def _decoder() -> Callable[[bytes], Records]:
    """cavro when installed (the spark extra has it): it decodes these records about twice
    as fast as fastavro, which remains the fallback (same values, same dicts)."""
    try:
        import cavro  # noqa: F401
    except ImportError:
        return _decode_fastavro
    return _decode_cavro


decode = _decoder()


def _constant(value: Any, arrow_type: pa.DataType) -> Column:
    scalar = pa.scalar(value, arrow_type)
    return lambda values: pa.repeat(scalar, len(values))


def _nulls(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.nulls(len(values), arrow_type)


def _plain(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.array(values, arrow_type)


def _column(field: Field, target: DataType, arrow_type: pa.DataType, zero_dates: str
            ) -> Column:
    if isinstance(target, DecimalType):
        return _decimal_column(field, target, arrow_type)
    if isinstance(target, StringType) and field.kind == Kind.DECIMAL:
        return _decimal_text_column(field)
    if field.kind in _DATES:
        return _temporal_column(arrow_type, lambda text: invalid_date(text, zero_dates))
    if field.kind == Kind.TIME:
        return _temporal_column(arrow_type, parse_time)
    if field.kind in (Kind.STRING, Kind.UUID):
        return _text_column(arrow_type)
    return _plain(arrow_type)


def _text_column(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.array(values, pa.binary()).cast(arrow_type)


def _temporal_column(arrow_type: pa.DataType, from_text: Callable[[str], Any]) -> Column:
    """Days or microseconds, except the values stored as text (a temporal column's union
    has a string branch: MariaDB's zero and partial dates)."""
    def build(values: Values) -> pa.Array:
        try:
            return pa.array(values, arrow_type)
        except pa.ArrowTypeError:
            return pa.array([from_text(v.decode()) if isinstance(v, bytes) else v
                             for v in values], arrow_type)
    return build


def _unscaled(field: Field) -> Callable[[Any], int]:
    """The unscaled integer of a stored value: a decimal's big-endian two's complement
    bytes, or an integer column's value (widened into a decimal)."""
    if field.kind == Kind.DECIMAL:
        return lambda b: int.from_bytes(b, "big", signed=True)
    return int


def _decimal_column(field: Field, target: DecimalType, arrow_type: pa.DataType) -> Column:
    """A decimal128 column assembled from its unscaled values (rescaled when the query's
    type is wider than the version's)."""
    unscaled = _unscaled(field)
    source_scale = field.scale if field.kind == Kind.DECIMAL else 0
    factor = 10 ** (target.scale - source_scale)

    def build(values: Values) -> pa.Array:
        ints = [0 if v is None else unscaled(v) * factor for v in values]
        data = pa.py_buffer(b"".join(i.to_bytes(16, "little", signed=True) for i in ints))
        nulls = values.count(None)
        valid = pa.array([v is not None for v in values]).buffers()[1] if nulls else None
        return pa.Array.from_buffers(arrow_type, len(values), [valid, data], nulls)
    return build


def _decimal_text_column(field: Field) -> Column:
    """A decimal wider than Spark's 38 digits, as its exact text."""
    scale = field.scale

    def text(value: bytes) -> str:
        unscaled = int.from_bytes(value, "big", signed=True)
        return format(Decimal(f"{unscaled}E-{scale}"), "f")  # exact: no context rounding
    return lambda values: pa.array([None if v is None else text(v) for v in values],
                                   pa.string())
