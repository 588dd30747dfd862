"""The Kafka sink: every committed change published, at least once, in order per row.

:class:`KafkaSink` is the :class:`~cdcserver.sinks.base.Sink` the pipeline sees, a thin
class over the parts aiokafka's producer is split into, and the checkpoint:

- :mod:`~cdcserver.sinks.kafka.routing` makes each change into messages and routes each to
  its topic and partition, with its headers (:mod:`~cdcserver.sinks.kafka.topics` creates a
  topic the first time one is routed to);
- :mod:`~cdcserver.sinks.kafka.sender` holds every message in flight until the broker
  acknowledges it, waits when ``max_buffer_bytes`` are in flight, and starts a new producer
  and sends everything unacknowledged again when a delivery fails;
- :mod:`~cdcserver.sinks.kafka.accumulator` packs the messages into one record batch per
  partition and hands the batches to the producer;
- :mod:`~cdcserver.sinks.kafka.checkpoint` knows which transactions are acknowledged, and
  keeps the last one's position in ``state/kafka.json`` and ``state_topic``;
- with ``delivery = "exactly-once"``, :mod:`~cdcserver.sinks.kafka.transactional`'s sender
  publishes in Kafka transactions, each committed with the position it reaches, and rewinds
  to the last commit after a failure instead of sending again;
- with ``snapshot = "initial"`` and no position, :mod:`~cdcserver.sinks.kafka.snapshot`
  publishes every table's rows first, while the sink stays out of replication, and the sink
  then joins it at the earliest dump's point.

``apply`` routes the changes and ships every open batch; ``flush`` waits for the
acknowledgements and moves the checkpoint to the last transaction whose messages, and all
before them, are acknowledged. After a crash replication resumes from there: nothing is
lost, and what is sent again has the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka.errors import KafkaError

from cdcserver.core.changes import Change
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.retry import Backoff
from cdcserver.messages.base import VersionLookup
from cdcserver.sinks.base import SinkStatus, SourceInfo
from cdcserver.sinks.kafka.accumulator import MessageAccumulator
from cdcserver.sinks.kafka.checkpoint import Checkpoint
from cdcserver.sinks.kafka.metrics import SinkStats, Totals
from cdcserver.sinks.kafka.routing import Router
from cdcserver.sinks.kafka.sender import Sender
from cdcserver.sinks.kafka.snapshot import InitialSnapshot, PointFilter, SnapshotState
from cdcserver.sinks.kafka.snapshot import Sources as SnapshotSources
from cdcserver.sinks.kafka.transactional import TransactionalSender
from cdcserver.store.layout import DataDir

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaSink:
    name = "kafka"

    def __init__(self, config: KafkaConfig, data_dir: str, state_key: str,
                 versions: VersionLookup | None = None,
                 snapshot: SnapshotSources | None = None) -> None:
        """``versions`` numbers the table versions in messages as the Avro store created
        them; the store then applies each batch first. ``snapshot``: what an initial
        snapshot reads (``snapshot = "initial"``)."""
        self.config = config
        self.snapshot_sources = snapshot
        self.snapshot_state = SnapshotState(DataDir(data_dir).kafka_snapshot)
        self.points: PointFilter | None = None  # drops what the snapshot's rows hold
        self._snapshotting: asyncio.Task[None] | None = None  # out of replication meanwhile
        self.snapshot_failed = ""
        self.after: tuple[str, ...] = ("avro",) if versions is not None else ()
        self.stats = SinkStats()
        self.checkpoint = Checkpoint(config, DataDir(data_dir).kafka_state, state_key)
        self.accumulator = MessageAccumulator()
        self.transactions: TransactionalSender | None = None
        if config.exactly_once:
            self.transactions = TransactionalSender(config, self.accumulator, self.checkpoint,
                                                    self.stats)
            self.sender: Sender = self.transactions
        else:
            self.sender = Sender(config, self.accumulator, self.checkpoint, self.stats)
        self.router = Router(config, self.sender, self.stats, versions)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, source: SourceInfo) -> None:
        """Connect (waiting for the broker) and, without local state, read the position back
        from the state topic."""
        self.router.format.flavor = "mariadb" if source.mariadb else "mysql"
        if self.transactions is not None:  # the position is Kafka's, never the file's
            await self.transactions.open()
            return
        await self.sender.connect()
        if self.checkpoint.durable is None and self.config.state_topic:
            await self.router.partition_count(self.config.state_topic)
            await self.checkpoint.read_back()
        if self.checkpoint.durable is not None:
            if self.snapshot_state.points:  # the stream may not have passed every point
                self.points = PointFilter(self.snapshot_state.points)
        elif self.config.snapshot == "initial" and self.snapshot_sources is not None and \
                self._snapshotting is None:
            self._snapshotting = asyncio.create_task(self._snapshot(source),
                                                     name="kafka initial snapshot")

    async def _snapshot(self, source: SourceInfo) -> None:
        """Every table's rows published, then the sink joins replication at the earliest
        dump's point (:mod:`~cdcserver.sinks.kafka.snapshot`)."""
        assert self.snapshot_sources is not None
        started = time.monotonic()
        log.info("kafka: no position: publishing an initial snapshot of every published "
                 "table first")
        snapshot = InitialSnapshot(self.snapshot_sources, self.snapshot_state,
                                   self.router.snapshot_rows, self.sender.flush,
                                   publish_dump=self.router.snapshot_dump)
        earliest = await self._until_done(  # the source away, a full disk...
            snapshot.run, (CdcError, OSError, KafkaError),
            "the initial snapshot failed (trying again in {delay:.0f} s, the same dumps "
            "kept): {exc}")
        rows = sum(p.rows for p in self.snapshot_sources.progress.values())
        log.info("kafka: initial snapshot published: %d tables, %d rows in %.1fs",
                 len(self.snapshot_sources.progress), rows, time.monotonic() - started)
        self.points = PointFilter(self.snapshot_state.points)
        if earliest is not None:
            await self._join_at(earliest)
        self._snapshotting = None
        if source.control is not None:
            await source.control.restart()  # fed from its position now

    async def _join_at(self, earliest: BinlogPosition) -> None:
        """The sink's position recorded at the snapshot's earliest point: a restart goes on
        from there. A refused write (a full or failing disk) is said and tried again, as a
        failed snapshot is; the snapshot is not taken again for it."""
        async def save() -> None:
            async with self.checkpoint.lock:
                await self.checkpoint.save(earliest)

        await self._until_done(save, (OSError,), "the initial snapshot is published, but its "
                               "position could not be recorded (trying again in {delay:.0f} "
                               "s): {exc}")

    async def _until_done(self, attempt: Callable[[], Awaitable[T]],
                          failures: tuple[type[BaseException], ...], said: str) -> T:
        """``attempt`` until it does not fail with one of ``failures``; each failure said
        (``said``, with ``delay`` and ``exc``) in the log and in /health meanwhile, and tried
        again after a wait (5 s, doubling to 5 minutes)."""
        backoff = Backoff(first=5.0, maximum=300.0)
        while True:
            try:
                return await attempt()
            except failures as exc:
                delay = backoff.failed()
                self.snapshot_failed = said.format(delay=delay, exc=exc)
                log.warning("kafka: %s", self.snapshot_failed)
                await asyncio.sleep(delay)
                self.snapshot_failed = ""

    async def close(self) -> None:
        if self._snapshotting is not None:
            self._snapshotting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._snapshotting
            self._snapshotting = None
        await self.sender.close()
        await self.router.topics.close()
        if self.router.registry is not None:
            await self.router.registry.close()

    @property
    def waiting(self) -> str:
        """Why the sink cannot deliver yet (the broker does not answer, the schema registry
        does not take a schema); "" when it can."""
        registry = self.router.registry
        return self.sender.waiting or self.snapshot_failed or (
            registry.waiting if registry is not None else "")

    @property
    def durable(self) -> BinlogPosition | None:
        return self.checkpoint.durable

    @durable.setter
    def durable(self, position: BinlogPosition | None) -> None:
        """(The publisher lease starts a sink from the position another instance left.)"""
        self.checkpoint.durable = position
        self.checkpoint.published = self.checkpoint.unrepaired = None  # (this one's)

    def by_gtid_only(self) -> None:
        """The positions read back (the checkpoint and, exactly once, what was published)
        by their GTID states alone: another instance recorded them, maybe reading another
        server, whose binlog file names mean nothing here."""
        cp = self.checkpoint
        if cp.durable is not None:
            cp.durable = BinlogPosition(cp.durable.gtid_state, "", 4)
        if cp.published is not None:
            cp.published = BinlogPosition(cp.published.gtid_state, "", 4)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of messages sent but not yet acknowledged."""
        return self.sender.in_flight.bytes

    @property
    def held_messages(self) -> int:
        """Messages held until the checkpoint passes them (``buffered_bytes`` is their size)."""
        return self.stats.messages - self.stats.acknowledged

    def oldest_unacknowledged(self) -> float:
        """Seconds the oldest message the broker has not acknowledged has waited (0: none)."""
        return self.sender.in_flight.oldest_unacknowledged()

    def starting_at(self, position: BinlogPosition) -> None:
        """Nothing to record: the checkpoint says where this sink stands."""
        self.sender.starting_at(position)

    @property
    def applied(self) -> BinlogPosition | None:
        """At least once, its checkpoint: what it sent since is sent again, as after a
        crash. Exactly once, what its last commit published (past the checkpoint when it was
        made while a repair was pending)."""
        if self.transactions is not None and self.checkpoint.published is not None:
            return self.checkpoint.published
        return self.checkpoint.durable

    @property
    def unrepaired(self) -> frozenset[str] | None:
        """Exactly once, the repairs not yet placed where its last commit published."""
        return self.checkpoint.unrepaired if self.transactions is not None else None

    @property
    def unrepaired_at(self) -> BinlogPosition | None:
        """Where its last commit published (:attr:`applied`)."""
        return self.applied

    @property
    def active(self) -> bool:
        """Out of replication while its initial snapshot is published."""
        return self._snapshotting is None

    def status(self) -> SinkStatus:
        progress = self.snapshot_sources.progress if self.snapshot_sources and \
            self._snapshotting is not None else {}  # (while it is taken)
        return SinkStatus(self.name, waiting=self.waiting,
                          metrics=Totals().figures(self, self.config.max_buffer_bytes),
                          snapshot=tuple(p.summary() for p in progress.values()))

    # -- the Sink interface ----------------------------------------------------------------

    async def apply(self, changes: list[Change]) -> None:
        if self.points is not None:
            changes = self.points(changes)
        if self.transactions is not None:  # not while a commit is under way
            async with self.transactions.lock:
                changes = self.transactions.without_rolled_back(changes)
                self.transactions.repairs_begin(changes)
                await self.router.route(changes)
                await self.sender.ship_all()
            return
        await self.router.route(changes)
        await self.sender.ship_all()

    async def keep_up(self, unrepaired: Callable[[], frozenset[str] | None]) -> None:
        """At least once, nothing: acknowledged messages leave the buffer as room is needed.
        Exactly once, the open Kafka transaction is committed without moving the checkpoint
        (:meth:`TransactionalSender.keep_up`)."""
        if self.transactions is not None:
            await self.transactions.keep_up(unrepaired)

    async def flush(self) -> BinlogPosition | None:
        """Wait until what was sent so far is acknowledged, then record the position."""
        return await self.sender.flush()
