"""What the service reports about itself: Prometheus metrics and the health document.

The collector reads a :class:`ServiceStats` snapshot when Prometheus scrapes (prometheus_client's
custom-collector interface), so the hot paths only bump plain integers. Names follow the
Prometheus conventions: ``cdc_`` prefix, base units (seconds, bytes), ``_total`` counters.
``protocol.md`` is about the CDC protocol; the metric list lives in docs/monitoring.md.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

import cdcserver
from cdcserver.ops.lag import Lag
from cdcserver.protocol.server import ListenerStats
from cdcserver.reread.repairstats import RepairStats
from cdcserver.sinks.base import SinkStatus
from cdcserver.store import transcoder
from cdcserver.store.store import StoreStats
from mariadb_cdc_client.format.names import table_ref

_NAN = float("nan")


@dataclass(frozen=True)
class ReplicationStats:
    """What replication is doing, for /metrics and /health."""

    started: bool  # the start position is resolved and a replicator runs
    connected: bool
    reconnects: int
    paused: str  # why replication is paused (a full disk), "" while it runs
    transactions: int  # applied by every sink
    queue_bytes: int
    queue_capacity: int
    repair_pending: bool
    stopped: str = ""  # why replication stopped for good (a purged binlog), "" otherwise
    source: str = ""  # the server being read
    sources: int = 1  # servers it may read
    source_switches: int = 0  # times it moved to another
    refused: list[str] = field(default_factory=list)  # servers it could not take, and why
    halted: bool = False  # the service is stopping
    failure: str = ""  # why replication failed (the service then stops), "" otherwise
    xa_prepared: int = 0  # XA transactions prepared on the source, their commit not seen yet
    xa_oldest_seconds: float = 0.0  # since the oldest of them was prepared
    xa_lost: list[str] = field(default_factory=list)  # commits of XA prepared before the start
    # what holds the checkpoint back while repair_pending: stage, tables, cause of each
    repairs_waiting: list[dict[str, Any]] = field(default_factory=list)
    # seconds replication waited on each stage: "repairs", and each sink's apply by its name
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HousekeepingStats:
    cleaner_runs: int
    cleaner_deleted: int
    dump_runs: int
    dump_running: bool
    dumps: list[Any] = field(default_factory=list)  # TableProgress: queued, running, failed


@dataclass(frozen=True)
class ServiceStats:
    """Everything /metrics and /health show, read at once."""

    replication: ReplicationStats
    applied: str  # the GTID state every sink has applied
    lag: Lag | None  # None without a lag probe
    repairs: RepairStats
    store: StoreStats
    listener: ListenerStats
    housekeeping: HousekeepingStats
    sinks: list[SinkStatus] = field(default_factory=list)

    @property
    def sinks_waiting(self) -> list[str]:
        """Why each sink that cannot deliver yet waits."""
        return [sink.waiting for sink in self.sinks if sink.waiting]

    @property
    def kafka_snapshot(self) -> tuple[dict[str, Any], ...]:
        """The Kafka sink's initial snapshot, a table each (empty: none taken)."""
        return next((sink.snapshot for sink in self.sinks if sink.name == "kafka"), ())

    @property
    def kafka_role(self) -> str:
        """With ``[kafka] publisher_lock``: publisher or standby ("" without)."""
        return next((sink.role for sink in self.sinks if sink.name == "kafka"), "")


def service_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry of the service's own: ``collectors``, ``cdc_build_info``, and what
    prometheus_client's default registry has about the process (``process_*``: CPU, memory,
    open files; ``python_info``; ``python_gc_*``)."""
    registry = CollectorRegistry()
    for collector in (*collectors, BuildInfo()):
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class BuildInfo(Collector):
    """``cdc_build_info``: 1, with what is running as labels."""

    def collect(self) -> Iterator[Any]:
        info = GaugeMetricFamily(
            "cdc_build_info", "the running service: its version, the Python version, and "
            "whether the compiled extensions are in use", labels=["version", "python",
                                                                  "compiled"])
        info.add_metric([cdcserver.__version__, platform.python_version(),
                         "yes" if transcoder.available() else "no"], 1)
        yield info


class DiskSpace(Collector):
    """The file system holding the data directory: replication pauses when it is full."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir

    def collect(self) -> Iterator[Any]:
        try:
            fs = os.statvfs(self.data_dir)
        except OSError:  # gone or unreadable: no figure rather than a wrong one
            return
        yield _gauge("cdc_data_filesystem_free_bytes", "bytes the service may still write on "
                     "the file system of the data directory", fs.f_bavail * fs.f_frsize)
        yield _gauge("cdc_data_filesystem_size_bytes", "the size of the file system of the "
                     "data directory", fs.f_blocks * fs.f_frsize)


class ServiceCollector(Collector):
    def __init__(self, stats: Callable[[], ServiceStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self.stats()
        yield from _replication(stats.replication, stats.lag)
        yield from _repairs(stats.repairs, stats.replication.repair_pending)
        yield from _store(stats.store)
        yield from _listener(stats.listener)
        yield from _housekeeping(stats.housekeeping)
        if stats.kafka_role:
            yield _gauge("cdc_kafka_publisher", "1 while this instance holds the Kafka "
                         "publisher lock (publisher_lock), 0 while it stands by",
                         1 if stats.kafka_role == "publisher" else 0)
        yield _gauge("cdc_sinks_waiting", "sinks that cannot deliver yet (a Kafka broker that "
                     "does not answer: /health says which)", len(stats.sinks_waiting))
        for sink in stats.sinks:
            for metric in sink.metrics:
                family = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
                yield family(metric.name, metric.documentation, value=metric.value)


def _replication(r: ReplicationStats, lag: Lag | None) -> Iterator[Any]:
    yield _gauge("cdc_replication_connected", "1 while the replication connection is up",
                 1 if r.connected else 0)
    yield _counter("cdc_replication_reconnects", "replication connections re-established",
                   r.reconnects)
    yield _gauge("cdc_replication_stopped", "1 once replication stopped for good (the binlog "
                 "it needs was purged: see /health)", 1 if r.stopped else 0)
    yield _counter("cdc_source_switches", "times replication moved to another source",
                   r.source_switches)
    yield _gauge("cdc_sources_refused", "sources that cannot continue the stream, as last "
                 "examined (while the one being read is lost)", len(r.refused))
    yield _gauge("cdc_replication_paused", "1 while replication waits for room in the "
                 "data directory, or for its failed disk to work again", 1 if r.paused else 0)
    yield _gauge("cdc_replication_lag_seconds", "age of the newest applied commit while "
                 "the source has transactions not applied yet (0 when caught up)",
                 _nan_if_none(lag.seconds if lag else None))
    yield _gauge("cdc_replication_lag_transactions", "transactions the source has logged "
                 "that are not applied yet", _nan_if_none(lag.transactions if lag else None))
    yield _counter("cdc_transactions", "transactions applied by every sink",
                   r.transactions)
    yield _gauge("cdc_xa_prepared", "XA transactions prepared on the source whose XA COMMIT "
                 "or ROLLBACK has not been read yet (their rows are kept until then)",
                 r.xa_prepared)
    yield _gauge("cdc_xa_oldest_prepared_seconds", "age of the oldest of them (0 if none)",
                 r.xa_oldest_seconds)
    stages = CounterMetricFamily(
        "cdc_pipeline_seconds", "seconds replication spent waiting on each stage: repairs "
        "(rows re-read from the source), and each sink applying the changes (where a "
        "backlog's time goes)", labels=["stage"])
    for stage, seconds in sorted(r.stage_seconds.items()):
        stages.add_metric([stage], seconds)
    yield stages
    yield _gauge("cdc_queue_bytes", "binlog bytes handed over by the replicator and not "
                 "applied yet", r.queue_bytes)
    yield _gauge("cdc_queue_capacity_bytes", "the most binlog bytes held in flight",
                 r.queue_capacity)


def _repairs(stats: RepairStats, pending: bool) -> Iterator[Any]:
    rowless = CounterMetricFamily(
        "cdc_rowless_changes", "changes made without row events that replication "
        "recognised (a foreign key's cascade, a statement that rewrote stored rows, or a "
        "session's own setting: statement logging, a savepoint rollback over MyISAM)",
        labels=["cause"])
    for cause in ("foreign key", "statement", "session"):
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
                 "watermark (no checkpoint is written meanwhile)", 1 if pending else 0)
    yield _counter("cdc_repairs_widened", "repairs that read the whole table instead of the "
                   "rows named, because the source's columns were no longer the stream's",
                   stats.widened)
    yield _counter("cdc_resyncs", "quarantined tables resynced (read again at a watermark "
                   "and released)", len(stats.resyncs))
    yield _counter("cdc_resync_seconds", "seconds the resyncs took, from asked to released",
                   sum(stats.resyncs))


def _store(store: StoreStats) -> Iterator[Any]:
    yield _counter("cdc_rows_in", "records written to the Avro files (an UPDATE is two)",
                   store.records_written)
    yield _gauge("cdc_tables_quarantined", "tables whose stream stopped until a resync",
                 len(store.quarantined))
    stopped = GaugeMetricFamily("cdc_table_quarantined", "1 for each quarantined table",
                                labels=["database", "table"])
    for entry in store.quarantined:
        stopped.add_metric([str(entry["database"]), str(entry["table"])], 1)
    yield stopped
    yield _gauge("cdc_checkpoint_age_seconds", "how long the newest applied transaction "
                 "has waited for a checkpoint (0: everything applied is durable)",
                 store.checkpoint_age)
    versions = GaugeMetricFamily("cdc_table_version", "the newest version of each table",
                                 labels=["database", "table"])
    for name, version in sorted(store.versions.items()):
        versions.add_metric([name.database, name.table], version)
    yield versions


def _listener(listener: ListenerStats) -> Iterator[Any]:
    yield _gauge("cdc_clients_connected", "CDC protocol connections open",
                 listener.clients)
    yield _counter("cdc_connections", "CDC protocol connections accepted",
                   listener.connections)
    yield _counter("cdc_rows_out", "records sent to clients in JSON mode",
                   listener.records_sent)
    yield _counter("cdc_sent_bytes", "bytes sent to clients (streams and dumps)",
                   listener.bytes_sent)
    yield _counter("cdc_login_failures", "failed authentications",
                   listener.login_failures)
    yield _counter("cdc_logins_delayed", "logins that waited for their turn (too many new "
                   "passwords tried for the user from the address)", listener.logins_delayed)
    yield _counter("cdc_logins_throttled", "logins refused unchecked (ERR THROTTLED)",
                   listener.logins_throttled)
    yield _counter("cdc_connections_refused", "CDC protocol connections refused when they "
                   "arrived (ERR TOO-MANY-CONNECTIONS)", listener.connections_refused)
    yield _counter("cdc_dumps_sent", "dump files sent to clients", listener.dumps_sent)


def _housekeeping(h: HousekeepingStats) -> Iterator[Any]:
    yield _counter("cdc_cleaner_runs", "retention cleaner passes", h.cleaner_runs)
    yield _counter("cdc_cleaner_deleted_files", "files the retention cleaner deleted",
                   h.cleaner_deleted)
    yield _counter("cdc_dump_runs", "dump passes finished (scheduled or requested)",
                   h.dump_runs)
    yield _gauge("cdc_dump_running", "1 while a dump is being taken", 1 if h.dump_running else 0)
    running = [d for d in h.dumps if d.state == "running"]
    yield _gauge("cdc_dump_rows", "rows written by the dumps being taken",
                 sum(d.rows for d in running))
    yield _gauge("cdc_dump_rows_estimated", "rows the source estimates the tables being "
                 "dumped hold", sum(d.estimated_rows for d in running))
    yield _gauge("cdc_dumps_queued", "tables waiting for their dump",
                 sum(1 for d in h.dumps if d.state == "queued"))
    yield _gauge("cdc_dumps_failed", "requested dumps that failed in the last 10 minutes",
                 sum(1 for d in h.dumps if d.state == "failed"))


def health(stats: ServiceStats, max_lag: float) -> tuple[bool, dict[str, Any]]:
    """(healthy, document) for ``/health``: healthy while replication is connected and the
    lag is known and at most ``max_lag`` seconds."""
    replication, lag = stats.replication, stats.lag
    problems = []
    if replication.stopped:
        problems.append(replication.stopped)
    elif replication.paused:
        problems.append(replication.paused)
    elif not replication.started:
        problems.append("replication has not started (checking the source, or waiting for it)")
    elif not replication.connected and replication.refused and len(replication.refused) >= \
            replication.sources:
        problems.append("no source can continue the stream: " + "; ".join(replication.refused))
    elif not replication.connected:
        problems.append("the replication connection is down (reconnecting)")
    problems.extend(stats.sinks_waiting)
    problems.extend(replication.xa_lost)
    problems += [f"{table_ref(str(q['database']), str(q['table']))} is quarantined since "
                 f"transaction {q['since']}: {q['cause']} (the service resyncs it once it can; "
                 "`cdcserver resync` asks at once)" for q in stats.store.quarantined]
    if lag is not None and lag.error:
        problems.append(f"the source did not answer the lag probe: {lag.error}")
    if lag is not None and lag.seconds is not None and lag.seconds > max_lag:
        problems.append(f"replication lag {lag.seconds:.0f}s exceeds {max_lag:.0f}s")
    document = {
        "status": "degraded" if problems else "ok",
        "problems": problems,
        "replication": {
            "connected": replication.connected,
            "applied": stats.applied,
            "repair_pending": replication.repair_pending,
            "repairs_waiting": replication.repairs_waiting,
            "xa_prepared": replication.xa_prepared,
            "xa_oldest_prepared_seconds": round(replication.xa_oldest_seconds, 3),
            "lag_seconds": lag.seconds if lag else None,
            "lag_transactions": lag.transactions if lag else None,
            "lag_measured_at": lag.measured_at if lag and lag.measured_at else None,
        },
        **({"kafka": {"role": stats.kafka_role}} if stats.kafka_role else {}),
        **({"kafka_snapshot": list(snapshot)} if (snapshot := stats.kafka_snapshot) else {}),
        "source": {"current": replication.source, "sources": replication.sources,
                   "switches": replication.source_switches, "refused": replication.refused},
        "quarantined": stats.store.quarantined,
        "repairs": stats.repairs.recent,
        "checkpoint_age_seconds": stats.store.checkpoint_age,
        "tables": stats.store.tables,
        "clients": stats.listener.clients,
        "records_sent": stats.listener.records_sent,
        "bytes_sent": stats.listener.bytes_sent,
        "time": time.time(),
    }
    return not problems, document


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _nan_if_none(value: float | None) -> float:
    return _NAN if value is None else value
