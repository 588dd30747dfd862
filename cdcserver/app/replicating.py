"""Replication as a component: the sources, the sinks, and the runner that feeds them.

Started last (the listener already serves what is stored, even while the source does not
answer); stopped first: the replicator stops reading, the pipeline applies what was handed over
and ends, the store's final checkpoint is written, and every sink is closed. How the runner
replicates is :mod:`cdcserver.app.runner`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from cdcserver.app.runner import ReplicationRunner
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.config import Config
from cdcserver.core.errors import DiskFull
from cdcserver.core.gtid import GtidState
from cdcserver.ops.latency import CommitLatency
from cdcserver.replication.sources import Sources
from cdcserver.sinks.base import Sink
from cdcserver.sinks.kafka.publisher import kafka_sinks
from cdcserver.sinks.store import StoreSink
from cdcserver.store import transcoder
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore

FINISH_TIMEOUT = 30.0  # seconds the pipeline has, once stopped, to apply and flush

log = logging.getLogger(__name__)


class Replication:
    def __init__(self, config: Config, layout: DataDir, catalog: Catalog, store: AvroStore,
                 latency: CommitLatency | None = None, more_sinks: Sequence[Sink] = ()
                 ) -> None:
        self.capture = CaptureFilter.of(config.capture)
        self.sources = Sources(config.source.addresses())  # the replicator moves between them
        self.sinks: list[Sink] = [
            StoreSink(store),
            *kafka_sinks(config, self.sources, catalog.version_created_by, catalog),
            *more_sinks,
        ]
        self.runner = ReplicationRunner(
            config.source, layout, catalog, self.sinks,
            flush_interval=config.store.flush_interval,
            disk_full_retry=config.store.disk_full_retry, defer_decoding=transcoder.takes,
            sources=self.sources, capture=self.capture,
            on_applied=latency.applied if latency is not None else None)
        self._store = store
        self._task: asyncio.Task[None] | None = None

    def sink(self, name: str) -> Sink | None:
        """The sink of that name taking part in replication now (None: there is none, or it
        stands by)."""
        return next((s for s in self.sinks if s.name == name and s.active), None)

    def stored_state(self) -> GtidState:
        """Every transaction applied by every sink so far (before replication starts: the
        store's checkpoint)."""
        durable = self._store.durable
        return self.runner.applied(
            lambda: durable.gtid_state if durable is not None else GtidState())

    async def start(self) -> None:
        self._task = asyncio.create_task(self.runner.run(), name="replication")

    async def ended(self) -> None:
        """Return when replication ends by itself; raise its error if it failed for good."""
        assert self._task is not None
        await asyncio.shield(self._task)

    async def stop(self) -> None:
        task = self._task
        assert task is not None
        try:
            await self._finish(task)
        finally:
            for sink in self.sinks:
                await sink.close()

    async def _finish(self, task: asyncio.Task[None]) -> None:
        """Stop reading, let the pipeline apply what it holds, then the final checkpoint."""
        if self.runner.replicator is None and not task.done():
            # Still resolving where to start: nothing was replicated, stop right here.
            await _cancelled(task)
        await self.runner.stop()
        if not task.done():
            # The replicator's finish() ends the pipeline after its final flush.
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=FINISH_TIMEOUT)
            except TimeoutError:
                await _cancelled(task)
        if self.runner.may_checkpoint(self.sinks[0]) and not self._store.damaged:
            # (not while a repair is not yet out: the checkpoint must stay before the change
            # it repairs, so that the next start reads the change, and repairs it, again;
            # nor while a replay has not reached where the store stood, nor after a part
            # failed half applied: Pipeline.may_checkpoint)
            try:
                await self._store.flush()
            except DiskFull as exc:  # the stop goes on: the next start replays a little more
                log.warning("the final checkpoint was not written, the next start replays "
                            "from the last one: %s", exc)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
