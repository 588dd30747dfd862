"""The service: the store, the replicator and pipeline, and the listener, in one process.

Start order: check the users file, open the store (which repairs it back to its checkpoint),
start the listener (it serves what is stored even while the source is unreachable), then
replicate; what cannot be used stops the start in one line (:mod:`cdcserver.app.startup`). Stop
order: stop accepting connections, stop the replicator, let the pipeline finish what was handed
over and flush (the final checkpoint), then close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import zoneinfo
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from cdcserver.app import descriptors
from cdcserver.app.resyncs import ResyncScheduler
from cdcserver.app.runner import ReplicationRunner
from cdcserver.app.startup import cannot_listen, check_users_file, unusable_data_dir
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.config import Config
from cdcserver.core.durable import private_files
from cdcserver.core.errors import CdcError, ConfigError
from cdcserver.core.gtid import GtidState
from cdcserver.dump.included import NewlyIncluded
from cdcserver.dump.retention import Cleaner
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.ops.lag import LagProbe
from cdcserver.ops.latency import CommitLatency
from cdcserver.ops.metrics import (
    DiskSpace,
    HousekeepingStats,
    ServiceCollector,
    ServiceStats,
    health,
    service_registry,
)
from cdcserver.ops.monitoring import MonitoringServer
from cdcserver.ops.probes import live, ready
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.scram import login_secret
from cdcserver.protocol.server import CdcServer, ListenerStats
from cdcserver.protocol.throttle import LoginThrottle
from cdcserver.protocol.users import UsersFile
from cdcserver.replication.sources import Sources
from cdcserver.sinks.base import Sink
from cdcserver.sinks.kafka.publisher import kafka_sinks
from cdcserver.sinks.store import StoreSink
from cdcserver.store import transcoder
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore
from mariadb_cdc_client.format.wire import Dialect

if TYPE_CHECKING:
    from cdcserver.app.adminview import ServiceView
    from cdcserver.ops.admin import AdminServer

log = logging.getLogger(__name__)


class Service:
    def __init__(self, config: Config) -> None:
        config.check()  # a Config built in code is checked as a loaded one is
        self.budgets = descriptors.take(config)
        self.configured = config  # as given: the start logs what the budgets cut
        self.config = config = descriptors.within(config, self.budgets)
        self.layout = DataDir(config.store.data_dir)
        self.catalog = Catalog(self.layout.avro)
        self.store = AvroStore(config.store.data_dir, self.catalog, codec=config.store.codec,
                               block_size=config.store.block_size,
                               max_open_files=config.store.max_open_files)
        self.users = UsersFile(config.listener.users_file)
        self.capture = CaptureFilter.of(config.capture)
        self.sources = Sources(config.source.addresses())  # the replicator moves between them
        self.sinks: list[Sink] = [
            StoreSink(self.store),
            *kafka_sinks(config, self.sources, self.catalog.version_created_by),
        ]
        self.replication = ReplicationRunner(
            config.source, self.layout, self.catalog, self.sinks,
            flush_interval=config.store.flush_interval,
            disk_full_retry=config.store.disk_full_retry, defer_decoding=transcoder.takes,
            sources=self.sources, capture=self.capture)
        self.cleaner = Cleaner(config.retention, config.store.data_dir, self.catalog,
                               lambda: self.store.index)
        self.resyncs = ResyncScheduler(self.catalog, config.store.data_dir,
                                       self.replication.request_resync)
        self.server: CdcServer | None = None
        self.address: tuple[str, int] | None = None
        self.scheduler: DumpScheduler | None = None
        self.lag: LagProbe | None = None
        self.monitoring: MonitoringServer | None = None
        self.monitoring_address: tuple[str, int] | None = None
        self.admin: AdminServer | None = None
        self.admin_address: tuple[str, int] | None = None
        self.admin_view: ServiceView | None = None
        self._ended: asyncio.Future[None] | None = None  # when run() ends, and how

    def sink(self, name: str) -> Sink | None:
        """The sink of that name taking part in replication now (None: there is none, or it
        stands by)."""
        return next((s for s in self.sinks if s.name == name and s.active), None)

    async def run(self, stop: asyncio.Event, started: Callable[[Service], None] | None = None
                  ) -> None:
        """Serve until ``stop`` is set; raises if replication fails for good."""
        ended = self._ending()
        try:
            await self._run(stop, started)
        except BaseException as exc:
            ended.set_exception(exc if isinstance(exc, Exception) else
                                CdcError("the service was cancelled"))
            ended.exception()  # retrieved: there may be no waiter
            raise
        else:
            ended.set_result(None)

    def _ending(self) -> asyncio.Future[None]:
        """Resolved when run() ends (with its exception, if it failed)."""
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        return self._ended

    async def _run(self, stop: asyncio.Event, started: Callable[[Service], None] | None
                   ) -> None:
        check_users_file(self.config.listener.users_file)
        private_files(self.config.store.group_access)
        self._open_data_dir()
        descriptors.report(self.configured, self.budgets)
        self.users.load()  # warns, at start, about each malformed line (which it skips)
        self._open_store()
        try:
            self.server = self._listener()
            await self._start_listener(self.server)
            await self._start_monitoring()
            await self._start_admin()
            if started is not None:
                started(self)
            housekeeping = self._housekeeping()
            replication = asyncio.create_task(self.replication.run(), name="replication")
            stopping = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({replication, stopping},
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in housekeeping:
                task.cancel()
            await asyncio.gather(*housekeeping, return_exceptions=True)
            await self._shutdown(replication)
            if replication in done and not replication.cancelled():
                replication.result()
            stopping.cancel()
        finally:
            if self.server is not None:
                await self.server.stop()
            if self.monitoring is not None:
                await self.monitoring.stop()
            if self.admin is not None:
                await self.admin.stop()
            for sink in self.sinks:
                await sink.close()
            self.store.close()

    def _open_data_dir(self) -> None:
        """Create the data directory (private to the service) or stop, in one line, when it
        cannot be used."""
        try:
            os.makedirs(self.config.store.data_dir, exist_ok=True)
            self.layout.restrict(self.config.store.group_access)
        except OSError as exc:
            unusable = unusable_data_dir(self.config.store.data_dir, exc)
            if unusable is None:
                raise
            raise unusable from exc

    def _open_store(self) -> None:
        try:
            self.store.open()
        except OSError as exc:
            unusable = unusable_data_dir(self.config.store.data_dir, exc)
            if unusable is None:
                raise
            raise unusable from exc

    async def _start_listener(self, server: CdcServer) -> None:
        host, port = self.config.listener.host_port()
        try:
            self.address = await server.start(host, port,
                                              ssl=self.config.listener.tls_context())
        except OSError as exc:
            raise cannot_listen(self.config.listener.listen, exc) from exc

    async def _start_monitoring(self) -> None:
        """/metrics, /health, /live and /ready, unless metrics.listen is empty."""
        where = self.config.metrics.host_port()
        if where is None:
            return
        latency = CommitLatency()
        self.replication.on_applied = latency.applied
        if self.server is not None:
            self.server.tails.delivered = latency.delivered
        collectors: list[Collector] = [ServiceCollector(self.stats), latency,
                                       DiskSpace(self.config.store.data_dir)]
        self.monitoring = MonitoringServer(service_registry(*collectors), {
            "/health": lambda: health(self.stats(), self.config.metrics.max_lag),
            "/live": lambda: live(self.replication.stats()),
            "/ready": lambda: ready(self.stats()),
        })
        try:
            self.monitoring_address = await self.monitoring.start(*where)
        except OSError as exc:
            raise ConfigError(f"metrics.listen {self.config.metrics.listen}: {exc.strerror}; "
                              "choose another HOST:PORT (--metrics-listen) or '' to turn the "
                              "endpoint off") from exc

    async def _start_admin(self) -> None:
        """The admin API and the web console (docs/admin.md), with a token file only."""
        cfg = self.config.admin
        if not cfg.enabled:
            return
        # imported only here: aiohttp takes half a second to import, for nothing while off
        from cdcserver.app.adminview import ServiceView
        from cdcserver.ops.admin import AdminServer, TokenFile

        token = TokenFile(cfg.token_file)  # a file that cannot be used stops the start
        self.admin_view = ServiceView(self)
        self.admin = AdminServer(self.admin_view, token, {
            "/live": lambda: live(self.replication.stats()),
            "/ready": lambda: ready(self.stats()),
        })
        try:
            self.admin_address = await self.admin.start(*cfg.host_port(),
                                                        ssl=cfg.tls_context())
        except OSError as exc:
            raise ConfigError(f"admin.listen {cfg.listen}: {exc.strerror}; choose another "
                              "HOST:PORT (--admin-listen)") from exc

    def stats(self) -> ServiceStats:
        scheduler = self.scheduler
        return ServiceStats(
            replication=self.replication.stats(), applied=str(self.stored_state()),
            lag=self.lag.lag if self.lag is not None else None,
            repairs=self.replication.repair_stats, store=self.store.stats(),
            listener=self.server.stats() if self.server is not None else ListenerStats(),
            sinks=[sink.status() for sink in self.sinks],
            housekeeping=HousekeepingStats(
                self.cleaner.runs, self.cleaner.deleted,
                scheduler.runs if scheduler is not None else 0,
                scheduler is not None and scheduler.running,
                scheduler.entries() if scheduler is not None else []))

    def _housekeeping(self) -> list[asyncio.Task[None]]:
        """The cleaner, the lag probe, and the dump schedule if one is configured."""
        tasks = [asyncio.create_task(self.cleaner.run(), name="cleaner"),
                 asyncio.create_task(self.resyncs.run(), name="resyncs")]
        if self.admin_view is not None:
            tasks.append(asyncio.create_task(self.admin_view.sample(), name="admin rates"))
        if self.monitoring is not None or self.admin is not None:
            self.lag = LagProbe(self.sources, self.stored_state,
                                self.replication.last_commit,
                                self.config.metrics.lag_interval)
            tasks.append(asyncio.create_task(self.lag.run(), name="lag probe"))
        scheduler = self.scheduler
        assert scheduler is not None
        tasks.append(asyncio.create_task(scheduler.serve(), name="requested dumps"))
        included = NewlyIncluded(self.config.capture, self.sources.current,
                                 self.config.store.data_dir, scheduler)
        tasks.append(asyncio.create_task(included.run(self.replication.replicating),
                                         name="newly included tables"))
        if scheduler.enabled:
            tasks.append(asyncio.create_task(scheduler.run(), name="dump schedule"))
        return tasks

    async def wait_caught_up(self, target: GtidState) -> None:
        """Return once every sink has applied all transactions up to ``target``; raises
        if the service ended first (it failed to start, or stopped), instead of waiting
        forever."""
        waiting = asyncio.ensure_future(self._caught_up(target))
        ended = self._ending()
        finished = False
        try:
            await asyncio.wait({waiting, ended}, return_when=asyncio.FIRST_COMPLETED)
            finished = waiting.done()
        finally:
            if not waiting.done():
                waiting.cancel()
        if finished:
            waiting.result()
            return
        if ended.exception() is not None:
            raise CdcError(f"the service stopped: {ended.exception()}") from ended.exception()
        raise CdcError("the service stopped before it caught up")

    async def _caught_up(self, target: GtidState) -> None:
        await self.replication.replicating.wait()
        index = self.store.index
        assert index is not None
        await self.replication.wait_applied(
            lambda state: all(index.reached(state, g) for g in target))

    def stored_state(self) -> GtidState:
        """Every transaction applied by every sink so far (before replication starts: the
        store's checkpoint)."""
        durable = self.store.durable
        return self.replication.applied(
            lambda: durable.gtid_state if durable is not None else GtidState())

    def _listener(self) -> CdcServer:
        cfg = self.config.listener
        if self.scheduler is None:
            self.scheduler = DumpScheduler(self.config.dump, self.sources,
                                           self.config.store.data_dir, self.catalog,
                                           self.capture)
        context = SessionContext(self.catalog, self.users, lambda: self.store.index,
                                 self.config.store.data_dir, self.wait_caught_up,
                                 self.stored_state,
                                 dialect=Dialect(cfg.json_dialect),
                                 throttle=LoginThrottle(cfg.login_failures,
                                                        max_wait=cfg.login_lockout),
                                 dumps=self.scheduler, capture=self.capture,
                                 login_secret=login_secret(self.layout.login_secret))
        server = CdcServer(context, cfg,
                           zoneinfo.ZoneInfo(cfg.timestamp_zone),
                           databus_labels=self.config.kafka.databus_labels)
        server.dump_released = self.cleaner.wake
        return server

    async def _shutdown(self, replication: asyncio.Task[None]) -> None:
        if self.server is not None:
            await self.server.stop()
        if self.replication.replicator is None and not replication.done():
            # Still resolving where to start: nothing was replicated, stop right here.
            replication.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replication
        await self.replication.stop()
        if not replication.done():
            # The replicator's finish() ends the pipeline after its final flush.
            try:
                await asyncio.wait_for(asyncio.shield(replication), timeout=30)
            except TimeoutError:
                replication.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replication
        pipeline = self.replication.pipeline
        if pipeline is None or not pipeline.repair_pending:
            # (a repair not yet out: the checkpoint must stay before the change it repairs,
            # so that the next start reads the change, and repairs it, again)
            await self.store.flush()

