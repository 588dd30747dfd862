"""MySQL's binary JSON (column type 245) as JSON text.

Format (MySQL ``sql-common/json_binary.cc``): a type byte, then the value. Objects and arrays
hold an element count and a byte size (2 bytes each in the small form, 4 in the large), key
entries (offset, 2-byte length) for objects, then value entries (type + offset, or the value
itself when it fits: literals and 16-bit integers always, 32-bit integers in the large form).
Strings carry a 7-bit variable length. Opaque values (DECIMAL, temporal types) carry a column
type and raw bytes. MariaDB stores JSON as text and never uses this.

python-mysql-replication has a decoder, but it returns None for short data and drops opaque
bytes it cannot decode; this one raises instead, so a malformed value stops replication.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.replication import values

_SMALL_OBJECT, _LARGE_OBJECT, _SMALL_ARRAY, _LARGE_ARRAY = 0x00, 0x01, 0x02, 0x03
_LITERAL, _INT16, _UINT16, _INT32, _UINT32 = 0x04, 0x05, 0x06, 0x07, 0x08
_INT64, _UINT64, _DOUBLE, _STRING, _OPAQUE = 0x09, 0x0A, 0x0B, 0x0C, 0x0F


class _Raw:
    """A JSON value already rendered (decimals keep their digits)."""

    def __init__(self, text: str) -> None:
        self.text = text


def binary_json_to_text(data: bytes) -> str:
    if not data:
        return "null"  # MySQL writes an empty value for a JSON NULL literal in some versions
    return _render(_value(data[0], data, 1, len(data)))


def _value(kind: int, buf: bytes, start: int, end: int) -> Any:
    if kind in (_SMALL_OBJECT, _LARGE_OBJECT, _SMALL_ARRAY, _LARGE_ARRAY):
        return _container(kind, buf, start, end)
    if kind == _LITERAL:
        return _literal(buf[start])
    formats = {_INT16: "<h", _UINT16: "<H", _INT32: "<i", _UINT32: "<I", _INT64: "<q",
               _UINT64: "<Q", _DOUBLE: "<d"}
    if kind in formats:
        return struct.unpack_from(formats[kind], buf, start)[0]
    if kind == _STRING:
        length, pos = _varlen(buf, start)
        _need(buf, pos + length, end)
        return buf[pos : pos + length].decode("utf-8")
    if kind == _OPAQUE:
        return _opaque(buf, start, end)
    raise ValueError(f"unknown JSON value type 0x{kind:02x}")


def _container(kind: int, buf: bytes, start: int, end: int) -> Any:
    large = kind in (_LARGE_OBJECT, _LARGE_ARRAY)
    is_object = kind in (_SMALL_OBJECT, _LARGE_OBJECT)
    width = 4 if large else 2
    unsigned = "<I" if large else "<H"
    count = struct.unpack_from(unsigned, buf, start)[0]
    size = struct.unpack_from(unsigned, buf, start + width)[0]
    _need(buf, start + size, end)
    key_entry, value_entry = width + 2, 1 + width
    header = 2 * width + count * value_entry + (count * key_entry if is_object else 0)
    if header > size:
        raise ValueError("JSON container header is larger than the container")
    keys = []
    for i in range(count if is_object else 0):
        entry = start + 2 * width + i * key_entry
        offset = struct.unpack_from(unsigned, buf, entry)[0]
        length = struct.unpack_from("<H", buf, entry + width)[0]
        _need(buf, start + offset + length, start + size)
        keys.append(buf[start + offset : start + offset + length].decode("utf-8"))
    items = []
    values_start = start + 2 * width + (count * key_entry if is_object else 0)
    for i in range(count):
        entry = values_start + i * value_entry
        value_kind = buf[entry]
        inlined = value_kind in (_LITERAL, _INT16, _UINT16) or (
            large and value_kind in (_INT32, _UINT32))
        if inlined:
            items.append(_value(value_kind, buf, entry + 1, entry + value_entry))
        else:
            offset = struct.unpack_from(unsigned, buf, entry + 1)[0]
            if offset >= size:
                raise ValueError("JSON value offset is outside its container")
            items.append(_value(value_kind, buf, start + offset, start + size))
    return dict(zip(keys, items, strict=True)) if is_object else items


def _literal(byte: int) -> Any:
    if byte not in (0, 1, 2):
        raise ValueError(f"unknown JSON literal 0x{byte:02x}")
    return (None, True, False)[byte]


def _varlen(buf: bytes, pos: int) -> tuple[int, int]:
    length = shift = 0
    for _ in range(5):
        byte = buf[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length, pos
        shift += 7
    raise ValueError("JSON string length is longer than 5 bytes")


def _need(buf: bytes, needed: int, end: int) -> None:
    if needed > end or needed > len(buf):
        raise ValueError("JSON value is truncated")


def _opaque(buf: bytes, start: int, end: int) -> Any:
    field_type = buf[start]
    length, pos = _varlen(buf, start + 1)
    _need(buf, pos + length, end)
    raw = buf[pos : pos + length]
    if field_type == T.NEWDECIMAL:
        precision, scale = raw[0], raw[1]
        return _Raw(format(values.DecimalFormat(precision, scale).decode(raw[2:]), "f"))
    if field_type in (T.DATE, T.DATETIME, T.TIMESTAMP, T.TIME):
        return _packed_temporal(field_type, struct.unpack("<q", raw[:8])[0])
    # MySQL prints other opaque values as "base64:typeNN:..." (Json_opaque::to_string).
    return f"base64:type{field_type}:{base64.b64encode(raw).decode('ascii')}"


def _packed_temporal(field_type: int, packed: int) -> str:
    """MySQL's TIME_to_longlong_*_packed: the integer part shifted left 24, then micros."""
    negative = packed < 0
    packed = abs(packed)
    micros, whole = packed & 0xFFFFFF, packed >> 24
    if field_type == T.TIME:
        hours, minutes, seconds = (whole >> 12) & 0x3FF, (whole >> 6) & 63, whole & 63
        text = f"{'-' if negative else ''}{hours:02d}:{minutes:02d}:{seconds:02d}"
        return text + (f".{micros:06d}" if micros else "")
    ymd, hms = whole >> 17, whole & 0x1FFFF
    year, month = divmod(ymd >> 5, 13)
    day = ymd & 31
    text = f"{year:04d}-{month:02d}-{day:02d}"
    if field_type == T.DATE:
        return text
    text += f" {hms >> 12:02d}:{(hms >> 6) & 63:02d}:{hms & 63:02d}"
    return text + (f".{micros:06d}" if micros else "")


def _render(value: Any) -> str:
    """JSON text with MySQL's separators; floats as their shortest round-trip form."""
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_render(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)
