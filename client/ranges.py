"""Reading a table in ranges: positions, planning a range of at most n records, reading it.

A :class:`Position` is where a reader of one table stands: every transaction its GTID state
covers has been read, and of the transaction ``txn`` (the next one, when a range had to cut a
transaction larger than its limit) the records numbered up to ``event``. A range is two
positions of one table; reading it is ``REQUEST-DATA db.t AFTER start UNTIL end`` (the bounded
read extension) in AVRO mode, which the server answers mostly by copying its stored blocks,
with the two cut transactions trimmed by event number, so the same range always yields the
same records. Planning one is ``QUERY-RANGE`` plus that cut.

The Spark source is built on this; so can any reader that works in batches.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mariadb_cdc_client.format.avro import (
    MAGIC,
    AvroFormatError,
    Header,
    block_at,
    container_header,
    parse_header,
)
from mariadb_cdc_client.format.gtid import MARIADB_GTID, MYSQL_STATE_ITEM, unsigned_metadata
from mariadb_cdc_client.format.names import Table, as_table
from mariadb_cdc_client.format.wire import (
    Code,
    DataRequest,
    Format,
    ProtocolError,
    RangeQuery,
    parse_reply,
)
from mariadb_cdc_client.sync import SyncCdcConnection


def _state_items(state: str) -> dict[str, str]:
    """A GTID state's items by what it keeps one of: the domain, or a MySQL source UUID."""
    items = {}
    for item in filter(None, (i.strip() for i in state.split(","))):
        if m := MARIADB_GTID.match(item):
            items[m[1]] = item
        elif m := MYSQL_STATE_ITEM.match(item):
            items[m[1].lower()] = f"{m[1].lower()}:1-{m[2]}"
        else:
            raise ValueError(f"not a GTID state: {state!r}")
    return items


def advance(state: str, gtid: str) -> str:
    """``state`` with ``gtid``'s domain (or source) moved to ``gtid``."""
    items = _state_items(state)
    items.update(_state_items(gtid))
    return ",".join(items[k] for k in sorted(items))


def gtid_parts(gtid: str) -> tuple[int, int, int]:
    """(domain, server_id, sequence) of a GTID (or a one-item state) as records carry them
    (a MySQL ``uuid:N`` is domain 0, server 0)."""
    if m := MARIADB_GTID.match(gtid):
        return int(m[1]), int(m[2]), int(m[3])
    if m := MYSQL_STATE_ITEM.match(gtid):
        return 0, 0, int(m[2])
    raise ValueError(f"not a GTID: {gtid!r}")


def _transaction_key(gtid: str) -> tuple[int, int | None, int]:
    """(domain, server_id, sequence): what identifies a transaction's records (servers that
    share a domain without gtid_strict_mode count on their own, so the server_id is part of
    it; a MySQL GTID's records carry the server_id its GTID does not name: None)."""
    domain, server_id, sequence = gtid_parts(gtid)
    return domain, None if MYSQL_STATE_ITEM.match(gtid) else server_id, sequence


@dataclass(frozen=True)
class Position:
    state: str = ""  # every transaction this GTID state covers is read ("": none)
    txn: str = ""  # and of this transaction, the one after the state...
    event: int = 0  # ...the records numbered up to this

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gtid_state": self.state}
        if self.txn:
            data.update(txn=self.txn, event=self.event)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Position:
        return cls(data.get("gtid_state", ""), data.get("txn", ""), int(data.get("event", 0)))

    @property
    def read_state(self) -> str:
        """The state a bounded read has to run to for this position to be inside it."""
        return advance(self.state, self.txn) if self.txn else self.state


def plan(conn: SyncCdcConnection, table: Table, start: Position, limit: int,
         until: str | None = None) -> tuple[Position, int]:
    """The furthest end position after ``start`` such that the range holds at most ``limit``
    records of ``table``, within what the service has stored (and within the GTID state
    ``until``, if given), with the number of events it holds (at least its records). A
    transaction bigger than the limit is cut by event number."""
    ref = as_table(table)
    base, budget = start.state, limit
    if start.txn:
        events = int(conn.query(f"QUERY-TRANSACTION {start.txn}")["events"])
        if events - start.event > limit:
            return Position(start.state, start.txn, start.event + limit), limit
        base, budget = advance(start.state, start.txn), limit - (events - start.event)
        if budget == 0:
            return Position(base), limit
    reply = conn.query(RangeQuery(ref.database, ref.table, base, budget, until or "").line())
    end, following, used = reply["end"], reply["next"], limit - budget + reply["events"]
    if reply["events"] or following is None or budget < limit:
        return Position(end), used
    return Position(end, following["gtid"], limit), limit  # one transaction alone is too big


@dataclass(frozen=True)
class Schema:
    """A version's schema, as a bounded read announces it (in the version's container header)
    before the version's records."""

    avsc: dict[str, Any]
    header: Header


@dataclass(frozen=True)
class Blocks:
    """Whole Avro blocks of the version last announced, as stored: what follows its
    container header in a file, ``count`` records in all. ``data`` is bytes-like: a
    read-only view of the buffer the blocks were received into."""

    data: bytes | memoryview
    count: int


@dataclass(frozen=True)
class Trim:
    """The records of a range's two cut transactions that lie outside it: of ``skip``'s
    (domain, server_id, sequence) those numbered up to its event number, of ``stop``'s those
    past it."""

    skip: tuple[int, int | None, int, int] | None = None
    stop: tuple[int, int | None, int, int] | None = None

    @classmethod
    def of(cls, start: Position, end: Position) -> Trim:
        return cls((*_transaction_key(start.txn), start.event) if start.txn else None,
                   (*_transaction_key(end.txn), end.event) if end.txn else None)

    def __bool__(self) -> bool:
        return self.skip is not None or self.stop is not None

    def keeps(self, record: dict[str, Any]) -> bool:
        if self.skip is not None and _of(record, self.skip) and \
                record["event_number"] <= self.skip[3]:
            return False
        return not (self.stop is not None and _of(record, self.stop) and
                    record["event_number"] > self.stop[3])


def _of(record: dict[str, Any], txn: tuple[int, int | None, int, int]) -> bool:
    """Whether a record belongs to the transaction ``txn`` names."""
    return record["domain"] == txn[0] and record["sequence"] == txn[2] and (
        txn[1] is None or record["server_id"] == txn[1])


class _BoundedStream:
    """Splits a bounded AVRO-mode read into its parts: a container header per version, whole
    blocks (gathered into chunks of about ``chunk_size`` bytes), and the end line. None of
    the three (nor an ``ERR`` line) can start with a byte that begins a block: an odd first
    byte is a negative block count.

    The reply is received into buffers of about a chunk (:meth:`space`, then
    :meth:`received`) and each chunk is a read-only view of the buffer it arrived in: its
    bytes are copied once, by the kernel. A buffer is written only past what it holds, and
    is used again only once no view of it is left, so a chunk stays valid for as long as its
    reader keeps it (a reader that drops each chunk in turn keeps receiving into the same
    few buffers, whose pages are already there)."""

    _MIN_SPACE = 64 * 1024  # the least room a receive is given
    _SPARES = 2  # buffers kept for reuse

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.end: dict[str, Any] | None = None
        self._header: Header | None = None
        self._buffer = bytearray(chunk_size + self._MIN_SPACE)
        self._base = 0  # where the blocks of the chunk being gathered start
        self._pos = 0  # where parsing stands: [base, pos) is whole blocks
        self._filled = 0  # the bytes received into the buffer
        self._count = 0  # the records of those blocks
        self._spares: list[bytearray] = []  # earlier buffers, to reuse once no view is left

    def space(self) -> memoryview:
        """Where to receive the next bytes of the reply (pass their count to
        :meth:`received`)."""
        if self._full():
            self._move(max(self.chunk_size, 2 * (self._filled - self._base)) + self._MIN_SPACE)
        return memoryview(self._buffer)[self._filled:]

    def received(self, size: int) -> Iterator[Schema | Blocks]:
        """The parts completed by ``size`` more bytes received into :meth:`space`."""
        self._filled += size
        view = memoryview(self._buffer)[:self._filled]
        while self._pos < self._filled and self.end is None:
            first = view[self._pos]
            if first == MAGIC[0] or first in b"{E":
                if self._pos > self._base:
                    yield self._chunk()
                used = self._schema(view) if first == MAGIC[0] else self._line()
                if not used:
                    break
                self._pos = self._base = self._pos + used
                if first == MAGIC[0]:
                    assert self._header is not None
                    yield Schema(json.loads(self._header.schema_json), self._header)
                continue
            if not self._block(view):
                break
            if self._pos - self._base >= self.chunk_size:
                yield self._chunk()
        if self._pos > self._base and (self.end is not None or self._full()):
            yield self._chunk()  # a full buffer gives out its blocks: only a partial one moves

    def feed(self, data: bytes) -> Iterator[Schema | Blocks]:
        """The parts completed by ``data`` (copied into the buffer)."""
        rest = memoryview(data)
        while rest:
            space = self.space()
            size = min(len(space), len(rest))
            space[:size] = rest[:size]
            rest = rest[size:]
            yield from self.received(size)

    def _full(self) -> bool:
        return len(self._buffer) - self._filled < self._MIN_SPACE

    def _move(self, size: int) -> None:
        """Into another buffer of at least ``size`` bytes (a spare no chunk views, or a new
        one), with what is not yet a chunk: the one it leaves may still back chunks given
        out, so it is only kept as a spare."""
        kept = self._filled - self._base
        buffer = self._spare(size)
        buffer[:kept] = memoryview(self._buffer)[self._base:self._filled]
        self._spares = [self._buffer, *self._spares][:self._SPARES]
        self._buffer = buffer
        self._pos -= self._base
        self._filled, self._base = kept, 0

    def _spare(self, size: int) -> bytearray:
        """A kept buffer of at least ``size`` bytes that no chunk views any more, else a new
        one."""
        for spare in self._spares:
            if len(spare) >= size and _unviewed(spare):
                self._spares.remove(spare)
                return spare
        return bytearray(size)

    def _schema(self, view: memoryview) -> int:
        try:
            self._header = parse_header(view[self._pos:])
        except IndexError:
            return 0
        return self._header.size

    def _line(self) -> int:
        newline = self._buffer.find(b"\n", self._pos, self._filled)
        if newline < 0:
            return 0
        line = bytes(self._buffer[self._pos:newline])
        if line.startswith(b"ERR"):
            _, code, message = parse_reply(line)
            raise ProtocolError(code or Code.INTERNAL, message)
        self.end = json.loads(line)
        return newline + 1 - self._pos

    def _block(self, view: memoryview) -> bool:
        if self._header is None:
            raise AvroFormatError("a block arrived before its version's header")
        block = block_at(view, self._pos, self._header.sync)
        if block is None:
            return False
        count, _, self._pos = block
        self._count += count
        return True

    def _chunk(self) -> Blocks:
        chunk = Blocks(memoryview(self._buffer).toreadonly()[self._base:self._pos],
                       self._count)
        self._base, self._count = self._pos, 0
        return chunk


def _unviewed(buffer: bytearray) -> bool:
    """Whether no view of ``buffer`` is left: a bytearray that has one cannot be resized
    (BufferError); shrinking it by its last byte and putting one back does neither copy nor
    reallocate."""
    try:
        buffer.pop()
    except BufferError:
        return False
    buffer.append(0)
    return True


def read_blocks(conn: SyncCdcConnection, table: Table, start: Position, end: Position,
                chunk_size: int = 1 << 20) -> Iterator[Schema | Blocks]:
    """The stored blocks of ``table`` after ``start`` up to ``end`` (``REQUEST-DATA db.t
    AFTER start UNTIL end`` on a ``TYPE=AVRO`` connection), each version's schema first. The
    two cut transactions are whole: :class:`Trim` says which of their records to drop.
    Raises ConnectionError if the range was cut short."""
    if conn.format != Format.AVRO:
        raise ValueError("reading blocks needs a TYPE=AVRO connection")
    if end.read_state == "" or start == end:
        return
    ref = as_table(table)
    stream = _BoundedStream(chunk_size)
    conn.send(DataRequest(ref.database, ref.table, None, None, start.state or None,
                          end.read_state).line())
    while stream.end is None:
        size = conn.receive_into(stream.space())
        if not size:
            raise ConnectionError(f"the bounded read of {ref} ended without its end line")
        yield from stream.received(size)


def read(conn: SyncCdcConnection, table: Table, start: Position, end: Position
         ) -> Iterator[Schema | dict[str, Any]]:
    """The records of ``table`` after ``start`` up to ``end``, decoded (fastavro's types:
    Decimal, datetime, ...), each version's schema first."""
    import fastavro

    trim = Trim.of(start, end)
    header = b""
    for item in read_blocks(conn, table, start, end):
        if isinstance(item, Schema):
            header = container_header(item.header.schema_json, item.header.codec,
                                      item.header.sync)
            yield item
            continue
        for record in fastavro.reader(io.BytesIO(header + item.data)):
            assert isinstance(record, dict)
            unsigned_metadata(record)
            if not trim or trim.keeps(record):
                yield record
