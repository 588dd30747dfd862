"""TABLE_MAP events: a table's column types, metadata and (optional metadata) names.

Layout (MySQL ``Table_map_log_event``; MariaDB writes the same):
post-header ``table_id`` (6 bytes) + flags (2); body ``db_len db\\0 tbl_len tbl\\0``,
``column_count`` (length-encoded), one type byte per column, the metadata block (length-encoded
size, then per-type bytes), the NULL-ability bitmap, then optional metadata as
type-length-value fields (``binlog_row_metadata=MINIMAL|FULL``; FULL adds names, ENUM/SET labels
and the primary key).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.errors import SchemaError, UndecodableEvent
from cdcserver.mariadb.charsets import CollationTable, codec_for
from cdcserver.mariadb.constants import (
    BINARY_COLLATION_ID,
    CHARACTER_TYPES,
    NUMERIC_TYPES,
    ColumnType,
)
from cdcserver.replication.cursor import Cursor
from mariadb_cdc_client.format import coltypes

# Optional metadata field types (MySQL Table_map_log_event::Optional_metadata_field_type).
SIGNEDNESS = 1
DEFAULT_CHARSET = 2
COLUMN_CHARSET = 3
COLUMN_NAME = 4
SET_STR_VALUE = 5
ENUM_STR_VALUE = 6
GEOMETRY_TYPE = 7
SIMPLE_PRIMARY_KEY = 8
PRIMARY_KEY_WITH_PREFIX = 9
ENUM_AND_SET_DEFAULT_CHARSET = 10
ENUM_AND_SET_COLUMN_CHARSET = 11
COLUMN_VISIBILITY = 12

# How many metadata bytes each type has, in which order (the type table's columns).
_ONE_BYTE_META = frozenset(ColumnType(code) for code in coltypes.codes(meta_size=1))
_TWO_BYTE_LE_META = frozenset(
    ColumnType(code) for code in coltypes.codes(meta_size=2, meta_order="little"))
_TWO_BYTE_BE_META = frozenset(
    ColumnType(code) for code in coltypes.codes(meta_size=2, meta_order="big"))


@dataclass
class _Optional:
    unsigned: list[bool] = field(default_factory=list)
    charsets: list[int] = field(default_factory=list)
    enum_set_charsets: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    set_values: list[tuple[bytes, ...]] = field(default_factory=list)
    enum_values: list[tuple[bytes, ...]] = field(default_factory=list)
    geometry_types: list[int] = field(default_factory=list)
    primary_key: list[int] = field(default_factory=list)


def parse_table_map(
    body: Cursor, table_id_size: int, collations: CollationTable, *, mariadb: bool = True
) -> tuple[int, TableLayout]:
    """Decode a TABLE_MAP event body (after the common header, before the checksum).

    MariaDB's SIGNEDNESS bitmap has a bit for YEAR columns too (YEAR is a numeric field
    there, sql/field.h Field_year : Field_tiny); MySQL's does not (is_numeric_type)."""
    numeric = NUMERIC_TYPES | {ColumnType.YEAR} if mariadb else NUMERIC_TYPES
    table_id = body.uint(table_id_size)
    body.u16()  # flags
    database = body.take(body.u8()).decode("utf-8")
    body.u8()
    table = body.take(body.u8()).decode("utf-8")
    body.u8()
    count = body.lenenc()
    types = [_column_type(t) for t in body.take(count)]
    meta_block = Cursor(body.lenenc_bytes())
    metas, types = _read_metadata(meta_block, types)
    nullable = body.take((count + 7) // 8)
    optional = _read_optional(body, types, numeric)
    columns = _columns(database, table, types, metas, nullable, optional, collations, numeric)
    metadata = "full" if optional.names else (
        "minimal" if optional.unsigned or optional.charsets else "none")
    return table_id, TableLayout(database, table, columns, tuple(optional.primary_key),
                                 metadata)


def _column_type(raw: int) -> ColumnType:
    try:
        return ColumnType(raw)
    except ValueError:
        raise UndecodableEvent(f"unknown column type {raw} in table map") from None


def _read_metadata(
    block: Cursor, types: list[ColumnType]
) -> tuple[list[int], list[ColumnType]]:
    metas: list[int] = []
    real_types: list[ColumnType] = []
    for ctype in types:
        meta = 0
        if ctype in _ONE_BYTE_META:
            meta = block.u8()
        elif ctype in _TWO_BYTE_LE_META:
            meta = block.u16()
        elif ctype in _TWO_BYTE_BE_META:
            meta = (block.u8() << 8) | block.u8()
        if ctype == ColumnType.STRING and (meta >> 8) in (ColumnType.ENUM, ColumnType.SET):
            ctype = ColumnType(meta >> 8)
            meta &= 0xFF
        metas.append(meta)
        real_types.append(ctype)
    if block.remaining():
        raise UndecodableEvent("table map metadata longer than its column types need")
    return metas, real_types


def _bits(data: bytes, count: int) -> list[bool]:
    """Optional metadata bitmaps are MSB-first."""
    return [bool(data[i // 8] & (0x80 >> (i % 8))) for i in range(count)]


def _read_optional(body: Cursor, types: list[ColumnType],
                   numeric_types: frozenset[ColumnType]) -> _Optional:
    opt = _Optional()
    numeric = sum(1 for t in types if t in numeric_types)
    while body.remaining() > 0:
        kind = body.u8()
        value = Cursor(body.lenenc_bytes())
        if kind == SIGNEDNESS:
            opt.unsigned = _bits(value.rest(), numeric)
        elif kind in (DEFAULT_CHARSET, ENUM_AND_SET_DEFAULT_CHARSET):
            target = opt.charsets if kind == DEFAULT_CHARSET else opt.enum_set_charsets
            target.append(-value.lenenc())  # negative: "the default", resolved in _columns
            while value.remaining():
                index, collation = value.lenenc(), value.lenenc()
                target.append(index)
                target.append(collation)
        elif kind in (COLUMN_CHARSET, ENUM_AND_SET_COLUMN_CHARSET):
            target = opt.charsets if kind == COLUMN_CHARSET else opt.enum_set_charsets
            while value.remaining():
                target.append(value.lenenc())
        elif kind == COLUMN_NAME:
            while value.remaining():
                opt.names.append(value.lenenc_bytes().decode("utf-8"))
        elif kind in (SET_STR_VALUE, ENUM_STR_VALUE):
            target_values = opt.set_values if kind == SET_STR_VALUE else opt.enum_values
            while value.remaining():
                target_values.append(tuple(value.lenenc_bytes() for _ in range(value.lenenc())))
        elif kind == GEOMETRY_TYPE:
            while value.remaining():
                opt.geometry_types.append(value.lenenc())
        elif kind == SIMPLE_PRIMARY_KEY:
            while value.remaining():
                opt.primary_key.append(value.lenenc())
        elif kind == PRIMARY_KEY_WITH_PREFIX:
            while value.remaining():
                opt.primary_key.append(value.lenenc())
                value.lenenc()  # prefix length
        # COLUMN_VISIBILITY and future fields carry nothing the stream needs.
    return opt


def _expand_charsets(encoded: list[int], count: int) -> list[int]:
    """Turn DEFAULT_CHARSET's (default, index, collation...) form into one id per column."""
    if not encoded or encoded[0] >= 0:
        return encoded
    default = -encoded[0]
    ids = [default] * count
    for i in range(1, len(encoded), 2):
        ids[encoded[i]] = encoded[i + 1]
    return ids


def _columns(
    database: str, table: str, types: list[ColumnType], metas: list[int], nullable: bytes,
    opt: _Optional, collations: CollationTable, numeric: frozenset[ColumnType],
) -> tuple[ColumnDef, ...]:
    names = opt.names or [""] * len(types)  # without FULL metadata: the history names them
    char_cols = [i for i, t in enumerate(types) if _is_character(t)]
    enum_set_cols = [i for i, t in enumerate(types) if t in (ColumnType.ENUM, ColumnType.SET)]
    charset_of = dict(zip(char_cols, _expand_charsets(opt.charsets, len(char_cols)), strict=False))
    es_charset_of = dict(
        zip(enum_set_cols, _expand_charsets(opt.enum_set_charsets, len(enum_set_cols)),
            strict=False)
    )
    unsigned = iter(opt.unsigned)
    enums, sets, geoms = iter(opt.enum_values), iter(opt.set_values), iter(opt.geometry_types)
    columns = []
    for i, (ctype, meta) in enumerate(zip(types, metas, strict=True)):
        collation = charset_of.get(i, es_charset_of.get(i, BINARY_COLLATION_ID))
        codec = _codec(collations, collation, database, table, names[i] or f"#{i + 1}")
        labels_codec = codec or "utf-8"
        flag = next(unsigned, False) if ctype in numeric else False
        columns.append(
            ColumnDef(
                name=names[i],
                binlog_type=int(ctype),
                meta=meta,
                unsigned=flag and ctype != ColumnType.YEAR,
                nullable=bool(nullable[i // 8] & (1 << (i % 8))),
                charset=codec if ctype != ColumnType.GEOMETRY else None,
                enum_values=_labels(next(enums, ()), labels_codec)
                if ctype == ColumnType.ENUM else (),
                set_values=_labels(next(sets, ()), labels_codec)
                if ctype == ColumnType.SET else (),
                geometry_type=next(geoms, 0) if ctype == ColumnType.GEOMETRY else 0,
            )
        )
    return tuple(columns)


def _is_character(ctype: ColumnType) -> bool:
    # MariaDB counts GEOMETRY among the character columns of DEFAULT_CHARSET/COLUMN_CHARSET.
    return ctype in CHARACTER_TYPES or ctype == ColumnType.GEOMETRY


def _codec(collations: CollationTable, collation: int, db: str, tbl: str, col: str) -> str | None:
    try:
        return codec_for(collations.charset(collation))
    except LookupError as exc:
        raise SchemaError(f"column {db}.{tbl}.{col}: {exc}") from None


def _labels(raw: tuple[bytes, ...], codec: str) -> tuple[str, ...]:
    return tuple(label.decode(codec) for label in raw)
