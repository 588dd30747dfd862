"""Monitoring as a component: ``/metrics``, ``/health``, ``/live`` and ``/ready`` on their own
listener (docs/monitoring.md), unless ``metrics.listen`` is empty."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.registry import Collector

from cdcserver.core.config import Config, MetricsConfig
from cdcserver.core.errors import ConfigError
from cdcserver.ops.latency import CommitLatency
from cdcserver.ops.metrics import (
    DiskSpace,
    ReplicationStats,
    ServiceCollector,
    ServiceStats,
    health,
    service_registry,
)
from cdcserver.ops.monitoring import MonitoringServer
from cdcserver.ops.probes import live, ready


class Monitoring:
    def __init__(self, config: Config, latency: CommitLatency | None,
                 stats: Callable[[], ServiceStats],
                 replication: Callable[[], ReplicationStats]) -> None:
        cfg = self.config = config.metrics
        collectors: list[Collector] = [ServiceCollector(stats), DiskSpace(config.store.data_dir)]
        if latency is not None:
            collectors.insert(1, latency)
        self.server = MonitoringServer(service_registry(*collectors), {
            "/health": lambda: health(stats(), cfg.max_lag),
            "/live": lambda: live(replication()),
            "/ready": lambda: ready(stats()),
        })
        self.address: tuple[str, int] | None = None  # once listening

    @staticmethod
    def latency(config: MetricsConfig) -> CommitLatency | None:
        """What the commit latency histograms need told, when there is an endpoint to show
        them."""
        return CommitLatency() if config.host_port() is not None else None

    async def start(self) -> None:
        where = self.config.host_port()
        if where is None:
            return
        try:
            self.address = await self.server.start(*where)
        except OSError as exc:
            raise ConfigError(f"metrics.listen {self.config.listen}: {exc.strerror}; choose "
                              "another HOST:PORT (--metrics-listen) or '' to turn the "
                              "endpoint off") from exc

    async def stop(self) -> None:
        if self.address is not None:
            await self.server.stop()
