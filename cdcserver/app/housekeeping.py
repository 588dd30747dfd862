"""Housekeeping as a component: the retention cleaner, the resyncs of quarantined tables, and
the lag probe (while the metrics or the admin API can show it)."""

from __future__ import annotations

from cdcserver.app.lifecycle import Loops
from cdcserver.app.replicating import Replication
from cdcserver.app.resyncs import ResyncScheduler
from cdcserver.app.stored import StoredData
from cdcserver.core.config import Config
from cdcserver.dump.retention import Cleaner
from cdcserver.ops.lag import Lag, LagProbe


class Housekeeping:
    def __init__(self, config: Config, data: StoredData, replication: Replication) -> None:
        store = data.store
        self.cleaner = Cleaner(config.retention, config.store.data_dir, data.catalog,
                               lambda: store.index)
        self.resyncs = ResyncScheduler(data.catalog, config.store.data_dir,
                                       replication.runner.request_resync)
        self.lag = LagProbe(replication.sources, replication.stored_state,
                            replication.runner.last_commit, config.metrics.lag_interval)
        # the probe queries the source: only while something shows what it measures
        self._probing = config.metrics.host_port() is not None or config.admin.enabled
        self._loops = Loops()

    def measured_lag(self) -> Lag | None:
        return self.lag.lag if self._probing else None

    async def start(self) -> None:
        self._loops.spawn(self.cleaner.run(), "cleaner")
        self._loops.spawn(self.resyncs.run(), "resyncs")
        if self._probing:
            self._loops.spawn(self.lag.run(), "lag probe")

    async def stop(self) -> None:
        await self._loops.cancel()
