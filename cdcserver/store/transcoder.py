"""Row images to Avro without Python values in between, where a compiled extension can do it.

The Python path decodes each row image into a tuple of Python values (``rowcodec.py``), then
encodes the tuple (``encoder.py``): two calls per value and an object for every DECIMAL and
DATETIME. For a table whose every column has a fixed Avro form of its binlog bytes, the C
extension ``_transcode`` writes the Avro encoding straight from the image instead, several
times faster. The replicator hands such rows over undecoded (``takes()`` tells it which
layouts qualify), so the tuples are made only when a sink wants them (Kafka, for instance);
the Avro store only needs the bytes.

Columns the extension does not take (MySQL's binary JSON, SET, INET4/6, UUID, the pre-5.6
temporal formats, DECIMALs wider than 18 digits, multi-byte character sets other than UTF-8)
keep their table on the Python path, and so does any event holding a value the Python decoder
would reject or render as text beyond the few the extension writes itself. Both paths give the
same bytes: ``tests/server/test_transcode.py`` compares them on every type.

Without a C compiler at install time the extension is absent and everything takes the Python
path (``available()`` says which).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.charsets import single_byte_table
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.store.encoder import encode_string
from mariadb_cdc_client.format.schema import Field, Kind

try:
    from cdcserver.store import _transcode  # type: ignore[attr-defined]
except ImportError:  # built without a compiler: the Python path only
    _transcode = None

# Set to any non-empty value to take the Python path even when the extension is built.
DISABLE_ENV = "CDC_PURE_PYTHON"


class Transcoder(Protocol):
    def rows(self, buf: bytes, pos: int, end: int) -> tuple[bytes, bytes] | None: ...


# Operation codes of _transcode.pyx (its enum).
_INT_OPS = {(T.TINY, False): 1, (T.TINY, True): 2, (T.SHORT, False): 3, (T.SHORT, True): 4,
            (T.INT24, False): 5, (T.INT24, True): 6, (T.LONG, False): 7, (T.LONG, True): 8,
            (T.LONGLONG, False): 9, (T.LONGLONG, True): 10}
OP_FLOAT, OP_DOUBLE, OP_YEAR, OP_DECIMAL = 11, 12, 13, 14
OP_UTF8, OP_BYTES, OP_BINARY, OP_CHARMAP, OP_ENUM = 15, 16, 17, 18, 19
OP_BIT_BOOL, OP_BIT_LONG, OP_BIT_U64 = 20, 21, 22
_BIT = -1  # a BIT column: which of the three operations depends on its Avro type
OP_DATE, OP_DATETIME2, OP_TIMESTAMP2, OP_TIME2 = 23, 24, 25, 26

_UTF8_CODECS = frozenset({"utf-8", "utf8"})
_MAX_DECIMAL_DIGITS = 18  # the unscaled value fits an int64
# Character sets whose characters are one byte each: a 256-entry table transcodes them.

Step = tuple[int, bool, int, int, int, Any]
_BIT_OPS = {Kind.BOOLEAN: OP_BIT_BOOL, Kind.LONG: OP_BIT_LONG}


def available() -> bool:
    return _transcode is not None and not os.environ.get(DISABLE_ENV)


@lru_cache(maxsize=4096)
def takes(columns: tuple[ColumnDef, ...]) -> bool:
    """Whether rows of this layout take the compiled path (their images can be handed over
    undecoded)."""
    return available() and all(_step(col) is not None for col in columns)


def compile_transcoder(fields: tuple[Field, ...], columns: tuple[ColumnDef, ...]
                       ) -> Transcoder | None:
    """The compiled transcoder writing rows of ``columns`` as the Avro ``fields`` of their
    table version, or None when they take the Python path."""
    if not takes(columns):
        return None
    return _compile(fields, columns)


@lru_cache(maxsize=4096)
def _compile(fields: tuple[Field, ...], columns: tuple[ColumnDef, ...]) -> Transcoder:
    program = []
    for field, col in zip(fields, columns, strict=True):
        step = _step(col)
        assert step is not None
        if step[0] == _BIT:
            step = (_BIT_OPS.get(field.kind, OP_BIT_U64), *step[1:])
        program.append(step)
    assert _transcode is not None
    transcoder: Transcoder = _transcode.Transcoder(program)
    return transcoder


def _step(col: ColumnDef) -> Step | None:
    """(operation, nullable, a, b, c, extra) for one column; None if the extension cannot
    write it exactly as the Python path does."""
    t, meta = T(col.binlog_type), col.meta
    if col.extended in ("inet4", "inet6", "uuid") or t == T.JSON:
        return None

    def step(op: int, a: int = 0, b: int = 0, c: int = 0, extra: Any = None) -> Step:
        return (op, col.nullable, a, b, c, extra)

    if (t, col.unsigned) in _INT_OPS:
        return step(_INT_OPS[t, col.unsigned])
    if t in (T.FLOAT, T.DOUBLE):
        return step(OP_FLOAT if t == T.FLOAT else OP_DOUBLE)
    if t == T.YEAR:
        return step(OP_YEAR)
    if t == T.NEWDECIMAL:
        precision, scale = meta >> 8, meta & 0xFF
        if precision > _MAX_DECIMAL_DIGITS:
            return None
        intg0, lead = divmod(precision - scale, 9)
        frac0, last = divmod(scale, 9)
        return step(OP_DECIMAL, lead, intg0 + frac0, last)
    if t in (T.VARCHAR, T.VAR_STRING):
        return _text(col, 1 if meta < 256 else 2, step)
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB, T.GEOMETRY):
        return _text(col, meta, step)
    if t == T.STRING:
        max_length = (((meta >> 4) & 0x300) ^ 0x300) + (meta & 0xFF)
        prefix = 1 if max_length < 256 else 2
        if col.charset is None:
            return step(OP_BINARY, prefix, max_length)
        return _text(col, prefix, step)
    if t == T.ENUM:
        labels = tuple(encode_string(label) for label in col.enum_values)
        return step(OP_ENUM, 1 if meta == 1 else 2, extra=labels)
    if t == T.BIT:
        return step(_BIT, (meta >> 8) + (1 if meta & 0xFF else 0))
    if t == T.DATE:
        return step(OP_DATE)
    if t == T.DATETIME2:
        return step(OP_DATETIME2, meta)
    if t == T.TIMESTAMP2:
        return step(OP_TIMESTAMP2, meta)
    if t == T.TIME2:
        return step(OP_TIME2, meta)
    return None


def _text(col: ColumnDef, prefix: int, step: Any) -> Step | None:
    if col.charset is None:
        return step(OP_BYTES, prefix)
    if col.charset in _UTF8_CODECS:
        return step(OP_UTF8, prefix)
    table = charmap_table(col.charset)
    return None if table is None else step(OP_CHARMAP, prefix, extra=table)


@lru_cache(maxsize=64)
def charmap_table(codec: str) -> bytes | None:
    """For a single-byte character set: each byte's UTF-8 encoding as 4 bytes (length, then
    up to 3 bytes), from MariaDB's table (``replication/charsets.py``). None for other codecs."""
    chars = single_byte_table(codec)
    if chars is None:
        return None
    table = bytearray()
    for char in chars:
        utf8 = char.encode("utf-8")
        if len(utf8) > 3:
            return None
        table += bytes([len(utf8)]) + utf8.ljust(3, b"\0")
    return bytes(table)


def records(out: bytearray, head: bytes, tails: Sequence[bytes], columns: bytes, ends: bytes,
            event_no: int) -> int:
    """Append one record per transcoded row; the next event number."""
    assert _transcode is not None
    return int(_transcode.records(out, head, tails[0], tails[1], columns, ends, event_no))
