"""What the service reports about itself: Prometheus metrics and the health document.

The collector reads the service's own counters when Prometheus scrapes (prometheus_client's
custom-collector interface), so the hot paths only bump plain integers. Names follow the
Prometheus conventions: ``cdc_`` prefix, base units (seconds, bytes), ``_total`` counters.
``protocol.md`` is about the CDC protocol; the metric list lives in the README ("Observing it").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cdcserver.service import Service

_NAN = float("nan")


class ServiceCollector(Collector):
    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        yield from self._replication()
        yield from self._repairs()
        yield from self._store()
        yield from self._listener()
        yield from self._housekeeping()

    def _replication(self) -> Iterator[Any]:
        s = self.service
        replicator, pipeline, lag = s.replicator, s.pipeline, s.lag.lag if s.lag else None
        yield _gauge("cdc_replication_connected", "1 while the replication connection is up",
                     1 if replicator is not None and replicator.connected.is_set() else 0)
        yield _counter("cdc_replication_reconnects", "replication connections re-established",
                       replicator.reconnects if replicator is not None else 0)
        yield _gauge("cdc_replication_paused", "1 while replication waits for room in the "
                     "data directory", 1 if s.paused else 0)
        yield _gauge("cdc_replication_lag_seconds", "age of the newest applied commit while "
                     "the source has transactions not applied yet (0 when caught up)",
                     _nan_if_none(lag.seconds if lag else None))
        yield _gauge("cdc_replication_lag_transactions", "transactions the source has logged "
                     "that are not applied yet", _nan_if_none(lag.transactions if lag else None))
        yield _counter("cdc_transactions", "transactions applied by every sink",
                       pipeline.transactions if pipeline is not None else 0)
        yield _gauge("cdc_queue_bytes", "binlog bytes handed over by the replicator and not "
                     "applied yet", s.handoff.in_flight if s.handoff is not None else 0)
        yield _gauge("cdc_queue_capacity_bytes", "the most binlog bytes held in flight",
                     s.handoff.capacity if s.handoff is not None else 0)

    def _repairs(self) -> Iterator[Any]:
        stats = self.service.repair_stats
        rowless = CounterMetricFamily(
            "cdc_rowless_changes", "changes made without row events that replication "
            "recognised (a foreign key's cascade, or a statement that rewrote stored rows)",
            labels=["cause"])
        for cause in ("foreign key", "statement"):
            rowless.add_metric([cause], stats.rowless.get(cause, 0))
        yield rowless
        yield _counter("cdc_repairs", "repairs attached to the stream (rows re-read from the "
                       "source at a watermark)", stats.repairs)
        records = CounterMetricFamily("cdc_repair_records", "records a repair added to the "
                                      "stream, by kind of row change", labels=["change"])
        for change in ("insert", "update", "delete"):
            records.add_metric([change], stats.records.get(change, 0))
        yield records
        yield _gauge("cdc_repair_pending", "1 while a repair waits for the stream to reach its "
                     "watermark (no checkpoint is written meanwhile)",
                     1 if self.service.pipeline is not None and
                     self.service.pipeline.repair_pending else 0)

    def _store(self) -> Iterator[Any]:
        store = self.service.store
        yield _counter("cdc_rows_in", "records written to the Avro files (an UPDATE is two)",
                       store.records_written)
        yield _gauge("cdc_checkpoint_age_seconds", "how long the newest applied transaction "
                     "has waited for a checkpoint (0: everything applied is durable)",
                     store.checkpoint_age())
        versions = GaugeMetricFamily("cdc_table_version", "the newest version of each table",
                                     labels=["table"])
        for name, entry in sorted(self.service.catalog.tables.items()):
            latest = entry.latest()
            if latest is not None:
                versions.add_metric([str(name)], latest.version)
        yield versions

    def _listener(self) -> Iterator[Any]:
        server = self.service.server
        traffic = server.traffic if server is not None else None
        yield _gauge("cdc_clients_connected", "CDC protocol connections open",
                     server.connections if server is not None else 0)
        yield _counter("cdc_connections", "CDC protocol connections accepted",
                       server.connections_total if server is not None else 0)
        yield _counter("cdc_rows_out", "records sent to clients in JSON mode",
                       traffic.records_sent if traffic else 0)
        yield _counter("cdc_sent_bytes", "bytes sent to clients (streams and dumps)",
                       traffic.bytes_sent if traffic else 0)
        yield _counter("cdc_login_failures", "failed authentications",
                       server.login_failures if server is not None else 0)
        yield _counter("cdc_dumps_sent", "dump files sent to clients",
                       server.dumps_sent if server is not None else 0)

    def _housekeeping(self) -> Iterator[Any]:
        s = self.service
        yield _counter("cdc_cleaner_runs", "retention cleaner passes", s.cleaner.runs)
        yield _counter("cdc_cleaner_deleted_files", "files the retention cleaner deleted",
                       s.cleaner.deleted)
        yield _counter("cdc_dump_runs", "scheduled dump passes",
                       s.scheduler.runs if s.scheduler is not None else 0)
        yield _gauge("cdc_dump_running", "1 while a scheduled dump is being taken",
                     1 if s.scheduler is not None and s.scheduler.running else 0)


def health(service: Service, max_lag: float) -> tuple[bool, dict[str, Any]]:
    """(healthy, document) for ``/health``: healthy while replication is connected and the
    lag is known and at most ``max_lag`` seconds."""
    replicator, lag = service.replicator, service.lag.lag if service.lag else None
    problems = []
    if service.paused:
        problems.append(service.paused)
    elif replicator is None:
        problems.append("replication has not started (checking the source, or waiting for it)")
    elif not replicator.connected.is_set():
        problems.append("the replication connection is down (reconnecting)")
    if lag is not None and lag.error:
        problems.append(f"the source did not answer the lag probe: {lag.error}")
    if lag is not None and lag.seconds is not None and lag.seconds > max_lag:
        problems.append(f"replication lag {lag.seconds:.0f}s exceeds {max_lag:.0f}s")
    server = service.server
    document = {
        "status": "degraded" if problems else "ok",
        "problems": problems,
        "replication": {
            "connected": bool(replicator and replicator.connected.is_set()),
            "applied": str(service.stored_state()),
            "lag_seconds": lag.seconds if lag else None,
            "lag_transactions": lag.transactions if lag else None,
            "lag_measured_at": lag.measured_at if lag and lag.measured_at else None,
        },
        "checkpoint_age_seconds": service.store.checkpoint_age(),
        "tables": len(service.catalog.tables),
        "clients": server.connections if server is not None else 0,
        "records_sent": server.traffic.records_sent if server is not None else 0,
        "bytes_sent": server.traffic.bytes_sent if server is not None else 0,
        "time": time.time(),
    }
    return not problems, document


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _nan_if_none(value: float | None) -> float:
    return _NAN if value is None else value
