"""What a CDC table schema means: each field's kind, and its JSON rendering both ways.

A table version's schema is an Avro record (MaxScale's ``.avsc`` layout): six metadata fields,
then one ``["null", ...]`` union per column. The column's Avro type, plus the ``real_type`` and
``fsp`` attributes, fix how its values are rendered in JSON mode and decoded by clients. The
server renders with :func:`to_json_text` and clients decode with :func:`from_json_value`, so
the two can never disagree. ``protocol.md`` ("Type mapping") documents the same table.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import uuid
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

METADATA_FIELDS = ("domain", "server_id", "sequence", "event_number", "timestamp", "event_type")
EVENT_TYPES = ("insert", "update_before", "update_after", "delete")


class Kind(StrEnum):
    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL = "decimal"
    STRING = "string"
    BYTES = "bytes"
    UUID = "uuid"
    DATE = "date"
    DATETIME = "datetime"
    TIMESTAMP = "timestamp"
    TIME = "time"
    ENUM = "enum"
    NULL = "null"


@dataclass(frozen=True, slots=True)
class Field:
    name: str  # the Avro field name (MaxScale's: sanitised, reserved names suffixed with _)
    kind: Kind
    column: str  # the column's name in the database
    real_type: str = ""
    fsp: int = 0
    precision: int = 0
    scale: int = 0
    nullable: bool = True


_LOGICAL_KINDS = {
    "date": Kind.DATE, "local-timestamp-micros": Kind.DATETIME,
    "timestamp-micros": Kind.TIMESTAMP, "time-micros": Kind.TIME, "uuid": Kind.UUID,
    "decimal": Kind.DECIMAL,
}


_KINDS = {kind.value: kind for kind in Kind}  # a dict lookup: Kind(...) is ten times slower


def _kind(name: str) -> Kind:
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"{name!r} is not a type of a stored column") from None


def _branch_kind(branch: Any) -> tuple[Kind, int, int]:
    if isinstance(branch, str):
        return _kind(branch), 0, 0
    logical = branch.get("logicalType")
    if logical in _LOGICAL_KINDS:
        return _LOGICAL_KINDS[logical], branch.get("precision", 0), branch.get("scale", 0)
    if branch.get("type") == "enum":
        return Kind.ENUM, 0, 0
    return _kind(branch["type"]), 0, 0


def field_from_avro(spec: dict[str, Any]) -> Field:
    avro_type = spec["type"]
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    nullable = "null" in branches
    typed = [b for b in branches if b != "null"] or ["null"]
    kind, precision, scale = _branch_kind(typed[0])
    return Field(spec["name"], kind, spec.get("column", spec["name"]),
                 spec.get("real_type", ""), spec.get("fsp", 0), precision, scale, nullable)


def fields_from_schema(schema: dict[str, Any]) -> tuple[Field, ...]:
    return tuple(field_from_avro(f) for f in schema["fields"])


# -- JSON rendering (server side) ------------------------------------------------------

def float32_text(value: float) -> str:
    """The shortest decimal that reads back as the same 32-bit float (MariaDB prints FLOAT
    this way; Python's repr would show the float64 expansion). A double that is not a
    float32 is taken as the float32 nearest it, and printed as that: 78375862.0 as
    ``78375864``, the text of the float32 it becomes, whichever double it came from."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("FLOAT value is not finite")
    packed = struct.pack("<f", value)
    value = struct.unpack("<f", packed)[0]
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        try:
            if struct.pack("<f", float(text)) == packed:
                return text
        except OverflowError:  # rounded past the largest float near FLT_MAX
            continue
    return repr(value)


def _fraction(micros: int, fsp: int) -> str:
    return f".{micros:06d}"[: fsp + 1] if fsp else ""


def time_text(value: dt.timedelta, fsp: int) -> str:
    """TIME as MariaDB prints it: ``[-]HH:MM:SS[.fraction]``, hours may exceed 24."""
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, frac = divmod(abs(micros), 1_000_000)
    hours, rest = divmod(seconds, 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}{_fraction(frac, fsp)}"


def datetime_text(value: dt.datetime, fsp: int) -> str:
    text = f"{value.year:04d}-{value.month:02d}-{value.day:02d} " \
           f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    text += _fraction(value.microsecond, fsp)
    if value.tzinfo is not None:
        offset = value.utcoffset() or dt.timedelta(0)
        minutes = int(offset.total_seconds()) // 60
        text += f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return text


def to_json_text(kind: Kind, value: Any, fsp: int = 0,
                 zone: dt.tzinfo = dt.UTC) -> str:
    """One column value as JSON text. ``value`` is what fastavro reads for the column."""
    if value is None:
        return "null"
    if isinstance(value, str):  # strings, and temporal values outside the logical type's range
        return json.dumps(value, ensure_ascii=False)
    if kind in (Kind.INT, Kind.LONG):
        return str(value)
    if kind == Kind.BOOLEAN:
        return "true" if value else "false"
    if kind == Kind.DOUBLE:
        return repr(value)
    if kind == Kind.FLOAT:
        return float32_text(value)
    if kind == Kind.DECIMAL:  # an int (BIGINT UNSIGNED, BIT) would go through float with "f"
        return str(value) if isinstance(value, int) else format(value, "f")
    if kind == Kind.BYTES:
        return '"' + value.hex() + '"'
    if kind == Kind.UUID:
        return f'"{value}"'
    if kind == Kind.DATE:
        return f'"{value.isoformat()}"'
    if kind == Kind.DATETIME:
        return f'"{datetime_text(value, fsp)}"'
    if kind == Kind.TIMESTAMP:
        return f'"{datetime_text(value.astimezone(zone), fsp)}"'
    if kind == Kind.TIME:
        if isinstance(value, dt.time):
            value = dt.timedelta(hours=value.hour, minutes=value.minute, seconds=value.second,
                                 microseconds=value.microsecond)
        return f'"{time_text(value, fsp)}"'
    return json.dumps(value, ensure_ascii=False)


# -- JSON decoding (client side) -------------------------------------------------------

def parse_time(text: str) -> dt.timedelta:
    """MariaDB's TIME text (``[-]HH:MM:SS[.fraction]``, hours may exceed 24)."""
    sign = -1 if text.startswith("-") else 1
    hours, minutes, rest = text.lstrip("-").split(":")
    seconds, _, frac = rest.partition(".")
    micros = int((frac + "000000")[:6]) if frac else 0
    return sign * dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=int(seconds),
                               microseconds=micros)


def _parse_datetime(text: str) -> dt.datetime | str:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return text  # a zero or partial date ("0000-00-00 00:00:00") stays MariaDB's text


def from_json_value(kind: Kind, value: Any) -> Any:
    """Turn a JSON-mode value (parsed with ``parse_float=Decimal``) back into its type."""
    if value is None:
        return None
    if kind == Kind.DECIMAL:
        return Decimal(value)
    if kind == Kind.DOUBLE:
        return float(value)
    if kind == Kind.FLOAT:  # the 32-bit value the shortest text stands for, as AVRO gives it
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    if kind == Kind.BYTES:
        return bytes.fromhex(value)
    if kind == Kind.UUID:
        return uuid.UUID(value)
    if kind == Kind.DATE:
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            return value
    if kind in (Kind.DATETIME, Kind.TIMESTAMP):
        return _parse_datetime(value)
    if kind == Kind.TIME:
        return parse_time(value)
    return value


def from_avro_value(kind: Kind, value: Any) -> Any:
    """Normalise a value fastavro decoded from the AVRO stream to the JSON-mode types."""
    if kind == Kind.TIME and isinstance(value, dt.time):
        return dt.timedelta(hours=value.hour, minutes=value.minute, seconds=value.second,
                            microseconds=value.microsecond)
    if kind == Kind.TIME and isinstance(value, str):
        return parse_time(value)
    if kind == Kind.UUID and isinstance(value, str):
        return uuid.UUID(value)
    return value
