"""Every MariaDB column type in one table: how the binlog writes it, what it becomes.

Two tables, read together. :data:`BINLOG_TYPES` has one row per binlog type code
(``enum_field_types``, ``include/mysql_com.h``): the size, byte order and meaning of its
table-map metadata (MySQL ``Table_map_log_event``, ``Field::save_field_metadata``), whether
the optional metadata gives it a signedness bit or a character set, and the SQL types logged
as it, each with the :class:`~mariadb_cdc_client.format.schema.Kind` the store maps it to, the
``real_type`` the schema names, and the Python value the binlog decoder makes of it. Types with
no SQL type are not decoded: a table holding one stops replication with an error.

:data:`KINDS` says, per kind, how its values are stored in Avro, rendered in JSON mode, handed
to clients as Python values, and typed in Spark and Arrow.

The Python paths read these tables (``cdcserver/mariadb/constants.py``,
``replication/tablemap.py``, ``schema/avrotypes.py``, ``client/spark/types.py``); the compiled
paths and the code generators are checked against them by ``tests/unit/test_type_walk.py``,
which walks every row through every codec. ``CONTRIBUTING.md`` ("Adding a column type") lists
the edits a new type needs.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from mariadb_cdc_client.format.schema import Kind

# -- what each kind of value becomes -----------------------------------------------------

JsonType = Literal["number", "boolean", "string", "null"]


@dataclass(frozen=True)
class KindForm:
    """How the values of one kind are written and read."""

    avro: tuple[Any, ...]  # the union's branches besides "null" (a decimal adds its digits)
    json: JsonType  # the JSON value a column of this kind renders as (not counting NULL)
    python: type  # the value a client's records hold (a WITH_TEXT kind also: MariaDB's str)
    spark: str  # the pyspark.sql.types class of its column (a DECIMAL over 38 digits: String)
    arrow: str  # the Arrow type of that column, as pyarrow prints it


_WITH_TEXT = "string"  # the branch for values the logical type cannot hold (zero dates)

KINDS: dict[Kind, KindForm] = {
    Kind.BOOLEAN: KindForm(("boolean",), "boolean", bool, "BooleanType", "bool"),
    Kind.INT: KindForm(("int",), "number", int, "IntegerType", "int32"),
    Kind.LONG: KindForm(("long",), "number", int, "LongType", "int64"),
    Kind.FLOAT: KindForm(("float",), "number", float, "FloatType", "float"),
    Kind.DOUBLE: KindForm(("double",), "number", float, "DoubleType", "double"),
    Kind.DECIMAL: KindForm(({"type": "bytes", "logicalType": "decimal"},), "number", Decimal,
                           "DecimalType", "decimal128"),
    Kind.STRING: KindForm(("string",), "string", str, "StringType", "string"),
    Kind.BYTES: KindForm(("bytes",), "string", bytes, "BinaryType", "binary"),
    Kind.UUID: KindForm(({"type": "string", "logicalType": "uuid"},), "string", uuid.UUID,
                        "StringType", "string"),
    Kind.DATE: KindForm(({"type": "int", "logicalType": "date"}, _WITH_TEXT), "string",
                        dt.date, "DateType", "date32[day]"),
    Kind.DATETIME: KindForm(({"type": "long", "logicalType": "local-timestamp-micros"},
                             _WITH_TEXT), "string", dt.datetime, "TimestampNTZType",
                            "timestamp[us]"),
    Kind.TIMESTAMP: KindForm(({"type": "long", "logicalType": "timestamp-micros"}, _WITH_TEXT),
                             "string", dt.datetime, "TimestampType", "timestamp[us, tz=UTC]"),
    Kind.TIME: KindForm(({"type": "long", "logicalType": "time-micros"}, _WITH_TEXT), "string",
                        dt.timedelta, "DayTimeIntervalType", "duration[us]"),
    Kind.ENUM: KindForm(("enum",), "string", str, "StringType", "string"),  # event_type only
    Kind.NULL: KindForm((), "null", type(None), "NullType", "null"),
}


# -- what the binlog holds -----------------------------------------------------------------

@dataclass(frozen=True)
class SqlType:
    """One SQL type logged with a binlog type, and what the store makes of it."""

    sql: str  # as a CREATE TABLE spells it (the variant, where one binlog type has several)
    kind: Kind
    real_type: str  # the schema's real_type attribute
    value: tuple[type, ...]  # what the binlog decoder gives (str: MariaDB's text of a zero date)


@dataclass(frozen=True)
class BinlogType:
    code: int  # enum_field_types
    name: str  # cdcserver.mariadb.constants.ColumnType's member
    meta_size: Literal[0, 1, 2]  # bytes of table-map metadata
    meta_order: Literal["", "little", "big"]  # of a two-byte one
    meta: str  # what the metadata holds
    numeric: bool  # has a bit in the SIGNEDNESS optional metadata (MariaDB: YEAR too)
    character: bool  # has a character set in the optional metadata (MariaDB: GEOMETRY too)
    sql: tuple[SqlType, ...]  # empty: not decoded


def _ints(name: str, wide_unsigned: Kind = Kind.INT) -> tuple[SqlType, ...]:
    signed = Kind.LONG if name == "bigint" else Kind.INT
    return (SqlType(name.upper(), signed, name, (int,)),
            SqlType(name.upper() + " UNSIGNED", wide_unsigned, name, (int,)))


_DATE = (dt.date, str)
_DATETIME = (dt.datetime, str)
_TEXT = (SqlType("VARCHAR", Kind.STRING, "varchar", (str,)),
         SqlType("VARBINARY", Kind.BYTES, "varbinary", (bytes,)))
_NO_META: tuple[Literal[0], Literal[""], str] = (0, "", "none")
_FSP: tuple[Literal[1], Literal[""], str] = (1, "", "fractional digits (0-6)")


def _blob(sizes: str) -> tuple[SqlType, ...]:
    blob, text = ("blob", "text") if not sizes else (sizes + "blob", sizes + "text")
    return (SqlType(blob.upper(), Kind.BYTES, blob, (bytes,)),
            SqlType(text.upper(), Kind.STRING, text, (str,)))


BINLOG_TYPES: tuple[BinlogType, ...] = (
    BinlogType(0, "DECIMAL", *_NO_META, False, False, ()),  # before MySQL 5.0: not decoded
    BinlogType(1, "TINY", *_NO_META, True, False, _ints("tinyint")),
    BinlogType(2, "SHORT", *_NO_META, True, False, _ints("smallint")),
    BinlogType(3, "LONG", *_NO_META, True, False, _ints("int", Kind.LONG)),
    BinlogType(4, "FLOAT", 1, "", "bytes of the value (4)", True, False,
               (SqlType("FLOAT", Kind.FLOAT, "float", (float,)),)),
    BinlogType(5, "DOUBLE", 1, "", "bytes of the value (8)", True, False,
               (SqlType("DOUBLE", Kind.DOUBLE, "double", (float,)),)),
    BinlogType(6, "NULL", *_NO_META, False, False,
               (SqlType("NULL", Kind.NULL, "null", (type(None),)),)),
    BinlogType(7, "TIMESTAMP", *_NO_META, False, False,  # fsp from the schema history
               (SqlType("TIMESTAMP (old format)", Kind.TIMESTAMP, "timestamp", _DATETIME),)),
    BinlogType(8, "LONGLONG", *_NO_META, True, False, _ints("bigint", Kind.DECIMAL)),
    BinlogType(9, "INT24", *_NO_META, True, False, _ints("mediumint")),
    BinlogType(10, "DATE", *_NO_META, False, False,
               (SqlType("DATE", Kind.DATE, "date", _DATE),)),
    BinlogType(11, "TIME", *_NO_META, False, False,
               (SqlType("TIME (old format)", Kind.TIME, "time", (dt.timedelta,)),)),
    BinlogType(12, "DATETIME", *_NO_META, False, False,
               (SqlType("DATETIME (old format)", Kind.DATETIME, "datetime", _DATETIME),)),
    BinlogType(13, "YEAR", *_NO_META, False, False,
               (SqlType("YEAR", Kind.INT, "year", (int,)),)),
    BinlogType(14, "NEWDATE", *_NO_META, False, False, ()),  # never in a binlog
    BinlogType(15, "VARCHAR", 2, "little", "the maximum length in bytes", False, True, _TEXT),
    BinlogType(16, "BIT", 2, "little", "whole bytes << 8 | remaining bits", False, False, (
        SqlType("BIT(1)", Kind.BOOLEAN, "bit", (int,)),
        SqlType("BIT(2) to BIT(63)", Kind.LONG, "bit", (int,)),
        SqlType("BIT(64)", Kind.DECIMAL, "bit", (int,)))),
    BinlogType(17, "TIMESTAMP2", *_FSP, False, False,
               (SqlType("TIMESTAMP", Kind.TIMESTAMP, "timestamp", _DATETIME),)),
    BinlogType(18, "DATETIME2", *_FSP, False, False,
               (SqlType("DATETIME", Kind.DATETIME, "datetime", _DATETIME),)),
    BinlogType(19, "TIME2", *_FSP, False, False,
               (SqlType("TIME", Kind.TIME, "time", (dt.timedelta,)),)),
    BinlogType(245, "JSON", 1, "", "bytes of the length", False, False,  # MySQL's binary JSON
               (SqlType("JSON (MySQL)", Kind.STRING, "json", (str,)),)),
    BinlogType(246, "NEWDECIMAL", 2, "big", "precision << 8 | scale", True, False,
               (SqlType("DECIMAL", Kind.DECIMAL, "decimal", (Decimal,)),)),
    # ENUM and SET come as STRING with their real type in the metadata's high byte
    # (tablemap.py turns them back); their own codes carry the same two bytes.
    BinlogType(247, "ENUM", 2, "big", "real type << 8 | bytes of the value", False, False,
               (SqlType("ENUM", Kind.STRING, "enum", (str,)),)),
    BinlogType(248, "SET", 2, "big", "real type << 8 | bytes of the value", False, False,
               (SqlType("SET", Kind.STRING, "set", (str,)),)),
    BinlogType(249, "TINY_BLOB", 1, "", "bytes of the length", False, True, _blob("tiny")),
    BinlogType(250, "MEDIUM_BLOB", 1, "", "bytes of the length", False, True,
               _blob("medium")),
    BinlogType(251, "LONG_BLOB", 1, "", "bytes of the length", False, True, _blob("long")),
    BinlogType(252, "BLOB", 1, "", "bytes of the length (1-4: TINY, -, MEDIUM, LONG)", False,
               True, (*_blob(""), SqlType("JSON (MariaDB: a LONGTEXT)", Kind.STRING, "json",
                                             (str,)))),
    BinlogType(253, "VAR_STRING", 2, "little", "the maximum length in bytes", False, True,
               _TEXT),
    BinlogType(254, "STRING", 2, "big", "real type and maximum length, packed", False, True, (
        SqlType("CHAR", Kind.STRING, "char", (str,)),
        SqlType("BINARY", Kind.BYTES, "binary", (bytes,)),
        SqlType("INET4", Kind.STRING, "inet4", (str,)),
        SqlType("INET6", Kind.STRING, "inet6", (str,)),
        SqlType("UUID", Kind.UUID, "uuid", (str,)))),
    BinlogType(255, "GEOMETRY", 1, "", "bytes of the length", False, False,
               (SqlType("GEOMETRY", Kind.BYTES, "geometry", (bytes,)),)),
)

BY_CODE: dict[int, BinlogType] = {t.code: t for t in BINLOG_TYPES}


def codes(**flags: Any) -> frozenset[int]:
    """The codes of the binlog types whose fields have these values: ``codes(numeric=True)``,
    ``codes(meta_size=2, meta_order="big")``."""
    return frozenset(t.code for t in BINLOG_TYPES
                     if all(getattr(t, name) == value for name, value in flags.items()))
