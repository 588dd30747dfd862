"""The service: its components, started in order and stopped in reverse, in one process.

Start order: the stored data (the users file is checked, the store opened, which repairs it back
to its checkpoint), the listener (it serves what is stored even while the source does not
answer), monitoring, the admin API, replication, then the dumps and housekeeping that work
beside it; what cannot be used stops the start in one line (:mod:`cdcserver.app.startup`).
Stop order, the reverse: housekeeping and the dumps end, replication stops reading, the
pipeline applies what was handed over and the final checkpoint is written, then the endpoints
close, the listener last, and the store. A component that fails stops the others the same
way, and its error goes on (:mod:`cdcserver.app.lifecycle`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from cdcserver.app import descriptors
from cdcserver.app.adminapi import AdminApi
from cdcserver.app.dumps import Dumps
from cdcserver.app.housekeeping import Housekeeping
from cdcserver.app.lifecycle import Component, running
from cdcserver.app.listener import Listener
from cdcserver.app.monitor import Monitoring
from cdcserver.app.replicating import Replication
from cdcserver.app.stored import StoredData
from cdcserver.core.config import Config
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.ops.metrics import HousekeepingStats, ServiceStats
from cdcserver.sinks.base import Sink
from cdcserver.store.index import StoreIndex


class Service:
    def __init__(self, config: Config, more_sinks: Sequence[Sink] = ()) -> None:
        """``more_sinks``: fed beside the store and Kafka from the start (tests, benches)."""
        config.check()  # a Config built in code is checked as a loaded one is
        budgets = descriptors.take(config)
        # the start logs what the budgets cut of the configuration as given
        self._report_budgets = functools.partial(descriptors.report, config, budgets)
        self.config = config = descriptors.within(config, budgets)
        latency = Monitoring.latency(config.metrics)
        self.data = data = StoredData(config)
        self.replication = replication = Replication(config, data.layout, data.catalog,
                                                     data.store, latency, more_sinks)
        self.housekeeping = Housekeeping(config, data, replication)
        # each dump taken wakes the cleaner: a client asking for dumps without end (START-DUMP
        # in a loop) must not fill the disk between two of its timed passes
        self.dumps = Dumps(config, data.catalog, replication, self.housekeeping.cleaner.wake)
        self.listener = Listener(config, data, replication, self.dumps.scheduler,
                                 self.housekeeping.cleaner, latency, self.wait_caught_up)
        self.monitoring = Monitoring(config, latency, self.stats, replication.runner.stats)
        self.admin = AdminApi(config, data, replication.runner, self.listener.server,
                              self.dumps.scheduler, self.stats)
        self._ended = _Ended()

    def components(self) -> list[Component]:
        """In start order; they stop in reverse."""
        return [self.data, self.listener, self.monitoring, self.admin, self.replication,
                self.dumps, self.housekeeping]

    async def run(self, stop: asyncio.Event, started: Callable[[Service], None] | None = None
                  ) -> None:
        """Serve until ``stop`` is set; raises if replication fails for good."""
        try:
            await self._run(stop, started)
        except BaseException as exc:
            self._ended.set(exc if isinstance(exc, Exception) else
                            CdcError("the service was cancelled"))
            raise
        else:
            self._ended.set(None)

    async def _run(self, stop: asyncio.Event, started: Callable[[Service], None] | None
                   ) -> None:
        self._report_budgets()
        async with running(self.components()):
            if started is not None:
                started(self)
            await _first(stop.wait(), self.replication.ended())

    def stats(self) -> ServiceStats:
        scheduler = self.dumps.scheduler
        cleaner = self.housekeeping.cleaner
        return ServiceStats(
            replication=self.replication.runner.stats(),
            applied=str(self.replication.stored_state()),
            lag=self.housekeeping.measured_lag(),
            repairs=self.replication.runner.repair_stats, store=self.data.store.stats(),
            listener=self.listener.server.stats(),
            sinks=[sink.status() for sink in self.replication.sinks],
            housekeeping=HousekeepingStats(cleaner.runs, cleaner.deleted, scheduler.runs,
                                           scheduler.running, scheduler.entries()))

    async def wait_caught_up(self, target: GtidState) -> None:
        """Return once every sink has applied all transactions up to ``target``; raises
        if the service ended first (it failed to start, or stopped), instead of waiting
        forever."""
        waiting = asyncio.ensure_future(self._caught_up(target))
        ended = asyncio.ensure_future(self._ended.event.wait())
        try:
            await asyncio.wait({waiting, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, ended):
                if not task.done():
                    task.cancel()
        if waiting.done() and not waiting.cancelled():
            waiting.result()
            return
        error = self._ended.error
        if error is not None:
            raise CdcError(f"the service stopped: {error}") from error
        raise CdcError("the service stopped before it caught up")

    async def _caught_up(self, target: GtidState) -> None:
        runner = self.replication.runner
        await runner.replicating.wait()
        index = self.data.store.index
        assert index is not None
        left = _Unreached(list(target), index)
        await runner.wait_applied(lambda state: left.reached(runner.pipeline, state))


class _Unreached:
    """A target's GTIDs, each checked until it is reached, in turn: every commit wakes every
    waiting client, and checking every domain of each client's state each time cost a
    commit a check per domain per client (100 clients with states of 6,000 domains stalled
    the event loop 300-480 ms a commit: found by attack). A GTID reached stays reached while
    one pipeline runs; a new one (started over from a checkpoint) checks them all again."""

    def __init__(self, target: list[Gtid], index: StoreIndex) -> None:
        self.target = target
        self.index = index
        self.pipeline: object = None
        self.next = 0  # the target's GTIDs before it are reached

    def reached(self, pipeline: object, state: GtidState) -> bool:
        if pipeline is not self.pipeline:
            self.pipeline, self.next = pipeline, 0
        while self.next < len(self.target) and \
                self.index.reached(state, self.target[self.next]):
            self.next += 1
        return self.next == len(self.target)


class _Ended:
    """Whether run() has ended, and its error if it failed."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.error: Exception | None = None

    def set(self, error: Exception | None) -> None:
        self.error = error
        self.event.set()


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    """Return when the first of ``waits`` ends (raising its error); the others are
    cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()
