"""Values read back (from the source's text protocol, or from the store's Avro) as the
replication's Python values: the types the binlog decoder gives (``replication/rowcodec.py``),
so that a row read again compares equal to the same row decoded from the binlog, and can be
written by the store's encoder like any other.

Where the dump's text decoding (``mariadb_cdc_client.format.dump.value_decoder``) and
fastavro differ from the binlog decoder: ``BIT(1)`` is an ``int`` (0 or 1), ``BIGINT UNSIGNED``
and ``BIT(64)`` are ``int`` (their Avro type is a decimal), ``UUID`` is its text, ``TIME`` a
``timedelta``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mariadb_cdc_client.format.dump import value_decoder
from mariadb_cdc_client.format.schema import Field, Kind, from_avro_value

Convert = Callable[[Any], Any]
_WHOLE_NUMBERS = frozenset({"bigint", "bit"})  # real_type of the decimal(20,0) columns


def from_text(field: Field) -> Convert:
    """A value as the text protocol carries it (``None`` for NULL) to the binlog's type."""
    decode = value_decoder(field)
    adapt = adapter(field)

    def convert(raw: bytes | None) -> Any:
        return None if raw is None else adapt(decode(raw))

    return convert


def from_avro(field: Field) -> Convert:
    """A value fastavro decoded from a stored record to the binlog's type."""
    adapt = adapter(field)
    kind = field.kind

    def convert(value: Any) -> Any:
        return None if value is None else adapt(from_avro_value(kind, value))

    return convert


def adapter(field: Field) -> Convert:
    if field.kind == Kind.BOOLEAN:
        return int
    if field.kind == Kind.DECIMAL and field.real_type in _WHOLE_NUMBERS:
        return int
    if field.kind == Kind.UUID:
        return str
    return same_value


def same_value(value: Any) -> Any:
    return value
