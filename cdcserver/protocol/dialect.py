"""JSON dialects: what a JSON-mode client is sent, schema line and values.

``exact`` is the stored schema as it is (logical types, a text branch for MariaDB's zero
dates) and every value in its own type. ``maxscale`` is shaped for the clients written against
MaxScale, which cannot ask for anything: every column a two-branch union ``["null",
primitive]`` with MaxScale's keys in MaxScale's order, and values their parsers take:

* jansson (MaxScale's C++ connector) refuses integers outside int64, so a BIGINT UNSIGNED or
  BIT(64) value above 2^63-1 is sent as a string of its digits, and its field says so
  (``"beyond_long": "string"``);
* a DECIMAL whose digits a double cannot hold (precision above 15) is a string, its schema
  type ``string``; the others are numbers with their exact digits, as ``double``;
* gomaxscale frames objects by counting braces, strings included, so ``{`` and ``}`` inside
  strings are written ``\\u007b`` and ``\\u007d`` (the same JSON value);
* MaxScale 2.5's ``cdc.py`` and gomaxscale v1 take a first read holding the letters ``err``
  in any case for an error (a column named ``error``, a DDL statement's ``COMMENT 'preferred
  number'``), so the second ``r`` of each is written ``\\u0072`` (``R``: ``\\u0052``) inside
  strings, keys included;
* temporal values are strings, as MaxScale's were: MariaDB's own text (the column's fractional
  digits, zero dates as MariaDB prints them), TIMESTAMP without an offset (in
  ``timestamp_zone``, UTC by default); YEAR is a four-digit string.

protocol.md ("JSON dialects") lists each type in both.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdcserver.core.names import TableName
from mariadb_cdc_client.format.schema import Field, Kind, datetime_text, to_json_text
from mariadb_cdc_client.format.wire import Dialect

INT64_MAX = (1 << 63) - 1
DOUBLE_DIGITS = 15  # every decimal of at most this many digits survives a double


@dataclass(frozen=True)
class JsonStyle:
    """How one JSON-mode stream is rendered: the dialect and the zone TIMESTAMPs are shown in."""

    dialect: Dialect = Dialect.EXACT
    zone: dt.tzinfo = dt.UTC


def unsigned_64(field: Field) -> bool:
    """BIGINT UNSIGNED and BIT(64): stored as decimal(20,0), numbers in MaxScale's schema."""
    return field.kind == Kind.DECIMAL and field.real_type in ("bigint", "bit")


def maxscale_type(field: Field) -> str:
    """The primitive a MaxScale-dialect schema gives a column."""
    kind = field.kind
    if kind == Kind.DECIMAL:
        if unsigned_64(field):
            return "long"
        return "double" if field.precision <= DOUBLE_DIGITS else "string"
    if field.real_type == "year":
        return "string"
    if kind in (Kind.INT, Kind.LONG, Kind.FLOAT, Kind.DOUBLE, Kind.BOOLEAN, Kind.BYTES):
        return kind.value
    return "string"  # strings, UUID, ENUM/SET, dates and times


_MAXSCALE_KEYS = ("name", "type", "real_type", "length", "unsigned")


def maxscale_schema(avsc: dict[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    """The stored schema in MaxScale's shape: its top-level keys first, in its order, then
    the extensions; each column ``["null", primitive]`` with MaxScale's keys first."""
    top = ("namespace", "type", "name", "table", "database", "version", "gtid")
    out: dict[str, Any] = {k: avsc[k] for k in top if k in avsc}
    columns = []
    for spec, field in zip(avsc["fields"], fields, strict=True):
        if not isinstance(spec["type"], list):  # the metadata fields: MaxScale's already
            columns.append(spec)
            continue
        column: dict[str, Any] = {"name": spec["name"],
                                  "type": ["null", maxscale_type(field)]
                                  if field.kind != Kind.NULL else ["null"]}
        column.update((k, spec[k]) for k in _MAXSCALE_KEYS[2:] if k in spec)
        column.update((k, v) for k, v in spec.items() if k not in _MAXSCALE_KEYS)
        if unsigned_64(field):
            column["beyond_long"] = "string"
        columns.append(column)
    out["fields"] = columns
    out.update((k, v) for k, v in avsc.items() if k not in out)
    return out


def maxscale_safe(json_text: str) -> str:
    """JSON text with ``{``, ``}`` and the second ``r`` of ``err`` (any case) inside strings
    escaped (``\\u007b``, ``\\u007d``, ``\\u0072``/``\\u0052``). Outside strings a JSON text
    built by json.dumps has braces only as structure and no such letters; inside, the
    escapes are the same value to every JSON parser, and keep brace-counting framers
    (gomaxscale's) in step and clients that look for ``err`` in a reply (2.5's ``cdc.py``,
    gomaxscale v1) from taking data for an error. The letters are looked for in the text as
    written, escapes included (``\\u001e`` then ``rr``)."""
    if "{" not in json_text and "}" not in json_text and "rr" not in json_text.lower():
        return json_text
    return safe_strings(json_text, in_string=False)[0]


def safe_strings(text: str, in_string: bool, recent: str = "") -> tuple[str, str]:
    """:func:`maxscale_safe` of ``text``, which starts inside a string if ``in_string``
    (after ``recent``, the string's last two characters written before it); returns the
    text and its own last two characters (a string sent in pieces carries them on)."""
    out, escaped = [], False
    for ch in text:
        if not in_string:
            in_string, recent = ch == '"', ""
        elif escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_string = False
        elif ch == "{":
            ch = "\\u007b"
        elif ch == "}":
            ch = "\\u007d"
        elif ch in "rR" and recent.lower() == "er":
            ch = f"\\u{ord(ch):04x}"
        if in_string:
            recent = (recent + ch)[-2:]
        out.append(ch)
    return "".join(out), recent


_RENAMES = ("renamed_from", "renamed_to")


def _renames_as_references(avsc: dict[str, Any]) -> dict[str, Any]:
    """A version a rename made names the other table as a reference a client can request;
    one stored by 0.1.0 has it unquoted (``shop.my table``), and says so now as later ones
    do (``shop.`my table```)."""
    ddl = avsc.get("ddl")
    if not isinstance(ddl, dict) or not any(ddl.get(k) for k in _RENAMES):
        return avsc
    ddl = {k: TableName.from_ref(v).ref() if k in _RENAMES and v else v for k, v in ddl.items()}
    return {**avsc, "ddl": ddl}


def schema_line(avsc: dict[str, Any], fields: tuple[Field, ...], dialect: Dialect) -> bytes:
    """The schema line JSON mode sends first for a version (compact, as MaxScale 2.5+)."""
    avsc = _renames_as_references(avsc)
    if dialect == Dialect.EXACT:
        return json.dumps(avsc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    text = json.dumps(maxscale_schema(avsc, fields), separators=(",", ":"), ensure_ascii=False)
    return maxscale_safe(text).encode() + b"\n"


def maxscale_text(field: Field, value: Any, zone: dt.tzinfo) -> str:
    """One column value in the MaxScale dialect. ``value`` is what fastavro reads."""
    if value is None:
        return "null"
    kind = field.kind
    if isinstance(value, str):  # strings, and MariaDB's text of a zero date
        return maxscale_safe(json.dumps(value, ensure_ascii=False))
    if kind == Kind.DECIMAL:
        text = str(value) if isinstance(value, int) else format(Decimal(value), "f")
        if unsigned_64(field):
            return text if value <= INT64_MAX else f'"{text}"'
        return text if field.precision <= DOUBLE_DIGITS else f'"{text}"'
    if field.real_type == "year":
        return f'"{value:04d}"'
    if kind == Kind.TIMESTAMP:
        return f'"{datetime_text(value.astimezone(zone).replace(tzinfo=None), field.fsp)}"'
    return to_json_text(kind, value, field.fsp, zone)
