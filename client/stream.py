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

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from client.avro import (
    MAGIC,
    SYNC_SIZE,
    AvroFormatError,
    Header,
    decompress,
    parse_header,
    read_varint,
)
from client.schema import (
    METADATA_FIELDS,
    Field,
    fields_from_schema,
    from_avro_value,
    from_json_value,
)
from client.wire import Code, ProtocolError, parse_reply


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


@dataclass(frozen=True)
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

    @property
    def gtid(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.sequence}"

    @property
    def position(self) -> tuple[int, int, int]:
        """(domain, sequence, event_number): the record's place in its domain's history."""
        return self.domain, self.sequence, self.event_number


Event = SchemaChange | ChangeRecord


def _record(schema: SchemaChange, data: dict[str, Any], convert: Any) -> ChangeRecord:
    values = {f.column: convert(f.kind, data.get(f.name)) for f in schema.columns}
    return ChangeRecord(schema.database, schema.table, schema.version, data["domain"],
                        data["server_id"], data["sequence"], data["event_number"],
                        data["timestamp"], data["event_type"], values)


class JsonStreamDecoder:
    """JSON mode: one schema or record per line. An ``ERR`` line raises ProtocolError."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.schema: SchemaChange | None = None

    def feed(self, data: bytes) -> Iterator[Event]:
        self._buffer += data
        while (newline := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if line.strip():
                yield self._line(line)

    def _line(self, line: bytes) -> Event:
        if line.startswith(b"ERR"):
            _, code, message = parse_reply(line)
            raise ProtocolError(code or Code.INTERNAL, message)
        doc = json.loads(line, parse_float=Decimal)
        if "fields" in doc and "namespace" in doc:
            self.schema = SchemaChange.from_schema(doc)
            return self.schema
        if self.schema is None:
            raise ProtocolError(Code.INTERNAL, "a record arrived before its schema")
        return _record(self.schema, doc, from_json_value)


class AvroStreamDecoder:
    """AVRO mode: a container header per version, then whole blocks."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._header: Header | None = None
        self._parsed: Any = None
        self.schema: SchemaChange | None = None

    def feed(self, data: bytes) -> Iterator[Event]:
        self._buffer += data
        while self._buffer:
            if self._buffer.startswith(b"ERR"):  # a reply line where a block would start
                self._raise_error_line()
                return
            if self._header is None or self._buffer.startswith(MAGIC):
                if not self._read_header():
                    return
                assert self.schema is not None
                yield self.schema
                continue
            block = self._read_block()
            if block is None:
                return
            yield from block

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
        return True

    def _read_block(self) -> list[ChangeRecord] | None:
        assert self._header is not None and self.schema is not None
        try:
            count, pos = read_varint(self._buffer, 0)
            size, pos = read_varint(self._buffer, pos)
        except IndexError:
            return None
        end = pos + size + SYNC_SIZE
        if count < 0 or size < 0:
            raise AvroFormatError("malformed block header in the stream")
        if len(self._buffer) < end:
            return None
        if bytes(self._buffer[end - SYNC_SIZE : end]) != self._header.sync:
            raise AvroFormatError("sync marker mismatch in the stream")
        data = io.BytesIO(decompress(self._header.codec, bytes(self._buffer[pos : end -
                                                                             SYNC_SIZE])))
        del self._buffer[:end]
        import fastavro

        read = fastavro.schemaless_reader
        return [_record(self.schema, read(data, self._parsed, None),  # type: ignore[arg-type]
                        from_avro_value) for _ in range(count)]


class Resume:
    """What a stream has delivered, so a reconnect can continue exactly after it.

    The server's GTID seek is inclusive (it starts at the first record of the requested
    transaction), so after ``REQUEST-DATA db.t.<version> <last gtid>`` the records of that
    transaction already delivered are dropped here, as is the repeated schema.

    A stream that began ``AFTER`` a GTID state (after a dump) resumes the same way, exactly
    in every domain: the state moves to just before the last delivered transaction, whose
    delivered records are then dropped.
    """

    def __init__(self, version: int | None = None, gtid: str | None = None,
                 after: str | None = None) -> None:
        self.version = version
        self.gtid = gtid
        self.after = after
        self._last: tuple[int, int, int] | None = None  # (domain, sequence, event_number)
        self._schema_version: int | None = None

    def request(self) -> tuple[int | None, str | None, str | None]:
        """(version, gtid, after) for the next request."""
        if self.after is not None:
            return self.version, None, self.after
        return self.version, self.gtid, None

    def accept(self, event: Event) -> bool:
        if isinstance(event, SchemaChange):
            if event.version == self._schema_version:
                return False
            if self._last is not None and self.after is None:
                # A new version after delivered records: nothing of it was delivered, so a
                # resume starts at its beginning. (A GTID from the old version would skip the
                # new version's records of other domains that precede that GTID's domain.)
                self.gtid = None
                self._last = None
            self._schema_version = self.version = event.version
            return True
        last = self._last
        if last is not None and event.domain == last[0] and (
                event.sequence, event.event_number) <= (last[1], last[2]):
            return False
        self._last = event.position
        self.gtid = event.gtid
        if self.after is not None:
            self.after = state_before(self.after, event)
        return True


def state_before(state: str, record: ChangeRecord) -> str:
    """``state`` with the record's domain moved to just before the record's transaction."""
    items = [i for i in state.split(",") if i]
    if len(items) == 1 and ":" in items[0]:  # a MySQL source UUID: records are in domain 0
        uuid = items[0].split(":", 1)[0]
        return f"{uuid}:{record.sequence - 1}"
    kept = [i for i in items if int(i.split("-", 1)[0]) != record.domain]
    kept.append(f"{record.domain}-{record.server_id}-{record.sequence - 1}")
    return ",".join(sorted(kept, key=lambda i: int(i.split("-", 1)[0])))
