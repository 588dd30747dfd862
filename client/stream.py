"""Decoding a ``REQUEST-DATA`` stream, without I/O: feed bytes, get events.

Both modes yield the same events: :class:`SchemaChange` when a table version's schema arrives
(at the start and on every version rollover) and :class:`ChangeRecord` for each record, with
column values in their Python types (``protocol.md``, "Type mapping").

JSON mode is one JSON document per line: a schema (``{"namespace": ...``) or a record. AVRO
mode is an Avro container header per version followed by whole blocks; a new header starts with
``Obj\\x01`` where the next block would, which no block can (its record count would be
negative).
"""

from __future__ import annotations

import functools
import io
import json
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

from mariadb_cdc_client.format.avro import (
    MAGIC,
    SYNC_SIZE,
    AvroFormatError,
    Header,
    block_at,
    decompress,
    parse_header,
)
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.gtid import unsigned_metadata
from mariadb_cdc_client.format.schema import (
    METADATA_FIELDS,
    Field,
    Kind,
    fields_from_schema,
    from_avro_value,
    from_json_value,
    parse_time,
)
from mariadb_cdc_client.format.wire import Code, ProtocolError, parse_reply

# the compiled decoder (client/format/_records.pyx): the same records, in C
_records = compiled_module("mariadb_cdc_client.format._records")

DECODING = "C" if _records is not None else "Python"  # what an AVRO stream is decoded by


@dataclass(frozen=True)
class SchemaChange:
    """A table version's schema: the stream now carries records of this version."""

    database: str
    table: str
    version: int
    gtid: str
    schema: dict[str, Any]
    fields: tuple[Field, ...] = field(repr=False)

    @classmethod
    def from_schema(cls, schema: dict[str, Any]) -> SchemaChange:
        return cls(str(schema.get("database", "")), str(schema.get("table", "")),
                   int(schema.get("version", 0)), str(schema.get("gtid", "")), schema,
                   fields_from_schema(schema))

    @property
    def columns(self) -> tuple[Field, ...]:
        return self.fields[len(METADATA_FIELDS):]


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    database: str
    table: str
    version: int
    domain: int
    server_id: int
    sequence: int
    event_number: int
    timestamp: int
    event_type: str
    values: dict[str, Any]  # by column name
    # Set on a record the binlog did not carry: the service re-read the row from the source
    # to repair a change made without row events ({"reason": ..., "cause": GTID}).
    repair: dict[str, Any] | None = None

    @property
    def gtid(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.sequence}"

    @property
    def position(self) -> tuple[int, int, int]:
        """(domain, sequence, event_number): the record's place in its domain's history, where
        the domain's sequence numbers grow (``gtid_strict_mode``; without it a number can go
        down, and only the stream's order tells)."""
        return self.domain, self.sequence, self.event_number


Event = SchemaChange | ChangeRecord
REPAIR_KEY = "cdc:repair"  # in JSON mode, on a record a repair added (protocol.md)


def holds_records(batch: list[Event]) -> bool:
    """Whether a decoder's batch holds records (not only a schema)."""
    return any(not isinstance(event, SchemaChange) for event in batch)


def _record(schema: SchemaChange, data: dict[str, Any], convert: Any) -> ChangeRecord:
    values = {f.column: convert(f.kind, data.get(f.name)) for f in schema.columns}
    return ChangeRecord(schema.database, schema.table, schema.version, data["domain"],
                        data["server_id"], data["sequence"], data["event_number"],
                        data["timestamp"], data["event_type"], values, data.get(REPAIR_KEY))


# The kinds whose JSON value is already the typed one (from_json_value returns it as is)
_AS_PARSED = frozenset({Kind.INT, Kind.LONG, Kind.STRING, Kind.ENUM, Kind.BOOLEAN, Kind.NULL})


class _JsonRecords:
    """One version's JSON records as ChangeRecords: :func:`_record` with ``from_json_value``,
    its work chosen once per column (most columns need none) and the record made by the
    compiled decoder where it is built."""

    def __init__(self, schema: SchemaChange) -> None:
        self.schema = schema
        self.plain = [(f.name, f.column) for f in schema.columns if f.kind in _AS_PARSED]
        self.converted = [(f.name, f.column, f.kind) for f in schema.columns
                          if f.kind not in _AS_PARSED]
        self.order = [f.column for f in schema.columns]
        compiled = compiled_decoder(schema)
        self.make = compiled.record if compiled is not None else self._made

    def __call__(self, data: dict[str, Any]) -> ChangeRecord:
        values = {column: data.get(name) for name, column in self.plain}
        if self.converted:
            for name, column, kind in self.converted:
                values[column] = from_json_value(kind, data.get(name))
            values = {column: values[column] for column in self.order}  # the schema's order
        return self.make(data["domain"], data["server_id"], data["sequence"],
                         data["event_number"], data["timestamp"], data["event_type"], values,
                         data.get(REPAIR_KEY))

    def _made(self, *fields: Any) -> ChangeRecord:
        schema = self.schema
        return ChangeRecord(schema.database, schema.table, schema.version, *fields)


class StreamFormatError(ValueError):
    """A JSON stream's line that is not a schema or a record of the schema before it."""


def _not_a_record(exc: Exception) -> StreamFormatError:
    return StreamFormatError(f"the server sent a line that is neither a schema nor a record "
                             f"of it ({exc!r:.200})")


class JsonStreamDecoder:
    """JSON mode: one schema or record per line. An ``ERR`` line raises ProtocolError."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.schema: SchemaChange | None = None
        self._records: _JsonRecords | None = None
        self._compiled: Any = None

    def feed(self, data: bytes) -> Iterator[Event]:
        for batch in self.batches(data):
            yield from batch

    @property
    def inside_message(self) -> bool:
        """Part of a line is buffered: what came last ended inside one."""
        return bool(self._buffer)

    def batches(self, data: bytes) -> Iterator[list[Event]]:
        """The events of the whole lines in ``data`` (and what earlier calls left), in
        lists: the records up to a schema, the schema alone, the records after it."""
        self._buffer += data
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return
        chunk = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        records: list[Event] = []
        pos = 0
        while pos < len(chunk):
            if self._compiled is not None:  # the record lines it reads, up to one it leaves
                try:
                    compiled, pos = self._compiled.decode(chunk, pos)
                except ProtocolError:
                    raise
                except Exception as exc:
                    if records:
                        yield records
                    raise _not_a_record(exc) from exc
                records += compiled
                if pos >= len(chunk):
                    break
            newline = chunk.index(b"\n", pos)
            line, pos = chunk[pos:newline], newline + 1
            if not line.strip():
                continue
            try:
                event = self._line(line)
            except Exception as exc:
                if records:  # delivered before the error line raises
                    yield records
                if isinstance(exc, ProtocolError):
                    raise
                raise _not_a_record(exc) from exc
            if isinstance(event, SchemaChange):
                if records:
                    yield records
                    records = []
                yield [event]
            else:
                records.append(event)
        if records:
            yield records

    def _line(self, line: bytes) -> Event:
        if line.startswith(b"ERR"):
            _, code, message = parse_reply(line)
            raise ProtocolError(code or Code.INTERNAL, message)
        doc = json.loads(line, parse_float=Decimal)
        if "fields" in doc and "namespace" in doc:
            self.schema = SchemaChange.from_schema(doc)
            self._records = _JsonRecords(self.schema)
            self._compiled = compiled_json_decoder(self.schema)
            return self.schema
        if self._records is None:
            raise ProtocolError(Code.INTERNAL, "a record arrived before its schema")
        return self._records(doc)


class AvroStreamDecoder:
    """AVRO mode: a container header per version, then whole blocks."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._header: Header | None = None
        self._parsed: Any = None
        self._compiled: Any = None
        self.schema: SchemaChange | None = None

    def feed(self, data: bytes) -> Iterator[Event]:
        for batch in self.batches(data):
            yield from batch

    @property
    def inside_message(self) -> bool:
        """Part of a header or a block is buffered: what came last ended inside one."""
        return bool(self._buffer)

    def batches(self, data: bytes) -> Iterator[list[Event]]:
        """The events of ``data`` (and of what earlier calls left incomplete), a list per
        block; a schema is a list of its own."""
        self._buffer += data
        while self._buffer:
            if self._buffer.startswith(b"ERR"):  # a reply line where a block would start
                self._raise_error_line()
                return
            if self._header is None or self._buffer.startswith(MAGIC):
                if not self._read_header():
                    return
                assert self.schema is not None
                yield [self.schema]
                continue
            block = self._read_block()
            if block is None:
                return
            yield block

    def _raise_error_line(self) -> None:
        newline = self._buffer.find(b"\n")
        if newline >= 0:
            _, code, message = parse_reply(bytes(self._buffer[:newline]))
            raise ProtocolError(code or Code.INTERNAL, message)

    def _read_header(self) -> bool:
        try:
            header = parse_header(self._buffer)
        except IndexError:
            return False
        import fastavro

        del self._buffer[: header.size]
        self._header = header
        doc = json.loads(header.schema_json)
        self._parsed = fastavro.parse_schema(doc)
        self.schema = SchemaChange.from_schema(doc)
        self._compiled = compiled_decoder(self.schema)
        return True

    def _read_block(self) -> list[Event] | None:
        assert self._header is not None and self.schema is not None
        block = block_at(self._buffer, 0, self._header.sync)
        if block is None:
            return None
        count, pos, end = block
        data = decompress(self._header.codec, bytes(self._buffer[pos : end - SYNC_SIZE]))
        del self._buffer[:end]
        if count > len(data):  # every record holds its GTID: one byte at least
            raise AvroFormatError(f"a block of {len(data)} bytes claims {count} records")
        try:
            return self._records(data, count)
        except (EOFError, IndexError, struct.error, UnicodeDecodeError) as exc:
            # a block that does not decode: the stream is corrupt, not the connection lost
            raise AvroFormatError(f"a block of {count} records does not decode: "
                                  f"{exc!r:.200}") from None

    def _records(self, data: bytes, count: int) -> list[Event]:
        assert self.schema is not None
        if self._compiled is not None:
            records: list[Event] | None = self._compiled.decode(data, count)
            if records is not None:
                return records
        import fastavro

        read, stream = fastavro.schemaless_reader, io.BytesIO(data)
        return [_record(self.schema,
                        unsigned_metadata(read(stream, self._parsed, None)),  # type: ignore[arg-type]
                        from_avro_value) for _ in range(count)]


# -- the compiled decoder's program --------------------------------------------------------

# _records.pyx's operations and union shapes (keep in step)
_PRIMITIVE_OPS = {"int": 1, "long": 1, "float": 2, "double": 3, "boolean": 4, "string": 5,
                  "bytes": 6}
_LOGICAL_OPS = {("bytes", "decimal"): 8, ("int", "date"): 9,
                ("long", "local-timestamp-micros"): 10, ("long", "timestamp-micros"): 11,
                ("long", "time-micros"): 12, ("string", "uuid"): 13}
_ENUM, _NULL = 7, 14
_PLAIN, _NULLABLE, _WITH_TEXT = 0, 1, 2
_METADATA_TYPES = ("int", "int", "long", "int", "long")


def compiled_decoder(schema: SchemaChange) -> Any:
    """The C decoder of this version's records, or None: not built, or a schema whose every
    field it does not read exactly as fastavro does (the Python path reads those)."""
    if _records is None:
        return None
    specs = schema.schema.get("fields", [])
    event_types = _event_types(specs)
    program = [_column_program(spec, f) for spec, f in zip(specs[6:], schema.columns,
                                                             strict=False)]
    if event_types is None or len(specs) != len(schema.fields) or None in program:
        return None
    return _records.RecordDecoder(ChangeRecord, tuple(f.name for f in fields(ChangeRecord)),
                                  schema.database, schema.table, schema.version, event_types,
                                  program, Decimal)


# _records.pyx's JSON operations (keep in step)
_JSON_OPS = {Kind.INT: 1, Kind.LONG: 1, Kind.BOOLEAN: 2, Kind.STRING: 3, Kind.ENUM: 3,
             Kind.DECIMAL: 4, Kind.DOUBLE: 5, Kind.FLOAT: 6, Kind.BYTES: 7, Kind.DATETIME: 8,
             Kind.TIMESTAMP: 9, Kind.DATE: 10}
_JSON_CALL = 11


def compiled_json_decoder(schema: SchemaChange) -> Any:
    """The C decoder of this version's JSON record lines, or None (not built, or a schema
    the C record decoder does not take)."""
    maker = compiled_decoder(schema)
    if maker is None or not all(f.name.isascii() and '"' not in f.name and "\\" not in f.name
                                for f in schema.columns):
        return None
    program = [(_JSON_OPS.get(f.kind, _JSON_CALL), f.name.encode(), f.column,
                functools.partial(from_json_value, f.kind)) for f in schema.columns]
    return _records.JsonRecordDecoder(maker, _event_types(schema.schema["fields"]), program)


def _event_types(specs: list[Any]) -> tuple[str, ...] | None:
    """The event_type enum's symbols, if the six metadata fields are the service's."""
    if [s.get("name") for s in specs[:6]] != list(METADATA_FIELDS) or \
            tuple(s.get("type") for s in specs[:5]) != _METADATA_TYPES:
        return None
    enum = specs[5].get("type")
    if not isinstance(enum, dict) or enum.get("type") != "enum":
        return None
    return tuple(enum.get("symbols", ()))


def _column_program(spec: dict[str, Any], f: Field) -> tuple[Any, ...] | None:
    """(operation, union shape, key, extra, text call, scale, precision) of one column."""
    avro_type = spec.get("type")
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    shape = _PLAIN if not isinstance(avro_type, list) else _NULLABLE
    if branches == ["null"]:
        return _NULL, _NULLABLE, f.column, None, None, 0, 0
    if isinstance(avro_type, list):
        if branches[0] != "null" or len(branches) not in (2, 3):
            return None
        if len(branches) == 3:
            if branches[2] != "string":
                return None
            shape = _WITH_TEXT
        branches = branches[1:2]
    operation = _operation(branches[0])
    if operation is None:
        return None
    op, extra, scale, precision = operation
    text = parse_time if f.kind == Kind.TIME else None  # from_avro_value's rule for text
    return op, shape, f.column, extra, text, scale, precision


def _operation(branch: Any) -> tuple[int, Any, int, int] | None:
    if isinstance(branch, str):
        op = _PRIMITIVE_OPS.get(branch)
        return None if op is None else (op, None, 0, 0)
    if not isinstance(branch, dict):
        return None
    if branch.get("type") == "enum":
        symbols = branch.get("symbols")
        return (_ENUM, tuple(symbols), 0, 0) if isinstance(symbols, list) else None
    op = _LOGICAL_OPS.get((str(branch.get("type")), str(branch.get("logicalType"))))
    if op is None:
        return None
    scale, precision = branch.get("scale", 0), branch.get("precision")
    if op == 8 and not (isinstance(scale, int) and isinstance(precision, int)):
        return None
    return op, uuid.UUID if op == 13 else None, scale or 0, precision or 0
