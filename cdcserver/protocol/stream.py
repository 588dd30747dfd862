"""Serving ``REQUEST-DATA``: the schema, the stored records, then new ones as they commit.

For each version, from the requested one (or the first) on: the schema (JSON mode: the
``.avsc`` line; AVRO mode: the file's container header, once), then its committed records
(JSON: one object per line; AVRO: the file's blocks as stored), then, while the version is the
newest, whatever later commits add. When a newer version is published and this one is fully
sent, the stream moves on, so a client learns of a schema change in-band.

A GTID, ``AFTER <state>`` and ``UNTIL <state>`` choose the records sent (``filters.py``):
the index gives an offset to scan from. In AVRO mode a block that holds records before the
starting point is re-encoded without them.

A stream bounded by ``UNTIL`` ends with a JSON line. In AVRO mode the blocks the index proves
covered go out as stored, so a bounded read costs the server a file copy, not a decode; only
the blocks around the end are decoded and re-encoded with the records the range holds.

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
from typing import Any, NoReturn

from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.protocol.bigjson import send_large_block
from cdcserver.protocol.blockdata import large
from cdcserver.protocol.dialect import JsonStyle, schema_line
from cdcserver.protocol.filters import After, Order, Seek, Until
from cdcserver.protocol.openfiles import files_spent
from cdcserver.protocol.outbox import Outbox
from cdcserver.protocol.render import (
    EXACT,
    compile_renderer,
    json_block,
    metadata_slices,
    repair_suffix,
    with_suffix,
)
from cdcserver.protocol.requests import StreamRequest
from cdcserver.protocol.tail import Tails
from cdcserver.store.avrofile import Block, scan_blocks
from cdcserver.store.catalog import Catalog, TableEntry, VersionInfo
from cdcserver.store.checkpoint import Quarantined
from cdcserver.store.index import StoreIndex
from cdcserver.store.inuse import FILES, SharedFile, TooManyOpen
from cdcserver.store.naming import version_file
from cdcserver.store.records import block_of, decode_records
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import Code, Format, ProtocolError

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


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
        out.lines = fmt == Format.JSON
        self.style = style  # JSON mode: dialect and time zone
        self.table = request.table
        self.records_sent = 0  # by this stream (and the tails it followed)
        self.bytes_sent = 0
        self.at: VersionInfo | None = None  # the version being sent (the admin API)
        self._offset = 0  # sent up to, in it
        self._following = False  # handed over to the table's tail: at its committed end
        self._file: SharedFile | None = None  # the version file sent (other streams share it)
        self._filter: Seek | After | None = None
        if request.after is not None:
            self._filter = After(request.after.stored, request.after.given, Order(index))
        elif request.seek is not None:
            self._filter = Seek(request.seek, Order(index))
        self._until: Until | None = None
        if request.until is not None:
            self._until = Until(request.until.stored, request.until.given, Order(index))

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
        if isinstance(self._filter, After):
            await self.caught_up(self._filter.given)

    async def _send_bounded(self, info: VersionInfo, pos: int, end: int,
                            until: Until) -> None:
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
        if isinstance(self._filter, After):
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
                         until: Until | None = None) -> None:
        if large(info, block, self._held().fd):  # not held whole: big values in pieces
            await send_large_block(info, block, self._held().fd, self.style, self._write,
                                   self._sent_records, self._accepts(until))
            return
        if until is None and (self._filter is None or self._filter.settled):
            await self._write(json_block(info, block, self.style))
            self._sent_records(block.count)
            return
        render = compile_renderer(info.schema_json, self.style)
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

    def _accepts(self, until: Until | None) -> Callable[[dict[str, Any]], bool] | None:
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
                               until: Until | None = None) -> None:
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
