"""The dump file format: a header line, then JSON row operations with base64 values.

    {"format": "cdc-dump/1", "database": ..., "table": ..., "schema": {...}, "gtid": "0-1-57",
     "binlog": {"file": "mysql-bin.000003", "pos": 1234}, "rows": 200000,
     "checksum": "sha256:...", "created": "2026-11-21T09:30:00Z", "stream_version": 3}
    {"action": "insert", "rows": [["MQ==", "YWRh", null], ["Mg==", "Ym9i", "MS41MA=="]]}
    ...

The header describes a table consistent at one binlog position (``binlog``) and GTID state
(``gtid``); ``schema`` is the table's Avro schema, as in the change stream; ``checksum`` covers
every byte after the header line; ``stream_version`` is the table's newest stored version when
the dump began (a hint: the changes after the dump, ``REQUEST-DATA db.table AFTER <gtid>``,
start in that version or a later one).

Each following line is one operation on some rows (the seed's RowsEvent: an action and rows).
A value is the base64 of the column's text form as MariaDB prints it (binary columns: the raw
bytes; FLOAT: the exact double of its 32-bit value; TIMESTAMP: UTC; BIT: the number), or null.
Dumps are ``insert``-only, except one resumed after a crash, which also holds ``update``
(rows in before/after pairs) and ``delete`` operations for changes made while it was stopped:
apply them in order, as upserts, to get the table at the header's position.

Where the compiled decoder (``_dumprows.pyx``) is built, a line is read in C into the same
``DumpRows``, several times faster; a line it does not read exactly as the Python path would
goes to the Python path (``DECODING`` says which path a new ``DumpDecoder`` takes;
``CDC_PURE_PYTHON`` keeps it on Python).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import re
import struct
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.schema import (
    Field,
    Kind,
    datetime_text,
    fields_from_schema,
    parse_time,
    time_text,
)

# the compiled decoder (client/format/_dumprows.pyx): the same rows, several times faster
_dumprows = compiled_module("mariadb_cdc_client.format._dumprows")

_compiled = _dumprows  # what a new DumpDecoder parses lines with (a test sets None: Python)
DECODING = "C" if _compiled is not None else "Python"  # what a dump's lines are parsed by

FORMAT = "cdc-dump/1"


@dataclass(frozen=True)
class DumpHeader:
    database: str
    table: str
    schema: dict[str, Any]
    gtid: str
    binlog_file: str
    binlog_pos: int
    rows: int
    checksum: str
    created: str
    stream_version: int
    consistent: bool = True  # False: a non-transactional table, read while it changed
    resumed: bool = False  # holds update/delete operations after its inserts
    fields: tuple[Field, ...] = field(repr=False, default=())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DumpHeader:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} dump header: format {data.get('format')!r}")
        return cls(data["database"], data["table"], data["schema"], data["gtid"],
                   data["binlog"]["file"], int(data["binlog"]["pos"]), int(data["rows"]),
                   data["checksum"], data["created"], int(data["stream_version"]),
                   bool(data.get("consistent", True)), bool(data.get("resumed", False)),
                   fields_from_schema(data["schema"]))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "database": self.database, "table": self.table,
                "gtid": self.gtid, "binlog": {"file": self.binlog_file, "pos": self.binlog_pos},
                "rows": self.rows, "checksum": self.checksum, "created": self.created,
                "stream_version": self.stream_version, "consistent": self.consistent,
                "resumed": self.resumed, "schema": self.schema}

    @property
    def columns(self) -> tuple[Field, ...]:
        return self.fields[6:]


@dataclass(frozen=True)
class DumpRows:
    """One operation: ``insert`` or ``delete`` rows, or ``update`` rows as (before, after)
    pairs in ``rows``; each row a dict of typed values by column name."""

    action: str
    rows: list[dict[str, Any]]


# -- values ------------------------------------------------------------------------------

def decode_value(f: Field, raw: bytes) -> Any:
    """A dump value (already base64-decoded) as the change stream's Python type."""
    return value_decoder(f)(raw)


def value_decoder(f: Field) -> Callable[[bytes], Any]:
    """The decoding of one column's values, chosen once (a dump has many rows)."""
    kind = f.kind
    if kind == Kind.BYTES:
        return bytes
    if kind in (Kind.INT, Kind.LONG):
        return int  # int() reads ASCII digits from bytes
    if kind == Kind.DECIMAL:
        return lambda raw: Decimal(raw.decode("ascii"))
    if kind == Kind.DOUBLE:
        return float
    if kind == Kind.FLOAT:
        return lambda raw: _FLOAT32.unpack(_FLOAT32.pack(float(raw)))[0]
    if kind == Kind.BOOLEAN:
        return lambda raw: raw != b"0"
    if kind == Kind.UUID:
        return lambda raw: uuid.UUID(raw.decode("ascii"))
    if kind == Kind.TIME:
        return lambda raw: parse_time(raw.decode("ascii"))
    if kind in (Kind.DATE, Kind.DATETIME, Kind.TIMESTAMP):
        return lambda raw: _temporal(kind, raw.decode("ascii"))
    return lambda raw: raw.decode("utf-8")


_FLOAT32 = struct.Struct("<f")


def _temporal(kind: Kind, text: str) -> Any:
    try:
        value: Any = (dt.date.fromisoformat(text) if kind == Kind.DATE
                      else dt.datetime.fromisoformat(text))
    except ValueError:
        return text  # a zero or partial date stays MariaDB's text, as in the stream
    return value.replace(tzinfo=dt.UTC) if kind == Kind.TIMESTAMP else value


def encode_value(f: Field, value: Any) -> bytes:
    """The inverse of :func:`decode_value`: a typed value's text form, as MariaDB prints it."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, Decimal):
        return format(value, "f").encode()
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return datetime_text(value, f.fsp).encode()
    if isinstance(value, dt.date):
        return value.isoformat().encode()
    if isinstance(value, dt.timedelta):
        return time_text(value, f.fsp).encode()
    if isinstance(value, dt.time):
        return time_text(dt.timedelta(hours=value.hour, minutes=value.minute,
                                      seconds=value.second, microseconds=value.microsecond),
                         f.fsp).encode()
    return str(value).encode()


def value_encoder(f: Field) -> Callable[[Any], bytes]:
    """:func:`encode_value` for one column, chosen once: a fast path for the type the column
    holds, the general function for anything else (a zero date held as text, say)."""
    kind = f.kind

    def general(v: Any) -> bytes:
        return encode_value(f, v)

    if kind in (Kind.INT, Kind.LONG):
        return lambda v: b"%d" % v if type(v) is int else general(v)
    if kind in (Kind.STRING, Kind.ENUM):
        return lambda v: v.encode("utf-8") if type(v) is str else general(v)
    if kind == Kind.BYTES:
        return lambda v: v if type(v) is bytes else general(v)
    if kind == Kind.DOUBLE:
        return lambda v: repr(v).encode() if type(v) is float else general(v)
    spec = {0: "seconds", 3: "milliseconds", 6: "microseconds"}.get(f.fsp)
    if kind == Kind.DATETIME and spec is not None:
        return lambda v: (v.isoformat(" ", spec).encode()
                          if type(v) is dt.datetime and v.tzinfo is None else general(v))
    return general


def encode_row(fields: tuple[Field, ...], row: dict[str, Any]) -> bytes:
    return json.dumps([None if row.get(f.column) is None else
                       base64.b64encode(encode_value(f, row[f.column])).decode("ascii")
                       for f in fields], separators=(",", ":")).encode()


def operation_line(action: str, rows: list[bytes]) -> bytes:
    """A line for rows already encoded as JSON arrays."""
    return b'{"action":"' + action.encode() + b'","rows":[' + b",".join(rows) + b"]}\n"


# -- reading -----------------------------------------------------------------------------

def parse_operation(header: DumpHeader, line: bytes) -> DumpRows:
    return _OperationParser(header).parse(line)


# Column operations of _dumprows.pyx (its enum; keep in step).
_C_INT, _C_DECIMAL, _C_DOUBLE, _C_FLOAT, _C_BOOLEAN, _C_STRING, _C_BYTES = 1, 2, 3, 4, 5, 6, 7
_C_DATE, _C_DATETIME, _C_TIMESTAMP, _C_CALL = 8, 9, 10, 11
# The operation making a kind's values; the other kinds (TIME, UUID) call the column's
# value_decoder from C.
_C_OPS = {Kind.INT: _C_INT, Kind.LONG: _C_INT, Kind.DECIMAL: _C_DECIMAL, Kind.DOUBLE: _C_DOUBLE,
          Kind.FLOAT: _C_FLOAT, Kind.BOOLEAN: _C_BOOLEAN, Kind.STRING: _C_STRING,
          Kind.ENUM: _C_STRING, Kind.NULL: _C_STRING, Kind.BYTES: _C_BYTES,
          Kind.DATE: _C_DATE, Kind.DATETIME: _C_DATETIME, Kind.TIMESTAMP: _C_TIMESTAMP}


def compiled_rows_parser(fields: Sequence[Field], names: Sequence[str]) -> Any:
    """The compiled decoder of operation lines whose rows hold ``fields``, the rows as dicts
    keyed by ``names`` (``parse(line) -> DumpRows``, or None for a line it hands back to the
    Python path); None where it is not built."""
    if _compiled is None:
        return None
    return _compiled.OperationDecoder(
        [(_C_OPS.get(f.kind, _C_CALL), name, value_decoder(f))
         for f, name in zip(fields, names, strict=True)], DumpRows)


class _OperationParser:
    """A dump's operation lines as ``DumpRows``: by the compiled decoder where it is built,
    and by ``json`` and each column's ``value_decoder`` for the lines it hands back (or all of
    them without it), which give the same rows, or raise the error, the Python path always
    gave."""

    def __init__(self, header: DumpHeader) -> None:
        self.names = [f.column for f in header.columns]
        self.decoders = [value_decoder(f) for f in header.columns]
        self.compiled = compiled_rows_parser(header.columns, self.names)

    def parse(self, line: bytes) -> DumpRows:
        if self.compiled is not None:
            rows: DumpRows | None = self.compiled.parse(line)
            if rows is not None:
                return rows
        return self.parse_in_python(line)

    def parse_in_python(self, line: bytes) -> DumpRows:
        doc = json.loads(line)
        names, decoders = self.names, self.decoders
        width = len(names)
        b64 = binascii.a2b_base64
        rows = []
        for raw in doc["rows"]:
            if len(raw) != width:
                raise ValueError(f"a dump row has {len(raw)} values for {width} columns")
            rows.append({name: None if v is None else decode(b64(v))
                         for name, decode, v in zip(names, decoders, raw)})  # noqa: B905
        return DumpRows(doc["action"], rows)


class DumpError(ValueError):
    """A dump that is truncated or does not match its checksum, or a server's answer that
    is not a dump."""


# A dump's name as the service writes it (protocol.md, REQUEST-DUMP): each name's characters
# outside [A-Za-z0-9_$-] escaped as @ and four hex digits (a long one shortened with ~), so
# it holds no path separator and is never a hidden file's name.
DUMP_NAME = re.compile(r"[A-Za-z0-9_$@~-]+\.[A-Za-z0-9_$@~-]+\.[0-9]{8}T[0-9]{6}-[0-9]{6}Z\.dump")
MAX_DUMP_BYTES = 1 << 62


def dump_reply(text: str) -> tuple[int, str]:
    """(bytes, name) of REQUEST-DUMP's ``OK <bytes> <name>``. The name is the file a client
    saves it as by default, so anything but a dump's name is refused: a server must not
    choose where a client writes (``../../.bashrc``)."""
    size, _, name = text.partition(" ")
    if not size.isascii() or not size.isdigit() or int(size) > MAX_DUMP_BYTES:
        raise DumpError(f"the server's answer to REQUEST-DUMP is not OK <bytes> <name>: "
                        f"{_shown(text)}")
    if len(name) > 255 or not DUMP_NAME.fullmatch(name):
        raise DumpError(f"the server named the dump {_shown(name)}, which is not a dump's "
                        "name (db.table.YYYYmmddTHHMMSS-ffffffZ.dump)")
    return int(size), name


def _shown(text: str, limit: int = 120) -> str:
    """``text`` quoted for a message, escaped and cut."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


class _Digest:
    """SHA-256 of a dump's body, taken beside the decoding: large pieces are hashed by one
    worker thread, in the order given (hashlib lets other threads run while it hashes more
    than 2 KiB), so on two cores the checksum costs the decoding nothing; a fifth of the
    compiled reader's time when it was taken in line."""

    THREADED = 1 << 16  # pieces from this size go to the worker

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._worker: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) < self.THREADED and self._last is None:
            self._sha.update(data)
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="dump-sha256")
        self._last = self._worker.submit(self._sha.update, bytes(data))  # a copy it keeps

    def hexdigest(self) -> str:
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # every piece hashed, in order
            if self._last is not None:
                self._last.result()
            self._worker = self._last = None
        return self._sha.hexdigest()


def _header(line: bytes) -> DumpHeader:
    try:
        return DumpHeader.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DumpError(f"the dump's first line is not a dump header ({exc!r:.200})") from None


class DumpDecoder:
    """Sans-IO: feed a dump's bytes, get the header and then the operations; ``finish()``
    checks that the body was whole and matches the header's checksum."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._digest = _Digest()
        self.header: DumpHeader | None = None
        self._parser: _OperationParser | None = None
        self.received = 0

    def feed(self, data: bytes) -> Iterator[DumpHeader | DumpRows]:
        self.received += len(data)
        if self.header is not None:
            self._digest.update(data)
        self._buffer += data
        while (newline := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if self.header is None:
                self.header = _header(line)
                self._parser = _OperationParser(self.header)
                self._digest.update(self._buffer)  # the body bytes already here
                yield self.header
            elif line.strip():
                assert self._parser is not None
                yield self._parser.parse(line)

    def finish(self) -> DumpHeader:
        if self.header is None or self._buffer.strip():
            raise DumpError("the dump ended in the middle of a line")
        actual = "sha256:" + self._digest.hexdigest()
        if actual != self.header.checksum:
            raise DumpError(f"the dump's checksum is {actual}, its header says "
                            f"{self.header.checksum}")
        return self.header
