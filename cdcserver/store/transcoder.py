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

``[capture]`` column rules (``cdcserver/schema/masking.py``) are applied here too, or a table
under them would lose the compiled path: an excluded column is read (and checked, so that
errors and fallbacks stay the same) and not written, a masked one is written cut. A hashed
one needs SHA-256 in C, which comes from the OpenSSL that Python's ``hashlib`` uses, looked up
the first time a hashed column is met (``sha256_loaded``): building against OpenSSL's headers
would make the whole extension depend on them at install time. OpenSSL 3's one-call
``SHA256()`` looks the algorithm up on every call (several times slower than the hash of a
short value), so the extension uses ``SHA256_Init``/``_Update``/``_Final``, starting each
value from a copy of the salt's context. Without it (or without the salt) a table with a
hashed column takes the Python path. ``tests/unit/test_transcode_rules.py`` compares both
paths under every rule.

Without a C compiler at install time the extension is absent and everything takes the Python
path (``available()`` says which).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from cdcserver.core.capture import EXCLUDE, HASH, MASK
from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.charsets import single_byte_table
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.store.encoder import encode_string
from mariadb_cdc_client.format.compiled import compiled_module, pure_python
from mariadb_cdc_client.format.schema import Field, Kind

# available() asks CDC_PURE_PYTHON on each use
_transcode = compiled_module("cdcserver.store._transcode", unless_pure_python=False)


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

_STRING_OPS = frozenset({OP_UTF8, OP_BYTES, OP_BINARY, OP_CHARMAP})
# Column rules (_transcode.pyx's RULE_*): the rule's code and, for a mask, what it keeps.
RULE_EXCLUDE, RULE_HASH, RULE_MASK = 1, 2, 3
_MAX_KEEP = 1 << 62  # more than any value holds (a LONGBLOB is at most 4 GB)
_SHA256_FUNCTIONS = ("SHA256_Init", "SHA256_Update", "SHA256_Final")
_libraries: list[ctypes.CDLL] = []

Operation = tuple[int, bool, int, int, int, Any]  # (op, nullable, a, b, c, extra)
Step = tuple[int, bool, int, int, int, Any, int, int]  # and (rule, keep)
_BIT_OPS = {Kind.BOOLEAN: OP_BIT_BOOL, Kind.LONG: OP_BIT_LONG}


def available() -> bool:
    return _transcode is not None and not pure_python()


@lru_cache(maxsize=4096)
def takes(columns: tuple[ColumnDef, ...]) -> bool:
    """Whether rows of this layout take the compiled path (their images can be handed over
    undecoded)."""
    return available() and all(_step(col) is not None for col in columns)


def compile_transcoder(fields: tuple[Field, ...], columns: tuple[ColumnDef, ...],
                       salt: bytes | None = None) -> Transcoder | None:
    """The compiled transcoder writing rows of ``columns`` as the Avro ``fields`` of their
    table version, or None when they take the Python path. ``columns`` are a row image's
    (``TableLayout.image_columns``), each with its [capture] rule; ``fields`` are the stored
    columns' (the excluded ones have none); ``salt`` is the hash's."""
    if not takes(columns):
        return None
    hashed = any(col.rule == HASH for col in columns)
    if hashed and not salt:
        return None
    return _compile(fields, columns, salt if hashed else None)


@lru_cache(maxsize=4096)
def _compile(fields: tuple[Field, ...], columns: tuple[ColumnDef, ...], salt: bytes | None
             ) -> Transcoder:
    if len(fields) != sum(col.rule != EXCLUDE for col in columns):
        raise ValueError("the fields are not those of the stored columns")
    program = []
    stored = iter(fields)
    for col in columns:
        step = _step(col)
        assert step is not None
        field = None if col.rule == EXCLUDE else next(stored)
        if step[0] == _BIT:  # an excluded one is read as any of the three
            op = OP_BIT_U64 if field is None else _BIT_OPS.get(field.kind, OP_BIT_U64)
            step = (op, *step[1:])
        program.append(step)
    assert _transcode is not None
    transcoder: Transcoder = _transcode.Transcoder(program, salt)
    return transcoder


def _step(col: ColumnDef) -> Step | None:
    """(operation, nullable, a, b, c, extra, rule, keep) for one column; None if the
    extension cannot write it exactly as the Python path does."""
    operation = _operation(col)
    if operation is None or col.rule is None:
        return None if operation is None else (*operation, 0, 0)
    if col.rule == EXCLUDE:
        return (*operation, RULE_EXCLUDE, 0)
    if operation[0] not in _STRING_OPS:  # masking.applies_to leaves out the others
        return None
    if col.rule == HASH:
        return (*operation, RULE_HASH, 0) if sha256_loaded() else None
    kind, _, keep = col.rule.partition(":")
    if kind != MASK:
        return None
    return (*operation, RULE_MASK, min(int(keep or 0), _MAX_KEEP))


def _operation(col: ColumnDef) -> Operation | None:
    """(op, nullable, a, b, c, extra) reading the column's clear value."""
    t, meta = T(col.binlog_type), col.meta
    if col.extended in ("inet4", "inet6", "uuid") or t == T.JSON:
        return None

    def step(op: int, a: int = 0, b: int = 0, c: int = 0, extra: Any = None) -> Operation:
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


def _text(col: ColumnDef, prefix: int, step: Any) -> Operation | None:
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


@lru_cache(maxsize=1)
def sha256_loaded() -> bool:
    """Whether the extension has SHA-256 (module docstring): libcrypto's SHA256_Init,
    _Update and _Final, looked up through Python's ``_hashlib`` (which links the libcrypto
    ``hashlib`` uses) or else by name, and checked against ``hashlib`` before use."""
    if _transcode is None:
        return False
    for library in _libcrypto_candidates():
        try:
            lib = ctypes.CDLL(library)
            addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                         for name in _SHA256_FUNCTIONS]
        except (OSError, AttributeError):
            continue
        if not all(addresses):
            continue
        _transcode.use_sha256(*addresses)
        if _transcode.sha256(b"salt", b"value") == hashlib.sha256(b"saltvalue").digest():
            _libraries.append(lib)  # kept loaded (ctypes never unloads one anyway)
            return True
    _transcode.use_sha256(0, 0, 0)
    return False


def _libcrypto_candidates() -> list[str]:
    """``_hashlib``'s file first: looking a name up in it searches the libraries it links."""
    candidates = []
    try:
        import _hashlib

        candidates.append(_hashlib.__file__)
    except (ImportError, AttributeError):
        pass
    found = ctypes.util.find_library("crypto")
    if found:
        candidates.append(found)
    return candidates


def records(out: bytearray, head: bytes, tails: Sequence[bytes], columns: bytes, ends: bytes,
            event_no: int) -> int:
    """Append one record per transcoded row; the next event number."""
    assert _transcode is not None
    return int(_transcode.records(out, head, tails[0], tails[1], columns, ends, event_no))
