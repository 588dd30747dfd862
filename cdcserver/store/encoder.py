"""Avro binary encoding of change records, compiled once per table version.

The generated function appends records straight from the replicator's row tuples to a block
buffer: the metadata prefix (domain, server_id, sequence) is encoded once per transaction, the
``timestamp`` and ``event_type`` once per rows event, and each column is a few inlined
operations. Encoding follows the Avro 1.11 specification ("Binary Encoding"): zig-zag varints
for int/long, length-prefixed bytes/strings, union branch index first, decimals as big-endian
two's complement of the unscaled value.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable, Sequence
from decimal import Context, Decimal
from functools import lru_cache
from typing import Any

from cdcserver.core.changes import ColumnDef, EventType
from mariadb_cdc_client.format.gtid import stored_metadata
from mariadb_cdc_client.format.schema import Field, Kind, time_text

RecordsEncoder = Callable[[bytearray, bytes, tuple[bytes, bytes], Sequence[tuple[Any, ...]], int],
                          int]


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


VARINTS = tuple(_varint_bytes(i) for i in range(1 << 14))  # every 14-bit value, terminated
_CONTINUED = tuple(bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14))


def _raw_varint(n: int) -> bytes:
    """Base-128 groups of a non-negative integer, 14 bits per table lookup (microsecond
    timestamps and sequence numbers take three lookups instead of eight byte appends)."""
    out = b""
    while n >= 1 << 14:
        out += _CONTINUED[n & 0x3FFF]
        n >>= 14
    return out + VARINTS[n]


def varint(n: int) -> bytes:
    """A zig-zag encoded Avro long."""
    z = (n << 1) ^ (n >> 63)
    return VARINTS[z] if z < 16384 else _raw_varint(z)


def encode_string(value: str) -> bytes:
    data = value.encode("utf-8")
    return varint(len(data)) + data


_WIDE = Context(prec=200)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_DAY_MICROS = 86_400_000_000


def decimal_bytes(value: Decimal | int, scale: int) -> bytes:
    """Length-prefixed two's complement of the unscaled value (Avro decimal on bytes)."""
    unscaled = value if isinstance(value, int) else int(_WIDE.scaleb(value, scale))
    size = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    data = unscaled.to_bytes(size, "big", signed=True)
    return varint(size) + data


def date_days(value: dt.date) -> int:
    return value.toordinal() - _EPOCH_ORDINAL


def datetime_micros(value: dt.datetime) -> int:
    if value.tzinfo is not None and value.utcoffset():
        value = value.astimezone(dt.UTC)
    return ((value.toordinal() - _EPOCH_ORDINAL) * 86400 + value.hour * 3600
            + value.minute * 60 + value.second) * 1_000_000 + value.microsecond


def timedelta_micros(value: dt.timedelta) -> int:
    return value.days * _DAY_MICROS + value.seconds * 1_000_000 + value.microseconds


def _column_code(field: Field, col: ColumnDef, c: str) -> list[str]:
    """Statements that append column value ``c`` (never None here) to ``out``, starting with
    its union branch index (null is branch 0)."""
    k = field.kind
    if k in (Kind.INT, Kind.LONG):
        return [f"z = ({c} << 1) ^ ({c} >> 63)", "out += B1",
                "out += V[z] if z < 16384 else vz(z)"]
    if k == Kind.BOOLEAN:
        return [f"out += b'\\x02\\x01' if {c} else b'\\x02\\x00'"]
    if k == Kind.FLOAT:
        return ["out += B1", f"out += pack_f({c})"]
    if k == Kind.DOUBLE:
        return ["out += B1", f"out += pack_d({c})"]
    if k == Kind.DECIMAL:
        return ["out += B1", f"out += dec({c}, {field.scale})"]
    if k == Kind.STRING or k == Kind.UUID:
        return [f"b = {c}.encode()", "n = len(b) << 1", "out += B1",
                "out += V[n] if n < 16384 else vz(n)", "out += b"]
    if k == Kind.BYTES:
        return [f"n = len({c}) << 1", "out += B1", "out += V[n] if n < 16384 else vz(n)",
                f"out += {c}"]
    if k == Kind.DATE:
        return _union_or_text(c, [f"out += B1 + lv(days({c}))"])
    if k in (Kind.DATETIME, Kind.TIMESTAMP):
        return _union_or_text(c, [f"out += B1 + lv(micros({c}))"])
    if k == Kind.TIME:
        return [f"t = td({c})",
                "if 0 <= t < DAY:",
                "    out += B1 + lv(t)",
                "else:",
                f"    out += B2 + es(time_text({c}, {field.fsp}))"]
    if k == Kind.NULL:  # only ever None: the branch under "else:" never runs
        return ["pass"]
    raise ValueError(f"no Avro encoding for {col.name!r} ({k})")


def _union_or_text(c: str, typed: list[str]) -> list[str]:
    """Temporal values MariaDB can hold but the logical type cannot (zero dates) arrive as
    text and take the union's ``string`` branch (index 2: null=0, logical=1, string=2)."""
    return [f"if {c}.__class__ is str:", f"    out += B2 + es({c})", "else:",
            *("    " + line for line in typed)]


@lru_cache(maxsize=4096)
def compile_encoder(fields: tuple[Field, ...], columns: tuple[ColumnDef, ...]) -> RecordsEncoder:
    """``encode(out, head, tails, rows, event_number) -> next event_number``.

    ``head`` is the encoded (domain, server_id, sequence); ``tails`` holds the encoded
    (timestamp, event_type) for even and odd rows (they differ only for updates, whose rows
    alternate before/after images).
    """
    ns: dict[str, Any] = {
        "V": VARINTS, "vz": _raw_varint, "lv": varint,
        "es": encode_string, "dec": decimal_bytes, "days": date_days,
        "micros": datetime_micros, "td": timedelta_micros, "time_text": time_text,
        "DAY": _DAY_MICROS, "B0": b"\x00", "B1": b"\x02", "B2": b"\x04",
        "pack_f": struct.Struct("<f").pack, "pack_d": struct.Struct("<d").pack,
    }
    body: list[str] = []
    for i, (field, col) in enumerate(zip(fields, columns, strict=True)):
        code = _column_code(field, col, f"c{i}")
        if not field.nullable:
            body += code
            continue
        body += [f"if c{i} is None:", "    out += B0", "else:"]
        body += ["    " + line for line in code]
    unpack = "".join(f"c{i}, " for i in range(len(columns)))
    src = [
        "def encode(out, head, tails, rows, event_no):",
        "    for i, row in enumerate(rows):",
        f"        {unpack}= row" if columns else "        pass",
        "        out += head",
        "        z = event_no << 1",
        "        out += V[z] if z < 16384 else vz(z)",
        "        event_no += 1",
        "        out += tails[i & 1]",
        *("        " + line for line in body),
        "    return event_no",
    ]
    exec(compile("\n".join(src), "<avro-encoder>", "exec"), ns)
    encoder: RecordsEncoder = ns["encode"]
    return encoder


_EVENT_INDEX = {e: i for i, e in enumerate(EventType)}


def record_head(domain: int, server_id: int, sequence: int) -> bytes:
    """The GTID fields that start every record of a transaction: MaxScale's ``int``,
    ``int`` and ``long``, which hold MariaDB's unsigned numbers as their bit patterns."""
    return b"".join(varint(v) for v in stored_metadata(domain, server_id, sequence))


def record_tail(timestamp: int, event_type: EventType) -> bytes:
    return varint(timestamp) + VARINTS[_EVENT_INDEX[event_type] << 1]

