"""The change pipeline: from the replicator's hand-off to every sink, checkpointing by flushes.

Every sink implements :class:`Sink`: ``apply`` writes changes (not necessarily durably),
``flush`` makes everything applied durable and returns the position it covers. Each sink keeps
its own checkpoint; replication starts from the earliest of them, and a sink is not given a
transaction its own checkpoint already covers, so a restart after a crash duplicates nothing in
any sink. Flushes run every ``flush_interval`` seconds in the background, so checkpoint I/O
overlaps with decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from cdcserver.changes import Begin, Change, Commit
from cdcserver.errors import CdcError
from cdcserver.gtid import BinlogPosition, GtidState, binlog_ordinal
from cdcserver.handoff import Handoff

log = logging.getLogger(__name__)


class Sink(Protocol):
    name: str
    durable: BinlogPosition | None

    async def apply(self, changes: list[Change]) -> None: ...

    async def flush(self) -> BinlogPosition | None: ...


def start_position(sinks: list[Sink], default: BinlogPosition) -> BinlogPosition:
    """Where replication resumes: the earliest checkpoint of all sinks (a sink without one
    starts where configured). The binlog file/pos is the earliest too; it is what a MySQL
    source without GTIDs resumes from."""
    positions = [s.durable for s in sinks if s.durable is not None]
    if len(positions) < len(sinks):
        positions.append(default)
    earliest = min(positions, key=lambda p: binlog_ordinal(p.file, p.pos))
    return BinlogPosition(min_state([p.gtid_state for p in positions]), earliest.file,
                          earliest.pos)


def min_state(states: list[GtidState]) -> GtidState:
    result = states[0]
    for state in states[1:]:
        result = result.minimum(state)
    return result


class _ReplayFilter:
    """Drops the transactions a sink's checkpoint already covers."""

    def __init__(self, covered: GtidState | None) -> None:
        self.covered = covered
        self.skipping = False

    def __call__(self, changes: list[Change]) -> list[Change]:
        if self.covered is None:
            return changes
        kept: list[Change] = []
        skipped = False
        for change in changes:
            if isinstance(change, Begin):
                self.skipping = self.covered.covers(change.gtid)
            if self.skipping:
                skipped = True
                if isinstance(change, Commit):
                    self.skipping = False
                continue
            kept.append(change)
        return kept if skipped else changes


class Pipeline:
    def __init__(self, handoff: Handoff, sinks: list[Sink], start: GtidState,
                 flush_interval: float = 0.2) -> None:
        self.handoff = handoff
        self.sinks = sinks
        self.flush_interval = flush_interval
        self._filters = [_ReplayFilter(s.durable.gtid_state if s.durable else None)
                         for s in sinks]
        self.state = start  # after the last transaction every sink has applied
        self.transactions = 0
        self.last_commit_timestamp: int | None = None  # the source's, of the newest applied
        self._progress: asyncio.Future[None] | None = None

    def progress(self) -> asyncio.Future[None]:
        """A future resolved after the next batch of transactions is applied."""
        if self._progress is None or self._progress.done():
            self._progress = asyncio.get_running_loop().create_future()
        return self._progress

    async def run(self) -> None:
        """Until the replicator's stream ends (returns) or fails, or a checkpoint cannot be
        written (raises the error)."""
        flusher = asyncio.create_task(self._flush_periodically())
        try:
            while True:
                taking = asyncio.ensure_future(self.handoff.get())
                await asyncio.wait({taking, flusher}, return_when=asyncio.FIRST_COMPLETED)
                if flusher.done():
                    taking.cancel()
                    flusher.result()  # a failed checkpoint stops the pipeline
                batches = taking.result()
                if not batches:
                    break
                for batch in batches:
                    await self._apply(batch)
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        await self.flush()

    async def _apply(self, batch: list[Change]) -> None:
        for sink, keep in zip(self.sinks, self._filters, strict=True):
            changes = keep(batch)
            if changes:
                await sink.apply(changes)
        for change in batch:
            if isinstance(change, Commit):
                self.state = change.position.gtid_state
                self.transactions += 1
                self.last_commit_timestamp = change.timestamp
        progress, self._progress = self._progress, None
        if progress is not None and not progress.done():
            progress.set_result(None)

    async def flush(self) -> None:
        await asyncio.gather(*(sink.flush() for sink in self.sinks))

    async def _flush_periodically(self) -> None:
        """Each sink on its own cadence: one waiting for a broker does not hold back the
        others' checkpoints."""
        loops = [asyncio.create_task(self._flush_loop(sink)) for sink in self.sinks]
        try:
            await asyncio.gather(*loops)
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _flush_loop(self, sink: Sink) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await sink.flush()
            except CdcError as exc:
                if not exc.retriable:
                    raise
                log.warning("%s: checkpoint not written, retrying: %s", sink.name, exc)
