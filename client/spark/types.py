"""Spark types for CDC records: the DataFrame schema of a set of table versions, and whether
a version's records fit it (:mod:`mariadb_cdc_client.spark.arrow` builds the rows).

The schema is MaxScale's metadata columns, then ``_table`` and ``_version`` (which table and
table version a row comes from), then every column of every version read, by name, in the
order they first appear. A column whose type changed between versions gets the wider type
when one holds both (INT then BIGINT: bigint; DECIMAL(5,2) then DECIMAL(10,4):
decimal(12,4)); otherwise :class:`SchemaError`. A column a version lacks is null in its rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql import types as spark_types
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from mariadb_cdc_client.arrow import MAX_DECIMAL
from mariadb_cdc_client.format.coltypes import KINDS
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.schema import METADATA_FIELDS, Field, Kind, fields_from_schema

METADATA = StructType([
    StructField("domain", LongType(), False),  # unsigned 32-bit, as server_id
    StructField("server_id", LongType(), False),
    StructField("sequence", LongType(), False),
    StructField("event_number", IntegerType(), False),
    StructField("timestamp", LongType(), False),
    StructField("event_type", StringType(), False),
    StructField("_table", StringType(), False),
    StructField("_version", IntegerType(), False),
])


class SchemaError(ValueError):
    """The tables' versions cannot be read as one DataFrame without losing or mistyping data."""


def spark_type(field: Field) -> DataType:
    kind = field.kind
    if kind == Kind.DECIMAL:
        if field.precision == 0:  # BIGINT UNSIGNED and BIT(64): 20 digits
            return DecimalType(20, 0)
        if field.precision > MAX_DECIMAL:
            return StringType()  # exact text: Spark has no decimal this wide
        return DecimalType(field.precision, field.scale)
    return _SIMPLE[kind]


# Every kind but DECIMAL (which has its digits) by the type table's Spark type.
_SIMPLE: dict[Kind, DataType] = {kind: getattr(spark_types, form.spark)()
                                 for kind, form in KINDS.items() if kind != Kind.DECIMAL}


def wider(a: DataType, b: DataType) -> DataType | None:
    """The type that holds every value of both, or None."""
    if a == b:
        return a
    if isinstance(a, NullType):
        return b
    if isinstance(b, NullType):
        return a
    pair = {type(a), type(b)}
    if pair == {IntegerType, LongType}:
        return LongType()
    if pair == {FloatType, DoubleType}:
        return DoubleType()
    if isinstance(a, DecimalType) and isinstance(b, DecimalType):
        scale = max(a.scale, b.scale)
        digits = max(a.precision - a.scale, b.precision - b.scale) + scale
        return DecimalType(digits, scale) if digits <= MAX_DECIMAL else None
    integers = (IntegerType, LongType)
    if (isinstance(a, integers) and isinstance(b, DecimalType)) or \
            (isinstance(b, integers) and isinstance(a, DecimalType)):
        dec = a if isinstance(a, DecimalType) else b
        assert isinstance(dec, DecimalType)
        digits = max(dec.precision - dec.scale, 19) + dec.scale
        return DecimalType(digits, dec.scale) if digits <= MAX_DECIMAL else None
    return None


def table_schema(versions: Iterable[dict[str, Any]]) -> StructType:
    """The DataFrame schema for reading these versions (of one or more tables)."""
    columns: dict[str, tuple[DataType, str]] = {}
    reserved = set(METADATA.fieldNames())
    for avsc in versions:
        where = f"{table_ref(avsc['database'], avsc['table'])} version {avsc['version']}"
        for field in fields_from_schema(avsc)[len(METADATA_FIELDS):]:
            if field.name in reserved:
                raise SchemaError(f"{where}: column {field.name!r} has the name of a "
                                  "metadata column")
            new = spark_type(field)
            if field.name not in columns:
                columns[field.name] = (new, where)
                continue
            old, seen = columns[field.name]
            merged = wider(old, new)
            if merged is None:
                raise SchemaError(
                    f"column {field.name!r} is {old.simpleString()} in {seen} but "
                    f"{new.simpleString()} in {where}: no Spark type holds both. Read the "
                    "tables in separate queries, or start after the change")
            columns[field.name] = (merged, seen)
    return StructType(list(METADATA.fields) + [
        StructField(name, dtype, True) for name, (dtype, _) in columns.items()])


def fits(schema: StructType, avsc: dict[str, Any]) -> str | None:
    """Why rows of this version cannot be read into ``schema`` (None: they can)."""
    have = {f.name: f.dataType for f in schema.fields}
    for field in fields_from_schema(avsc)[len(METADATA_FIELDS):]:
        if field.name not in have:
            return f"column {field.name!r} is not in the query's schema"
        if wider(have[field.name], spark_type(field)) != have[field.name]:
            return (f"column {field.name!r} is now {spark_type(field).simpleString()}, the "
                    f"query reads {have[field.name].simpleString()}")
    return None
