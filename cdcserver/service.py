"""The service: the store, the replicator and pipeline, and the listener, in one process.

Start order: open the store (which repairs it back to its checkpoint), start the listener (it
serves what is stored even while the source is unreachable), then replicate. Stop order: stop
accepting connections, stop the replicator, let the pipeline finish what was handed over and
flush (the final checkpoint), then close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import zoneinfo
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from prometheus_client.registry import CollectorRegistry

from cdcserver import preflight
from cdcserver.changes import Abort
from cdcserver.config import Config
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.errors import ConfigError, DiskFull, SourceError, SourceUnavailable
from cdcserver.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.handoff import Handoff
from cdcserver.lag import LagProbe
from cdcserver.metrics import ServiceCollector, health
from cdcserver.monitoring import MonitoringServer
from cdcserver.pipeline import Pipeline, Sink, start_position
from cdcserver.protocol.server import CdcServer, ListenerLimits
from cdcserver.protocol.session import SessionContext
from cdcserver.protocol.throttle import LoginThrottle
from cdcserver.replication import source
from cdcserver.replication.connection import SourceAddress
from cdcserver.replication.replicator import Backoff, Replicator
from cdcserver.reread.repair import Repairer, RepairStats
from cdcserver.reread.view import Views
from cdcserver.retention import Cleaner
from cdcserver.schema.history import SchemaHistory
from cdcserver.store import transcoder
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import TableName
from cdcserver.store.store import DISK_FULL_ERRNOS, AvroStore
from cdcserver.users import UsersFile

if TYPE_CHECKING:
    from cdcserver.kafka.sink import KafkaSink

log = logging.getLogger(__name__)
T = TypeVar("T")


class Service:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.layout = DataDir(config.store.data_dir)
        self.catalog = Catalog(self.layout.avro)
        self.store = AvroStore(config.store.data_dir, self.catalog, codec=config.store.codec,
                               block_size=config.store.block_size)
        self.users = UsersFile(config.listener.users_file)
        self.server: CdcServer | None = None
        self.replicator: Replicator | None = None
        self.pipeline: Pipeline | None = None
        self.address: tuple[str, int] | None = None
        self.sinks: list[Sink] = [self.store]
        self.kafka: KafkaSink | None = None
        if config.kafka.enabled:
            try:
                from cdcserver.kafka.sink import KafkaSink
            except ImportError as exc:
                raise ConfigError(f"kafka.bootstrap is set but {exc.name} is not installed: "
                                  "pip install 'mariadb-cdc[kafka]'") from exc

            self.kafka = KafkaSink(config.kafka, config.store.data_dir,
                                   f"{config.kafka.client_id}:{config.source.server_id}")
            self.kafka.format.version_of = self._version_created_by
            self.sinks.append(self.kafka)
        self.replicating = asyncio.Event()  # set once the replicator is started
        self.cleaner = Cleaner(config.retention, config.store.data_dir, self.catalog,
                               lambda: self.store.index)
        self.scheduler: DumpScheduler | None = None
        self.paused = ""  # why replication is paused (a full disk), "" while it runs
        self.repair_stats = RepairStats()  # changes without binlog rows, and their repairs
        self._replaced: asyncio.Future[None] | None = None
        self.handoff: Handoff | None = None
        self.lag: LagProbe | None = None
        self.monitoring: MonitoringServer | None = None
        self.monitoring_address: tuple[str, int] | None = None

    async def run(self, stop: asyncio.Event, started: Callable[[Service], None] | None = None
                  ) -> None:
        """Serve until ``stop`` is set; raises if replication fails for good."""
        self.users.load()  # a malformed users file is a start-up error, not a login failure
        self.store.open()
        try:
            self.server = self._listener()
            host, port = self.config.listener.host_port()
            self.address = await self.server.start(
                host, port, ssl=self.config.listener.tls_context())
            await self._start_monitoring()
            if started is not None:
                started(self)
            housekeeping = self._housekeeping()
            replication = asyncio.create_task(self._replicate(), name="replication")
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
            if self.kafka is not None:
                await self.kafka.close()
            self.store.close()

    async def _start_monitoring(self) -> None:
        """/metrics and /health, unless metrics.listen is empty."""
        where = self.config.metrics.host_port()
        if where is None:
            return
        registry = CollectorRegistry()
        registry.register(ServiceCollector(self))
        self.monitoring = MonitoringServer(
            registry, lambda: health(self, self.config.metrics.max_lag))
        try:
            self.monitoring_address = await self.monitoring.start(*where)
        except OSError as exc:
            raise ConfigError(f"metrics.listen {self.config.metrics.listen}: {exc.strerror}; "
                              "choose another HOST:PORT (--metrics-listen) or '' to turn the "
                              "endpoint off") from exc

    def _last_commit(self) -> float | None:
        return self.pipeline.last_commit_timestamp if self.pipeline is not None else None

    def _housekeeping(self) -> list[asyncio.Task[None]]:
        """The cleaner, the lag probe, and the dump schedule if one is configured."""
        tasks = [asyncio.create_task(self.cleaner.run(), name="cleaner")]
        if self.monitoring is not None:
            self.lag = LagProbe(self.config.source.address(), self.stored_state,
                                self._last_commit, self.config.metrics.lag_interval)
            tasks.append(asyncio.create_task(self.lag.run(), name="lag probe"))
        if self.config.dump.tables and self.config.dump.interval > 0:
            self.scheduler = DumpScheduler(self.config.dump, self.config.source.address(),
                                           self.config.store.data_dir, self.catalog)
            tasks.append(asyncio.create_task(self.scheduler.run(), name="dump schedule"))
        return tasks

    async def wait_caught_up(self, target: GtidState) -> None:
        """Return once every sink has applied all transactions up to ``target``."""
        await self.replicating.wait()
        assert self.pipeline is not None and self.store.index is not None
        index = self.store.index
        while not all(index.reached(self.pipeline.state, g) for g in target):
            # Shared with other waiters (shielded); a new pipeline (after a pause) has its
            # own progress, so a replacement wakes the waiters too.
            progress = asyncio.shield(self.pipeline.progress())
            replaced = asyncio.shield(self._pipeline_replaced())
            await asyncio.wait({progress, replaced}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (progress, replaced):
                waiter.cancel()

    def _pipeline_replaced(self) -> asyncio.Future[None]:
        if self._replaced is None or self._replaced.done():
            self._replaced = asyncio.get_running_loop().create_future()
        return self._replaced

    def _version_created_by(self, database: str, table: str, gtid: str) -> int | None:
        """The store's version of a table current right after the transaction ``gtid``: the
        newest whose schema was created at or before it (the store applies a batch before
        the Kafka sink, and keeps versions across restarts, so a replay finds the same)."""
        entry = self.catalog.get(TableName(database, table))
        if entry is None or not entry.versions:
            return None
        target = Gtid.parse(gtid)

        def at_or_before(created: str) -> bool:
            try:
                g = Gtid.parse(created)
            except ValueError:
                return True  # a version without a GTID (from a dump): the oldest kind
            return g.key != target.key or g.sequence <= target.sequence

        versions = [v for v, info in entry.versions.items() if at_or_before(info.schema.gtid)]
        return max(versions) if versions else None

    def stored_state(self) -> GtidState:
        """Every transaction applied by every sink so far (before replication starts: the
        store's checkpoint)."""
        if self.pipeline is not None:
            return self.pipeline.state
        durable = self.store.durable
        return durable.gtid_state if durable is not None else GtidState()

    def _listener(self) -> CdcServer:
        cfg = self.config.listener
        try:
            zone = zoneinfo.ZoneInfo(cfg.timestamp_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"listener.timestamp_zone: unknown zone {cfg.timestamp_zone!r}"
                              ) from exc
        limits = ListenerLimits(cfg.max_line, cfg.auth_timeout, cfg.idle_timeout,
                                cfg.max_connections, cfg.bad_command_limit)
        context = SessionContext(self.catalog, self.users, lambda: self.store.index,
                                 cfg.bad_command_limit, self.config.store.data_dir,
                                 self.wait_caught_up, self.stored_state,
                                 throttle=LoginThrottle(cfg.login_failures,
                                                        lockout=cfg.login_lockout))
        server = CdcServer(context, limits, zone)
        server.dump_released = self.cleaner.wake
        return server

    async def _replicate(self) -> None:
        cfg = self.config.source
        address = cfg.address()
        default, mariadb = await self._retrying(
            lambda: self._check_source_and_resolve_start(address))
        if self.kafka is not None:
            self.kafka.set_flavor(mariadb)
            await self.kafka.open()  # waits for the broker; the listener serves meanwhile
        while True:
            try:
                await self._replicate_from(address, default, mariadb)
                return
            except (DiskFull, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in DISK_FULL_ERRNOS:
                    raise
                await self._pause_until_room(exc)

    async def _pause_until_room(self, cause: Exception) -> None:
        """The data directory is full: every sink has dropped its open transaction; wait
        until a write fits again, then replication starts over from what they applied. The
        listener serves meanwhile (from the committed data, which nothing touched)."""
        self.paused = f"replication paused: {cause}"
        log.error("%s; resuming when %s has room again", self.paused,
                  self.config.store.data_dir)
        for sink in self.sinks[1:]:  # the store undid its own already
            with contextlib.suppress(Exception):
                await sink.apply([Abort("the data directory is full")])
        probe = self.layout.room_probe
        while True:
            await _poll(lambda: _room_for(probe, ROOM_NEEDED), self.config.store.disk_full_retry)
            try:
                # Checkpoints must cover everything applied: replication restarts from them,
                # and nothing may be applied twice.
                for sink in self.sinks:
                    await sink.flush()
                break
            except DiskFull:
                continue
        log.warning("the data directory has room again: resuming replication")
        self.paused = ""

    async def _replicate_from(self, address: SourceAddress, default: BinlogPosition,
                              mariadb: bool) -> None:
        """Replicate from where every sink stands (``default`` for a new store) until the
        stream ends or fails."""
        cfg = self.config.source
        position = start_position(self.sinks, default)
        self.store.set_origin(position)
        start = position.gtid_state
        history = SchemaHistory(self.layout.schema_history)
        await asyncio.to_thread(history.load, start)
        loop = asyncio.get_running_loop()
        handoff = self.handoff = Handoff(loop)
        self.replicator = Replicator(address, cfg.server_id, handoff, start,
                                     heartbeat=cfg.heartbeat, backoff=Backoff(),
                                     report_host=cfg.report_host, history=history,
                                     mariadb=mariadb, file=position.file, pos=position.pos,
                                     defer_decoding=transcoder.takes)
        views = Views(self.layout.views)
        repairer = Repairer(address, self.catalog, views, self.repair_stats)
        if self.pipeline is not None and self.pipeline.repairer is not None:
            repairer.take_over(self.pipeline.repairer.carry_over())  # after a pause
        self.pipeline = Pipeline(handoff, self.sinks, start, self.config.store.flush_interval,
                                 repairer)
        if self._replaced is not None and not self._replaced.done():
            self._replaced.set_result(None)
        self.replicator.start()
        self.replicating.set()
        try:
            await self.pipeline.run()
        finally:
            handoff.close()
            await asyncio.to_thread(self.replicator.stop)
            views.close()

    def _check_source_and_resolve_start(self, address: SourceAddress
                                        ) -> tuple[BinlogPosition, bool]:
        """Where to start without a checkpoint, and whether the source is MariaDB."""
        conn = source.connect(address)
        try:
            report = preflight.check_connection(conn, address.describe(),
                                                self.config.source.server_id)
            if report.fatal:
                raise SourceError(report.refusal() + "\n(`cdcserver check` prints every "
                                  "finding)")
            for finding in report.warnings:
                log.warning("preflight: %s", finding.text())
            info = report.info
            assert info is not None
            mariadb = info.flavor == "mariadb"
            wanted = self.config.source.start_gtid.strip()
            if wanted == "oldest":
                return source.oldest_position(conn, info), mariadb
            if wanted == "newest":
                return source.newest_position(conn, info), mariadb
            try:
                return BinlogPosition(GtidState.parse(wanted), "", 4), mariadb
            except ValueError as exc:
                raise ConfigError(f"source.start_gtid: {exc}") from exc
        finally:
            conn.close()

    async def _retrying(self, action: Callable[[], T]) -> T:
        """Run ``action`` in a thread until the source answers (the listener keeps serving)."""
        delays = Backoff().delays()
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(action)
            except SourceUnavailable as exc:
                delay = delays[min(attempt, len(delays) - 1)]
                attempt += 1
                log.warning("%s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _shutdown(self, replication: asyncio.Task[None]) -> None:
        if self.server is not None:
            await self.server.stop()
        if self.replicator is None and not replication.done():
            # Still resolving where to start: nothing was replicated, stop right here.
            replication.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replication
        if self.replicator is not None:
            await asyncio.to_thread(self.replicator.stop)
        if not replication.done():
            # The replicator's finish() ends the pipeline after its final flush.
            try:
                await asyncio.wait_for(asyncio.shield(replication), timeout=30)
            except TimeoutError:
                replication.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replication
        await self.store.flush()


async def _poll(check: Callable[[], bool], every: float) -> None:
    """Until ``check`` (run in a thread) holds: the file system sends no event for "space
    was freed", so polling is the only way to learn it."""
    while True:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(every)


ROOM_NEEDED = 16 << 20  # bytes a probe write must fit before replication resumes


def _room_for(probe: str, size: int) -> bool:
    """Whether ``size`` bytes can be written beside the data (then removed again)."""
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, size)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
