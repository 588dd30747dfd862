"""One reader for every client waiting at the end of a table version.

Clients that have caught up with a table (the usual state of a CDC consumer) all want the
same bytes when a transaction commits. Instead of every session waking up, reading the new
blocks and rendering them, a ``Tail`` per (version file, format, JSON style) does it once and
writes the result to each waiting session's outbox: a commit costs one render and one
``write`` per client.

A session hands itself over with ``Tails.follow`` when it stands at the version's committed
end with no filter left to apply, and gets its position back (it then continues alone) when:
the version is sealed; its client reads too slowly (more than ``MAX_BUFFERED`` bytes wait in
its outbox: it falls back to its own stream, whose writes await ``drain()``); a commit
adds more than ``MAX_RANGE`` bytes (each session streams that in bounded chunks); or it is
cancelled (the client sent a command or left). Bytes go out in commit order either way: the
tail writes only at the position the session stood at, and the session resumes where the
tail stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from cdcserver.core.names import TableName
from cdcserver.protocol.dialect import JsonStyle
from cdcserver.protocol.outbox import Outbox, Traffic
from cdcserver.protocol.render import json_block
from cdcserver.store.avrofile import scan_blocks
from cdcserver.store.catalog import TableEntry, VersionInfo
from mariadb_cdc_client.format.wire import Format

log = logging.getLogger(__name__)

MAX_BUFFERED = 1 << 20
MAX_RANGE = 1 << 20
# After a broadcast that took d seconds, the tail rests REST x d before the next one: the
# commits that come meanwhile go out in one write per client. With few clients d is
# microseconds (no wait to speak of); with thousands the sends are most of the service's CPU
# (each is a trip through the kernel's TCP stack), and resting keeps one table's fan-out from
# taking all of it.
REST = 0.5

# (data, records) for the bytes of a version from one offset to another, as a stream sends them
RangeReader = Callable[[VersionInfo, int, int, Format, JsonStyle], tuple[bytes, int]]
# told after what a table's newest commit added was written to this many clients (the metrics)
Delivered = Callable[[TableName, int], None]


def read_range(info: VersionInfo, pos: int, end: int, fmt: Format, style: JsonStyle
               ) -> tuple[bytes, int]:
    """The bytes an unfiltered stream sends for ``info`` from ``pos`` to ``end`` (block
    boundaries), and how many records they hold (JSON; AVRO copies bytes and counts 0)."""
    if fmt == Format.AVRO:
        return _read(info, pos, end - pos), 0
    out, count = bytearray(), 0
    for block in scan_blocks(info.path, info.header, pos, end):
        out += json_block(info, block, style)
        count += block.count
    return bytes(out), count


def _read(info: VersionInfo, offset: int, size: int) -> bytes:
    """A tail's read (:func:`read_range`): a descriptor for the call only, no await."""
    with open(info.path, "rb") as f:
        f.seek(offset)
        return f.read(size)


@dataclass(eq=False)
class Follower:
    """A session handed over to a tail: where to write, and what it has been sent."""

    out: Outbox
    returned: asyncio.Future[int]  # the position the session continues from
    bytes_sent: int = 0
    records_sent: int = 0


class Tail:
    def __init__(self, tails: Tails, key: tuple[str, Format, JsonStyle], entry: TableEntry,
                 info: VersionInfo, pos: int) -> None:
        self.tails = tails
        self.key = key
        self.entry = entry
        self.info = info
        self.pos = pos
        self.followers: set[Follower] = set()
        self.bytes_sent = 0  # to each follower present, since the tail started
        self.records_sent = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        rest_until = 0.0  # (loop time) the next broadcast waits until then
        try:
            while self.followers:
                end = self.info.committed
                if end > self.pos:
                    if end - self.pos > MAX_RANGE:
                        break
                    rest = rest_until - loop.time()
                    if rest > 0:  # commits meanwhile go out together
                        await asyncio.sleep(rest)
                        continue
                    started = loop.time()
                    self._broadcast(end)
                    rest_until = loop.time() + REST * (loop.time() - started)
                    continue
                if self.info.sealed or self.tails.stopped(self.entry.name):
                    break
                await asyncio.shield(self.entry.changed())
        except Exception:
            log.exception("tail of %s failed; its clients continue alone", self.info.path)
        finally:
            self.tails.ended(self)
            for follower in list(self.followers):
                self._release(follower)

    def _broadcast(self, end: int) -> None:
        """One commit's bytes to every follower: a ``write`` each (the socket takes them at
        once unless the client lags), the counting done once for all. This loop is the
        fan-out's cost: a thousand clients make it a thousand sends per commit."""
        data, records = self.tails.read_range(self.info, self.pos, end, self.key[1], self.key[2])
        size = len(data)
        writes = 0
        for follower in list(self.followers):
            out = follower.out
            transport = out.transport
            if transport.is_closing():
                self.leave(follower)
                if not follower.returned.done():
                    follower.returned.set_exception(
                        ConnectionResetError("the client closed the connection"))
            elif transport.get_write_buffer_size() > MAX_BUFFERED:
                self._release(follower)  # a slow reader: it continues alone, with drain()
            else:
                transport.write(data)
                out.bytes_sent += size
                out.records_sent += records
                writes += 1
        self.pos = end
        self.bytes_sent += size
        self.records_sent += records
        if writes:
            traffic = self.tails.traffic
            traffic.bytes_sent += size * writes
            traffic.records_sent += records * writes
            if self.tails.delivered is not None:
                self.tails.delivered(self.entry.name, writes)

    def join(self, follower: Follower) -> None:
        follower.bytes_sent, follower.records_sent = self.bytes_sent, self.records_sent
        self.followers.add(follower)

    def leave(self, follower: Follower) -> None:
        """``follower`` gets no more: it was sent what the tail sent since it joined."""
        if follower in self.followers:
            self.followers.discard(follower)
            follower.bytes_sent = self.bytes_sent - follower.bytes_sent
            follower.records_sent = self.records_sent - follower.records_sent

    def _release(self, follower: Follower) -> None:
        self.leave(follower)
        if not follower.returned.done():
            follower.returned.set_result(self.pos)


class Tails:
    """The tails of one listener."""

    def __init__(self, read_range: RangeReader, traffic: Traffic,
                 stopped: Callable[[TableName], bool] = lambda table: False,
                 delivered: Delivered | None = None) -> None:
        self.read_range = read_range
        self.traffic = traffic  # the listener's totals, counted for every write
        # whether a table's stream stopped (quarantined): its tail hands its sessions back
        self.stopped = stopped
        self.delivered = delivered  # told of each write a tail delivers (the metrics)
        self._tails: dict[tuple[str, Format, JsonStyle], Tail] = {}

    async def follow(self, out: Outbox, entry: TableEntry,
                     info: VersionInfo, pos: int, fmt: Format, style: JsonStyle) -> Follower:
        """Wait at ``pos`` (the version's committed end) and let the tail send what commits
        next; returns when the session should continue alone from ``returned``'s result."""
        key = (info.path, fmt, style)
        tail = self._tails.get(key)
        if tail is None or tail.info is not info:
            tail = self._tails[key] = Tail(self, key, entry, info, pos)
        follower = Follower(out, asyncio.get_running_loop().create_future())
        if tail.pos != pos:
            # The tail is before or past this session (a commit is on its way to it): wait
            # for that commit, then catch up alone and come back.
            if not self.stopped(entry.name):
                await asyncio.shield(entry.changed())
            follower.returned.set_result(pos)
            return follower
        tail.join(follower)
        try:
            await follower.returned
        finally:
            tail.leave(follower)
        return follower

    def ended(self, tail: Tail) -> None:
        if self._tails.get(tail.key) is tail:
            del self._tails[tail.key]

    async def stop(self) -> None:
        tasks = [tail.task for tail in self._tails.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
