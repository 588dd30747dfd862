"""The values of the service's Kafka message formats (``kafka.py``) back in the change
stream's Python types: dip's text, Debezium's numbers and encodings, and databus's ENUM and
SET codes and column types, for a message that names no schema."""

from __future__ import annotations

import base64
import datetime as dt
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from mariadb_cdc_client.format.dump import decode_value
from mariadb_cdc_client.format.schema import Field, Kind, from_json_value


def from_text(f: Field | None, value: Any) -> Any:
    """A dip value (its column's text; BYTES in hex) in the column's type."""
    if value is None or f is None:
        return value
    if f.kind == Kind.BYTES:
        return bytes.fromhex(value)
    return decode_value(f, value.encode("utf-8"))


_EPOCH = dt.datetime(1970, 1, 1)


def from_debezium(f: Field | None, value: Any) -> Any:
    """A Debezium value (Debezium's encoding of its column's type) in the column's type."""
    if value is None or f is None:
        return value
    k = f.kind
    if k == Kind.DECIMAL:
        if f.real_type == "decimal":
            return Decimal(value)
        n = int(value)  # BIGINT UNSIGNED or BIT(64), as an INT64: above 2^63-1 negative
        return Decimal(n + (1 << 64) if n < 0 else n)
    if k == Kind.FLOAT:
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    if k == Kind.DOUBLE:
        return float(value)
    if k == Kind.BYTES:
        if isinstance(value, dict):  # geometry: {"wkb", "srid"}, srid null for 0
            return int(value["srid"] or 0).to_bytes(4, "little") + \
                base64.b64decode(value["wkb"])
        return base64.b64decode(value)
    if k == Kind.DATE:
        return _EPOCH.date() + dt.timedelta(days=int(value))
    if k == Kind.DATETIME:
        unit = dt.timedelta(milliseconds=1) if f.fsp <= 3 else dt.timedelta(microseconds=1)
        return _EPOCH + int(value) * unit
    if k == Kind.TIMESTAMP:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if k == Kind.TIME:
        return dt.timedelta(microseconds=int(value))
    return from_json_value(k, value)


def databus_labels(column: dict[str, Any]) -> Callable[[bytes], bytes] | None:
    """go-mysql's ENUM index and SET bitmask back to labels. (Messages sent with the
    service's ``databus_labels`` say so in their ``values`` header and are not read here;
    a label in a message from before that header stays a label, unless it is a number.)"""
    enum, members = column.get("EnumValues") or [], column.get("SetValues") or []
    if enum:
        def label(text: bytes) -> bytes:
            if not text.isdigit():
                return text
            n = int(text)
            return enum[n - 1].encode() if 0 < n <= len(enum) else b""
        return label
    if members:
        def chosen(text: bytes) -> bytes:
            if not text.isdigit():
                return text
            mask = int(text)
            return ",".join(m for i, m in enumerate(members) if mask >> i & 1).encode()
        return chosen
    return None


def fields_from_databus(table: dict[str, Any]) -> tuple[Field, ...]:
    """Each column's kind from its ``RawType`` (``SHOW COLUMNS``'s text), for a message
    without a schema: go-mysql's type codes are too coarse (DECIMAL is FLOAT, BLOB is
    STRING)."""
    return tuple(Field(c["Name"], _kind_of_raw_type(c.get("RawType", "")), c["Name"],
                       c.get("RawType", "").split("(")[0].split(" ")[0])
                 for c in table.get("Columns", []))


def _kind_of_raw_type(raw_type: str) -> Kind:
    """The change stream's kind of a ``SHOW COLUMNS`` type: ``int(11)``, ``decimal(8,2)``,
    ``bit(1)``, ``varbinary(16)``, ``datetime(3)``..."""
    name, _, rest = raw_type.lower().partition("(")
    name = name.split(" ")[0]
    width = int(rest.split(")")[0]) if rest.split(")")[0].isdigit() else 0
    if name.endswith("int") or name in ("integer", "year", "serial"):
        return Kind.LONG
    if name in ("float", "double", "real"):
        return Kind.DOUBLE
    if name in ("decimal", "numeric"):
        return Kind.DECIMAL
    if name == "bit":
        return Kind.BOOLEAN if width == 1 else Kind.LONG if width < 64 else Kind.DECIMAL
    kinds = {"date": Kind.DATE, "datetime": Kind.DATETIME, "timestamp": Kind.TIMESTAMP,
             "time": Kind.TIME, "binary": Kind.BYTES, "varbinary": Kind.BYTES,
             "uuid": Kind.UUID}
    if name in kinds:
        return kinds[name]
    if name.endswith("blob") or name in ("geometry", "point", "linestring", "polygon",
                                         "multipoint", "multilinestring", "multipolygon",
                                         "geometrycollection"):
        return Kind.BYTES
    return Kind.STRING
