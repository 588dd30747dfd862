"""Dumps as a component: the ones asked for (by clients, the admin API and tables newly
included in the capture), and the schedule if one is configured (docs/dumps.md). A request
that comes before they start (the listener starts first) waits in the scheduler's queue."""

from __future__ import annotations

from collections.abc import Callable

from cdcserver.app.lifecycle import Loops
from cdcserver.app.replicating import Replication
from cdcserver.core.config import Config
from cdcserver.dump.included import NewlyIncluded
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.store.catalog import Catalog


class Dumps:
    def __init__(self, config: Config, catalog: Catalog, replication: Replication,
                 taken: Callable[[], None] | None = None) -> None:
        """``taken``: called after each pass of dumps (wakes the retention cleaner)."""
        data_dir = config.store.data_dir
        self.scheduler = DumpScheduler(config.dump, replication.sources, data_dir, catalog,
                                       replication.capture, taken=taken)
        self._included = NewlyIncluded(config.capture, replication.sources.current, data_dir,
                                       self.scheduler)
        self._replicating = replication.runner.replicating
        self._loops = Loops()

    async def start(self) -> None:
        self._loops.spawn(self.scheduler.serve(), "requested dumps")
        self._loops.spawn(self._included.run(self._replicating), "newly included tables")
        if self.scheduler.enabled:
            self._loops.spawn(self.scheduler.run(), "dump schedule")

    async def stop(self) -> None:
        await self._loops.cancel()
