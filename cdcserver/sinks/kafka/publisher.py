"""The Kafka sinks a configuration asks for: none, one, or one behind the publisher lease.

With ``[kafka] publisher_lock`` several instances replicate the same source and one of them
publishes: :class:`LeasedSink` is a sink that is active only while this instance holds the
lock (:mod:`cdcserver.sinks.kafka.lease`). It opens and closes itself: when it takes the lock
it opens a Kafka sink from the position the last publisher recorded in the state topic (never
this directory's own, which may be older) and has replication start over so that the sink is
fed from there; when it loses the lock (or replication stops or pauses, so that another
instance should publish) it leaves, replication starts over without it, and it closes the
Kafka sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from cdcserver.core.changes import Change
from cdcserver.core.config import Config
from cdcserver.core.errors import ConfigError, PublisherFenced
from cdcserver.core.gtid import BinlogPosition
from cdcserver.messages.base import VersionLookup
from cdcserver.replication.sources import Sources
from cdcserver.sinks.base import ReplicationControl, Sink, SinkStatus, SourceInfo
from cdcserver.sinks.kafka.lease import PublisherLease
from cdcserver.sinks.kafka.metrics import Totals
from mariadb_cdc_client.format.extras import MissingExtra, require

if TYPE_CHECKING:
    from cdcserver.sinks.kafka.sink import KafkaSink
    from cdcserver.store.catalog import Catalog

log = logging.getLogger(__name__)


def kafka_sinks(config: Config, sources: Sources, versions: VersionLookup,
                catalog: Catalog | None = None) -> list[Sink]:
    """The Kafka sink the configuration asks for (none without ``[kafka] bootstrap``); a
    missing ``kafka`` extra is a configuration error, said in one line. ``catalog``: the
    tables' versions, for the dumps of an initial snapshot."""
    if not config.kafka.enabled:
        return []
    try:
        require("kafka", "kafka.bootstrap (publishing to Kafka)")
    except MissingExtra as exc:
        raise ConfigError(str(exc)) from exc
    from cdcserver.sinks.kafka.sink import KafkaSink

    kafka = config.kafka
    # instances that take turns publishing share one position in the state topic
    key = f"{kafka.client_id}:{kafka.publisher_lock or config.source.server_id}"
    if kafka.exactly_once and kafka.transactional_id:
        key = kafka.transactional_id  # instances sharing it share (and fence for) the stream

    snapshot = None
    if kafka.snapshot == "initial":
        from cdcserver.core.capture import CaptureFilter, TableSelection
        from cdcserver.sinks.kafka.snapshot import Sources as SnapshotSources

        snapshot = SnapshotSources(lambda: sources.current, config.store.data_dir,
                                   config.dump, catalog, CaptureFilter.of(config.capture),
                                   TableSelection.parse(kafka.include, kafka.exclude, "kafka"))

    def sink() -> KafkaSink:
        return KafkaSink(kafka, config.store.data_dir, key, versions=versions,
                         snapshot=snapshot)

    if kafka.publisher_lock:
        return [LeasedSink(PublisherLease(sources, kafka.publisher_lock), sink,
                           kafka.max_buffer_bytes)]
    return [sink()]


class LeasedSink:
    """A Kafka sink that takes part in replication only while this instance publishes."""

    name = "kafka"

    def __init__(self, lease: PublisherLease, make: Callable[[], KafkaSink],
                 capacity: int) -> None:
        self.lease = lease
        self.make = make
        self.capacity = capacity  # max_buffer_bytes, for its gauge
        self.after: tuple[str, ...] = ("avro",)  # as the Kafka sink it makes
        self._sink: KafkaSink | None = None  # while publishing
        self._joined = False  # replication feeds the sink
        self._source: SourceInfo | None = None
        self._task: asyncio.Task[None] | None = None
        self._totals = Totals()
        self._fenced = ""  # why the sink publishing now cannot (exactly-once: fenced out)

    # -- the lease ---------------------------------------------------------------------

    async def open(self, source: SourceInfo) -> None:
        """Start competing for the lock (once: replication opens its sinks at each start)."""
        self._source = source
        if self._task is None:
            self._task = asyncio.create_task(
                self.lease.run(self._publish, self._stand_by, self._feeding),
                name="kafka publisher lease")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._leave(restart=False)  # replication stops: nothing to start over

    @property
    def _control(self) -> ReplicationControl | None:
        return self._source.control if self._source is not None else None

    def _feeding(self) -> bool:
        control = self._control
        return control is None or control.feeding()

    async def _publish(self) -> None:
        """This instance holds the lock: a Kafka sink from the position the last publisher
        recorded in the state topic, and replication feeds it from there."""
        assert self._source is not None
        sink = self.make()
        sink.durable = None
        await sink.open(self._source)
        sink.by_gtid_only()  # recorded by another instance, maybe on another server
        self._sink, self._joined, self._fenced = sink, True, ""
        await self._restart()

    async def _stand_by(self) -> None:
        await self._leave(restart=True)

    async def _leave(self, restart: bool) -> None:
        sink, self._sink = self._sink, None
        if sink is None:
            return
        if self._joined:
            self._joined = False
            if restart:
                await self._restart()
        await sink.close()
        self._totals.retire(sink.stats)

    async def _restart(self) -> None:
        control = self._control
        if control is not None:
            await control.restart()

    # -- the Sink interface: the Kafka sink's while publishing -------------------------

    @property
    def active(self) -> bool:
        return self._joined

    @property
    def durable(self) -> BinlogPosition | None:
        return self._sink.durable if self._sink is not None else None

    @property
    def applied(self) -> BinlogPosition | None:
        return self._sink.applied if self._sink is not None else None

    def starting_at(self, position: BinlogPosition) -> None:
        if self._sink is not None:
            self._sink.starting_at(position)

    async def apply(self, changes: list[Change]) -> None:
        if self._sink is not None:
            with self._fenced_out():
                await self._sink.apply(changes)

    async def flush(self) -> BinlogPosition | None:
        if self._sink is None:
            return None
        with self._fenced_out():
            return await self._sink.flush()
        return self._sink.durable

    @contextlib.contextmanager
    def _fenced_out(self) -> Iterator[None]:
        """Exactly-once: a newer publisher fenced this one's producer, which happens when it
        took the lock this instance is about to find lost (its poll runs every second): this
        instance publishes nothing more and stands by when the lease says so, instead of
        stopping replication as a lone instance would."""
        try:
            yield
        except PublisherFenced as exc:
            if not self._fenced:
                log.warning("kafka: %s; standing by", exc)
            self._fenced = str(exc)

    async def keep_up(self, unrepaired: Callable[[], frozenset[str] | None]) -> None:
        if self._sink is not None:
            with self._fenced_out():
                await self._sink.keep_up(unrepaired)

    @property
    def unrepaired(self) -> frozenset[str] | None:
        return self._sink.unrepaired if self._sink is not None else None

    @property
    def unrepaired_at(self) -> BinlogPosition | None:
        return self._sink.unrepaired_at if self._sink is not None else None

    def status(self) -> SinkStatus:
        sink = self._sink
        return SinkStatus(self.name, role="publisher" if self.lease.held else "standby",
                          waiting=self._fenced or (sink.waiting if sink is not None
                                                   else ""),
                          metrics=self._totals.figures(sink, self.capacity))
