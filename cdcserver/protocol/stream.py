"""Serving ``REQUEST-DATA``: the schema, the stored records, then new ones as they commit.

For each version, from the requested one (or the first) on: the schema (JSON mode: the
``.avsc`` line; AVRO mode: the file's container header, once), then its committed records
(JSON: one object per line; AVRO: the file's blocks as stored), then, while the version is the
newest, whatever later commits add. When a newer version is published and this one is fully
sent, the stream moves on, so a client learns of a schema change in-band.

A GTID positions the stream in both modes: the index gives an offset to scan from and the
stream starts at the first record of that domain whose sequence is at or after the GTID's
(inclusive, as MaxScale; any server_id, unlike MaxScale, so a seek survives a failover). In a
domain whose sequence numbers did not grow (``gtid_strict_mode=OFF``), "at or after" is by the
order the store applied transactions in (:class:`_Order`), and a seek for a stored GTID starts
at that very transaction.
``AFTER <state>`` (an extension) sends exactly the records of transactions the GTID state does
not cover, in every domain: what follows a dump. In AVRO mode a block that holds records
before the starting point is re-encoded without them.

``UNTIL <state>`` (an extension) bounds the stream to the transactions the state covers and
ends it with a JSON line. In AVRO mode the blocks the index proves covered go out as stored,
so a bounded read costs the server a file copy, not a decode; only the blocks around the end
are decoded and re-encoded with the records the range holds.

Each version file is marked in use while it is sent, so retention does not delete it under
the stream; a version retention already removed is skipped. Every stream of a version file
shares one open descriptor of it (``store/inuse.py``), which they read at explicit offsets: a
stream costs the service its socket, not a file as well.

Waiting is on the catalog's per-table change future: no polling. A session at the newest
version's end with no filter left hands itself to the table's shared tail (``tail.py``),
which renders each commit once for every client there. Every write of a session's own
stream awaits ``drain()``, so a client that does not read slows only its own stream, with at
most one chunk in memory. AVRO mode sends stored bytes with ``sendfile(2)``; JSON mode renders
whole blocks in C where it can (``render.rendered_block``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.protocol.bigjson import send_large_block
from cdcserver.protocol.blockdata import large
from cdcserver.protocol.dialect import JsonStyle, schema_line
from cdcserver.protocol.outbox import Outbox
from cdcserver.protocol.render import (
    EXACT,
    compile_renderer,
    json_block,
    metadata_slices,
    repair_suffix,
    with_suffix,
)
from cdcserver.protocol.requests import StreamRequest, state_bound
from cdcserver.protocol.tail import Tails
from cdcserver.store.avrofile import Block, scan_blocks
from cdcserver.store.catalog import Catalog, TableEntry, VersionInfo
from cdcserver.store.checkpoint import Quarantined
from cdcserver.store.index import StoreIndex
from cdcserver.store.inuse import FILES, SharedFile, TooManyOpen, in_use
from cdcserver.store.naming import version_file
from cdcserver.store.records import block_of, decode_records
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import Code, Format, ProtocolError

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


class _Order:
    """Whether a record comes after a transaction in its domain: by sequence number while the
    domain's numbers grew, else by the store's ordinals (``store/index.py``). Records are
    stored in ordinal order, so while a version is read from its start, the transaction of
    each record is the first with its GTID at or after the previous record's."""

    def __init__(self, index: StoreIndex | None) -> None:
        self.index = index
        self._floor = 0
        self._last: tuple[tuple[int, int, int], int | None] | None = None
        self._named: dict[Gtid, int | None] = {}

    def version_started(self) -> None:
        self._floor = 0
        self._last = None

    def ordered(self, domain: int) -> bool:
        return self.index is None or self.index.ordered(domain)

    def compare(self, record: dict[str, Any], gtid: Gtid) -> int:
        """<0, 0 or >0 as the record's transaction is before, is, or is after ``gtid``."""
        if not self.ordered(record["domain"]):
            mine, theirs = self._record_ordinal(record), self._ordinal(gtid)
            if mine is not None and theirs is not None:
                return mine - theirs
        return record["sequence"] - gtid.sequence

    def covers(self, state: GtidState, gtid: Gtid) -> bool:
        if self.index is None:
            return state.covers(gtid)
        return self.index.covers(state, gtid)

    def _ordinal(self, gtid: Gtid) -> int | None:
        if gtid not in self._named:
            assert self.index is not None
            self._named[gtid] = self.index.ordinal(gtid)
        return self._named[gtid]

    def _record_ordinal(self, record: dict[str, Any]) -> int | None:
        key = (record["domain"], record["server_id"], record["sequence"])
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        assert self.index is not None
        ordinal = self.index.ordinal(Gtid(*key), at_least=self._floor)
        if ordinal is not None:
            self._floor = ordinal
        self._last = (key, ordinal)
        return ordinal


class _Seek:
    """MaxScale's GTID position (inclusive): from the first record of the GTID's domain at or
    after its sequence, everything."""

    def __init__(self, gtid: Gtid, order: _Order | None = None) -> None:
        self.gtid = gtid
        self.domain = gtid.domain
        self.sequence = gtid.sequence
        self.order = order or _Order(None)
        self.settled = False  # every record from here on is sent

    def accepts(self, record: dict[str, Any]) -> bool:
        if not self.settled and record["domain"] == self.domain and \
                self.order.compare(record, self.gtid) >= 0:
            self.settled = True
        return self.settled

    def start_offset(self, index: StoreIndex, info: VersionInfo) -> int | None:
        return index.seek_offset(info.table, info.version, self.domain, self.sequence)

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        self.order.version_started()


class _After:
    """``AFTER <state>`` (exclusive): every record of a transaction the state does not cover.
    Within a domain records are stored in commit order, so once a domain has had a record
    after the state, all its later records are too; when that holds for every domain of the
    state that the version has records of, the filter is settled and blocks go out as
    stored."""

    def __init__(self, state: GtidState, given: GtidState | None = None,
                 order: _Order | None = None) -> None:
        self.state = state  # in the domains records are stored with
        self.given = given if given is not None else state  # as the client named it
        self.order = order or _Order(None)
        self.settled = not state
        self._pending: set[int] = set()

    @classmethod
    def parse(cls, text: str, order: _Order | None = None) -> _After:
        bound = state_bound(text)
        return cls(bound.stored, bound.given, order)

    def covers(self, gtid_text: str) -> bool:
        """Whether a version's creating transaction precedes the state."""
        if not gtid_text:
            return False
        gtid = Gtid.parse(gtid_text)
        if gtid.source_uuid is not None:
            gtid = Gtid(0, 0, gtid.sequence)
        return self.order.covers(self.state, gtid)

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        self.order.version_started()
        if not self.state:
            return
        domains = {g.domain for g in self.state}
        if index is not None:
            domains &= index.domains(info.table, info.version)
        self._pending = domains
        self.settled = not domains

    def accepts(self, record: dict[str, Any]) -> bool:
        if self.settled:
            return True
        last = self.state.get(record["domain"])
        if last is not None and self.order.compare(record, last) <= 0:
            return False
        self._pending.discard(record["domain"])
        self.settled = not self._pending
        return True

    def start_offset(self, index: StoreIndex, info: VersionInfo) -> int | None:
        offsets = []
        for domain in self._pending:
            last = self.state.get(domain)
            assert last is not None
            offset = index.seek_offset(info.table, info.version, domain, last.sequence + 1)
            if offset is None:
                return None
            offsets.append(offset)
        return min(offsets) if offsets else None


class _Until:
    """``UNTIL <state>``: only records of transactions the state covers. Once a record past
    the state has been seen in each of its domains, nothing later can be covered
    (:attr:`finished`); within a version, once it has been seen in each domain the version
    has records of, nothing later in the version can (:attr:`done`)."""

    def __init__(self, state: GtidState, given: GtidState, order: _Order | None = None) -> None:
        self.state = state
        self.given = given
        self.order = order or _Order(None)
        self._open = {g.domain for g in state}  # the state's domains not passed yet
        self._open_here = set(self._open)  # and those of them the version has records of
        self.domains: set[int] | None = None  # the current version's, when the index knows

    @property
    def done(self) -> bool:
        """Nothing later in this version is covered."""
        return not self._open_here

    @property
    def finished(self) -> bool:
        """Nothing later in the table is covered. (A version with no records of a domain,
        one with none at all above all, says nothing of the versions after it: such a
        version used to end the range, and the versions after it were never sent.)"""
        return not self._open

    def covers(self, record: dict[str, Any]) -> bool:
        last = self.state.get(record["domain"])
        if last is not None and self.order.compare(record, last) <= 0:
            return True
        self._open.discard(record["domain"])
        self._open_here.discard(record["domain"])
        return False

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        """Only the domains the version has records of can close the range within it."""
        self.order.version_started()
        self._open_here = set(self._open)
        if index is None:
            return
        self.domains = index.domains(info.table, info.version)
        self._open_here &= self.domains

    def covered_prefix(self, index: StoreIndex | None, info: VersionInfo) -> int:
        """An offset of ``info``'s file before which every record is covered (the file's
        header size when the index cannot tell): in each domain of the version, the indexed
        block at or before the state's last transaction."""
        if index is None or self.domains is None or not self.domains:
            return info.header.size
        offsets = []
        for domain in self.domains:
            last = self.state.get(domain)
            if last is None:  # a domain the state does not name: none of its records are
                return info.header.size
            offset = index.seek_offset(info.table, info.version, domain, last.sequence + 1)
            offsets.append(info.header.size if offset is None else offset)
        return min(offsets)

    def covers_version(self, gtid_text: str) -> bool:
        """Whether the transaction that created a version is covered (else none of its
        records are)."""
        return _After(self.state, order=self.order).covers(gtid_text)


def read_range(info: VersionInfo, pos: int, end: int, fmt: Format, style: JsonStyle
               ) -> tuple[bytes, int]:
    """The bytes an unfiltered stream sends for ``info`` from ``pos`` to ``end`` (block
    boundaries), and how many records they hold (JSON; AVRO copies bytes and counts 0)."""
    if fmt == Format.AVRO:
        return Streamer._read(info, pos, end - pos), 0
    out, count = bytearray(), 0
    for block in scan_blocks(info.path, info.header, pos, end):
        out += json_block(info, block, style)
        count += block.count
    return bytes(out), count


def files_spent(exc: TooManyOpen) -> ProtocolError:
    """The refusal of a reader past the budget of stored files open (retriable)."""
    return ProtocolError(Code.TOO_MANY_CONNECTIONS, f"{exc.strerror}: try again later",
                         fatal=True)


@contextlib.contextmanager
def dump_in_use(path: str, layout: bool) -> Iterator[BinaryIO]:
    """A dump marked in use while it is sent, on a descriptor of its own (its databus layout
    is read from it by position, on a thread), counted in the budget of stored files open
    with, when the client asked for that ``layout``, the temporary file that holds it; past
    the budget, the client is refused in-band."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(FILES.counted(int(layout)))
            f = stack.enter_context(in_use(path))
        except TooManyOpen as exc:
            raise files_spent(exc) from None
        yield f


def quarantined(table: TableName, why: Quarantined) -> ProtocolError:
    """The in-band end of a quarantined table's stream: everything stored was sent."""
    ref = table_ref(table.database, table.table)
    return ProtocolError(
        Code.QUARANTINED,
        f"{ref} is quarantined since transaction {why.since}: {why.cause}. Every change "
        "stored before it was sent; the stream continues, exact, once the service has "
        f"resynced the table (by itself once the cause is gone, or `cdcserver resync {ref}`): "
        "reconnect then from the last GTID received", fatal=True)


class Streamer:
    def __init__(self, catalog: Catalog, index: StoreIndex | None, request: StreamRequest,
                 fmt: Format, out: Outbox, style: JsonStyle = EXACT,
                 caught_up: Callable[[GtidState], Awaitable[None]] | None = None,
                 tails: Tails | None = None) -> None:
        self.catalog = catalog
        self.tails = tails  # shared readers for sessions waiting at a version's end
        self.caught_up = caught_up  # waits until the service has stored up to a state
        self.index = index
        self.request = request
        self.format = fmt
        self.out = out
        self.style = style  # JSON mode: dialect and time zone
        self.table = request.table
        self.records_sent = 0  # by this stream (and the tails it followed)
        self.bytes_sent = 0
        self.at: VersionInfo | None = None  # the version being sent (the admin API)
        self._offset = 0  # sent up to, in it
        self._following = False  # handed over to the table's tail: at its committed end
        self._file: SharedFile | None = None  # the version file sent (other streams share it)
        self._filter: _Seek | _After | None = None
        if request.after is not None:
            self._filter = _After(request.after.stored, request.after.given, _Order(index))
        elif request.seek is not None:
            self._filter = _Seek(request.seek, _Order(index))
        self._until: _Until | None = None
        if request.until is not None:
            self._until = _Until(request.until.stored, request.until.given, _Order(index))

    async def run(self) -> None:
        """Each version of the table from the first the request wants: its schema, then its
        records. Unbounded, the newest version is followed as it grows, until the client
        hangs up. With ``UNTIL``, once everything up to the state is stored, the range's
        records, then one line ``{"end": state, "records": n}``; the server closes the
        connection after it."""
        until = self._until
        await self._wait_stored()
        entry = await self._entry() if until is None else self.catalog.get(self.table)
        info = self._first_version(entry) if entry is not None and entry.versions else None
        first = True
        while entry is not None and info is not None:
            if until is not None and (until.finished or not (
                    first or until.covers_version(info.schema.gtid))):
                break
            first = False
            self.at, self._offset = info, 0
            try:
                with self._holding(info):  # the cleaner leaves it alone while it is sent
                    if self._filter is not None:
                        self._filter.version_started(self.index, info)
                    await self._send_schema(info)
                    if until is None:
                        await self._follow(entry, info, self._start_offset(info))
                    else:
                        until.version_started(self.index, info)
                        await self._send_bounded(info, self._start_offset(info),
                                                 info.committed, until)
            except FileNotFoundError:
                self._deleted(info.version)
            following = entry.after(info.version)
            if following is not None and following.version != info.version + 1:
                self._deleted(info.version + 1)  # versions are numbered without gaps
            info = following
        if until is not None:
            await self._write(json.dumps({"end": str(until.given),
                                          "records": self.records_sent}).encode() + b"\n")

    @contextlib.contextmanager
    def _holding(self, info: VersionInfo) -> Iterator[None]:
        """``info``'s file held (:attr:`_file`) while the block runs: opened by the first
        stream that reads it, closed by the last, marked in use meanwhile."""
        with contextlib.ExitStack() as stack:
            try:
                self._file = stack.enter_context(FILES.shared(info.path))
            except TooManyOpen as exc:
                raise files_spent(exc) from None
            try:
                yield
            finally:
                self._file = None

    def _held(self) -> SharedFile:
        assert self._file is not None, "a version file is read only while it is held"
        return self._file

    async def _wait_stored(self) -> None:
        """Everything up to the request's states must be stored before the starting version
        is chosen: a version the source created before them may not be in the catalog yet."""
        if self.caught_up is None:
            return
        if self._until is not None:
            await self.caught_up(self._until.given)
        if isinstance(self._filter, _After):
            await self.caught_up(self._filter.given)

    async def _send_bounded(self, info: VersionInfo, pos: int, end: int,
                            until: _Until) -> None:
        """In AVRO mode, the blocks before the covered prefix go out as stored (once the
        start filter is settled); the rest are decoded and re-encoded with the records the
        range holds, up to the first block past the end state."""
        covered = until.covered_prefix(self.index, info) if self.format == Format.AVRO else 0
        run = _Run(pos)  # stored blocks to send as they are, in one sendfile
        for block in scan_blocks(info.path, info.header, pos, end, self._held().fd):
            self._offset = block.end  # (sent by the time the next block is looked at)
            if self.format == Format.JSON:
                await self._send_json(info, block, until)
            elif block.end <= covered and (self._filter is None or self._filter.settled):
                run.add(block)
                continue
            else:
                await self._send_run(info, run)
                await self._send_avro_block(info, block, until)
                run = _Run(block.end)
            if until.done:
                return
        await self._send_run(info, run)

    async def _send_run(self, info: VersionInfo, run: _Run) -> None:
        if run.count:
            await self._send_file(info, run.start, run.end)
            self._sent_records(run.count)

    @property
    def offset(self) -> int:
        """How far into :attr:`at` the stream has sent (bytes of the version file)."""
        if self._following and self.at is not None:
            return self.at.committed  # the tail writes each commit to its clients at once
        return self._offset

    def _deleted(self, version: int) -> NoReturn:
        raise ProtocolError(Code.NO_FILE, f"{self.table} version {version} was deleted by "
                            "retention before it could be sent; start again from a newer "
                            "dump", fatal=True)

    def _first_version(self, entry: TableEntry) -> VersionInfo | None:
        """The requested version; after a GTID state, the version the table was in at that
        point (later versions were created after it, earlier ones were sealed before it);
        otherwise the first one stored."""
        if self.request.version is not None:
            info = entry.versions.get(self.request.version)
            if info is None:
                name = version_file(self.table, self.request.version, "avro")
                raise ProtocolError(Code.NO_FILE, f"File '{name}' not found.", fatal=True)
            return info
        if isinstance(self._filter, _After):
            before = [v for v in sorted(entry.versions)
                      if self._filter.covers(entry.versions[v].schema.gtid)]
            if before:
                return entry.versions[before[-1]]
        return entry.first()

    async def _entry(self) -> TableEntry:
        """The table's catalog entry; with AFTER, wait for a table that has no version yet
        (a dump of it exists; its first change will create one)."""
        while True:
            entry = self.catalog.get(self.table)
            if entry is not None and entry.versions:
                return entry
            await asyncio.shield(self.catalog.table_appeared())

    def _start_offset(self, info: VersionInfo) -> int:
        if self._filter is None or self._filter.settled or self.index is None:
            return info.header.size
        offset = self._filter.start_offset(self.index, info)
        return offset if offset is not None else info.header.size

    async def _follow(self, entry: TableEntry, info: VersionInfo, pos: int) -> None:
        """Send ``info`` from ``pos`` and keep following it until it is sealed and sent."""
        backlog = True  # the first range: what was stored when the stream got here
        while True:
            end = info.committed
            if pos < end:
                pos = self._offset = await self._send_range(info, pos, end)
                if not backlog and self.tails is not None and self.tails.delivered is not None:
                    self.tails.delivered(entry.name, 1)  # committed while it was followed
                backlog = False
                continue
            backlog = False
            if info.sealed:
                return
            stopped = self.catalog.quarantined.get(self.table)
            if stopped is not None:
                raise quarantined(self.table, stopped)
            if self.tails is not None and (self._filter is None or self._filter.settled):
                self._following = True
                try:
                    follower = await self.tails.follow(self.out, entry, info, pos,
                                                       self.format, self.style)
                finally:
                    self._following = False
                self.bytes_sent += follower.bytes_sent
                self.records_sent += follower.records_sent
                pos = self._offset = follower.returned.result()
                continue
            # Shared by every session tailing the table: shield it, or one session
            # leaving would cancel the others' wait.
            await asyncio.shield(entry.changed())

    async def _send_schema(self, info: VersionInfo) -> None:
        if self.format == Format.JSON:
            await self._write(schema_line(info.schema.avsc, info.schema.fields,
                                          self.style.dialect))
        else:
            await self._write(self._held().pread(info.header.size, 0))

    async def _send_range(self, info: VersionInfo, pos: int, end: int) -> int:
        if self.format == Format.AVRO and (self._filter is None or self._filter.settled):
            await self._send_file(info, pos, end)
            return end
        for block in scan_blocks(info.path, info.header, pos, end, self._held().fd):
            if self.format == Format.JSON:
                await self._send_json(info, block)
            else:
                await self._send_avro_block(info, block)
        return end

    async def _send_json(self, info: VersionInfo, block: Block,
                         until: _Until | None = None) -> None:
        if large(info, block, self._held().fd):  # not held whole: big values in pieces
            await send_large_block(info, block, self._held().fd, self.style, self._write,
                                   self._sent_records, self._accepts(until))
            return
        if until is None and (self._filter is None or self._filter.settled):
            await self._write(json_block(info, block, self.style))
            self._sent_records(block.count)
            return
        render = compile_renderer(info.header.schema_json, self.style)
        suffix = repair_suffix(info, block, self.style.dialect)
        accepts = self._filter
        out = bytearray()
        for record in decode_records(info, block):
            if accepts is not None and not accepts.settled and not accepts.accepts(record):
                continue
            if until is not None and not until.covers(record):
                if until.done:
                    break
                continue
            out += with_suffix(render(record), suffix)
            self._sent_records(1)
            if len(out) >= CHUNK:
                await self._write(bytes(out))
                out.clear()
        if out:
            await self._write(bytes(out))

    def _accepts(self, until: _Until | None) -> Callable[[dict[str, Any]], bool] | None:
        """Whether a record is sent, by the stream's filter and its end (None: every one)."""
        accepts = self._filter
        if until is None and (accepts is None or accepts.settled):
            return None

        def sent(record: dict[str, Any]) -> bool:
            if accepts is not None and not accepts.settled and not accepts.accepts(record):
                return False
            return until is None or until.covers(record)
        return sent

    async def _send_avro_block(self, info: VersionInfo, block: Block,
                               until: _Until | None = None) -> None:
        """A block seen while a GTID filter is not settled, or at the end of a bounded read:
        send it as stored if it keeps all its records, re-encoded with only those it keeps
        otherwise, or not at all."""
        records = metadata_slices(info, block)
        kept = records
        if self._filter is not None:
            kept = [r for r in kept if self._filter.accepts(r[0])]
        if until is not None:
            kept = [r for r in kept if until.covers(r[0])]
        count, whole = len(kept), len(kept) == len(records)
        data = None if whole or not kept else block_of(info, [encoded for _, encoded in kept])
        del records, kept  # not held while the client takes the block
        if whole:  # as stored, from the file
            self.bytes_sent += await self.out.send_file(self._held().fd, block.offset,
                                                        block.end - block.offset)
        elif data is not None:
            await self._write(data)
        self._sent_records(count)

    async def _send_file(self, info: VersionInfo, pos: int, end: int) -> None:
        """Stored bytes as they are (:meth:`Outbox.send_file`), from the shared descriptor."""
        self.bytes_sent += await self.out.send_file(self._held().fd, pos, end - pos)

    def _sent_records(self, count: int) -> None:
        self.records_sent += count
        self.out.records(count)

    @staticmethod
    def _read(info: VersionInfo, offset: int, size: int) -> bytes:
        """A tail's read (:func:`read_range`): a descriptor for the call only, no await."""
        with open(info.path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    async def _write(self, data: bytes) -> None:
        self.bytes_sent += len(data)
        await self.out.send(data)


@dataclass
class _Run:
    """Consecutive stored blocks sent as they are (``end`` after the last one added)."""

    start: int
    end: int = 0
    count: int = 0  # records

    def add(self, block: Block) -> None:
        if not self.count:
            self.start = block.offset
        self.end, self.count = block.end, self.count + block.count
