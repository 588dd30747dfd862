"""Values as ``cdcserver verify`` compares them: each in a form that compares equal exactly
when the values are the same (FLOAT by its 32-bit pattern, DECIMAL by its digits, TIMESTAMP
as an instant), and the value the stream cannot know, which equals anything."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Context, Decimal
from typing import Any

from mariadb_cdc_client.format.schema import Kind

_WIDE = Context(prec=100)  # DECIMAL(65,30) exceeds the default context's 28 digits


def canonical(kind: Kind, value: Any, scale: int = 0) -> Any:
    """One value in a form that compares equal exactly when the values are the same."""
    if value is None:
        return None
    if kind == Kind.FLOAT:
        return struct.pack("<f", value)
    if kind == Kind.DECIMAL:
        # the number, whatever its column's scale: a row sent before a widening has fewer
        # digits after the point than the table shows now
        number = Decimal(value) if scale == 0 else \
            _WIDE.quantize(Decimal(value), Decimal(1).scaleb(-scale))
        return format(number.normalize(_WIDE), "f")
    if kind == Kind.BOOLEAN:
        return int(value)
    if kind == Kind.TIMESTAMP and isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)  # the session reads in UTC
        return value.astimezone(dt.UTC)
    if kind == Kind.UUID:
        return str(value)
    if kind == Kind.BYTES and isinstance(value, bytearray):
        return bytes(value)
    return value


class _Unknown:
    """A value the stream cannot know: a column added after the row was last written (its
    value in the table comes from the column's default, which no row event carried)."""

    def __repr__(self) -> str:
        return "?"


UNKNOWN = _Unknown()


def same(stream: tuple[Any, ...], table: tuple[Any, ...]) -> bool:
    """Whether a row of the stream is the table's: a value it cannot know matches any."""
    return all(a is UNKNOWN or a == b for a, b in zip(stream, table, strict=True))
