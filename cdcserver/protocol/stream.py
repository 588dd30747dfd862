"""Serving ``REQUEST-DATA``: the schema, the stored records, then new ones as they commit.

For each version, from the requested one (or the first) on: the schema (JSON mode: the
``.avsc`` line; AVRO mode: the file's container header, once), then its committed records
(JSON: one object per line; AVRO: the file's blocks as stored), then, while the version is the
newest, whatever later commits add. When a newer version is published and this one is fully
sent, the stream moves on, so a client learns of a schema change in-band.

A GTID positions the stream in both modes: the index gives an offset to scan from and the
stream starts at the first record of that domain whose sequence is at or after the GTID's
(inclusive, as MaxScale; any server_id, unlike MaxScale, so a seek survives a failover). In
AVRO mode a block that starts before that record is re-encoded without the records before it.

Waiting is on the catalog's per-table change future: no polling. Every write awaits
``drain()``, so a client that does not read slows only its own stream, with at most one chunk
in memory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

from cdcserver.gtid import Gtid
from cdcserver.protocol.records import compile_renderer, decode_records, encode_block
from cdcserver.store.avrofile import Block, scan_blocks
from cdcserver.store.catalog import Catalog, TableEntry, VersionInfo
from cdcserver.store.index import StoreIndex
from cdcserver.store.naming import TableName
from client.wire import DataRequest, Format

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


@dataclass
class _Seek:
    domain: int
    sequence: int
    found: bool = False

    def matches(self, record: dict[str, object]) -> bool:
        if record["domain"] == self.domain and record["sequence"] >= self.sequence:  # type: ignore[operator]
            self.found = True
        return self.found


class Streamer:
    def __init__(self, catalog: Catalog, index: StoreIndex | None, request: DataRequest,
                 fmt: Format, writer: asyncio.StreamWriter, zone: dt.tzinfo = dt.UTC) -> None:
        self.catalog = catalog
        self.index = index
        self.request = request
        self.format = fmt
        self.writer = writer
        self.zone = zone
        self.table = TableName(request.database, request.table)
        self.records_sent = 0
        self.bytes_sent = 0
        self._seek: _Seek | None = None
        if request.gtid:
            gtid = Gtid.parse(request.gtid)
            self._seek = _Seek(gtid.domain, gtid.sequence)

    async def run(self) -> None:
        entry = self.catalog.get(self.table)
        if entry is None:
            return
        info = entry.versions.get(self.request.version) if self.request.version else \
            entry.first()
        while info is not None:
            await self._send_schema(info)
            await self._follow(entry, info, self._start_offset(info))
            info = entry.after(info.version)

    def _start_offset(self, info: VersionInfo) -> int:
        if self._seek is None or self._seek.found or self.index is None:
            return info.header.size
        offset = self.index.seek_offset(self.table, info.version, self._seek.domain,
                                        self._seek.sequence)
        return offset if offset is not None else info.header.size

    async def _follow(self, entry: TableEntry, info: VersionInfo, pos: int) -> None:
        """Send ``info`` from ``pos`` and keep following it until it is sealed and sent."""
        while True:
            end = info.committed
            if pos < end:
                pos = await self._send_range(info, pos, end)
                continue
            if info.sealed:
                return
            # Shared by every session tailing the table: shield it, or one session
            # leaving would cancel the others' wait.
            await asyncio.shield(entry.changed())

    async def _send_schema(self, info: VersionInfo) -> None:
        if self.format == Format.JSON:
            await self._write(info.schema.text().encode("utf-8") + b"\n")
        else:
            await self._write(self._read(info, 0, info.header.size))

    async def _send_range(self, info: VersionInfo, pos: int, end: int) -> int:
        if self.format == Format.AVRO and (self._seek is None or self._seek.found):
            while pos < end:
                size = min(CHUNK, end - pos)
                await self._write(self._read(info, pos, size))
                pos += size
            return end
        for block in scan_blocks(info.path, info.header, pos, end):
            if self.format == Format.JSON:
                await self._send_json(info, block)
            else:
                await self._send_avro_block(info, block)
        return end

    async def _send_json(self, info: VersionInfo, block: Block) -> None:
        render = compile_renderer(info.header.schema_json, self.zone)
        seek = self._seek
        out = bytearray()
        for record in decode_records(info, block):
            if seek is not None and not seek.found and not seek.matches(record):
                continue
            out += render(record)
            self.records_sent += 1
            if len(out) >= CHUNK:
                await self._write(bytes(out))
                out.clear()
        if out:
            await self._write(bytes(out))

    async def _send_avro_block(self, info: VersionInfo, block: Block) -> None:
        """A block seen while a GTID seek is pending: send it without the records before the
        seek point (or not at all if it has none after it)."""
        assert self._seek is not None
        records = list(decode_records(info, block))
        for i, record in enumerate(records):
            if self._seek.matches(record):
                if i == 0:
                    await self._write(self._read(info, block.offset, block.end - block.offset))
                else:
                    await self._write(encode_block(info, records[i:]))
                self.records_sent += len(records) - i
                return

    @staticmethod
    def _read(info: VersionInfo, offset: int, size: int) -> bytes:
        with open(info.path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        self.bytes_sent += len(data)
        await self.writer.drain()
