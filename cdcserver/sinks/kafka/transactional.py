"""Exactly-once delivery (``[kafka] delivery = "exactly-once"``): Kafka transactions, each
committed with the position it reaches.

The sender here is a transactional producer's. Messages go into an open Kafka transaction as
the router makes them; at a source transaction's end, when a commit is due (every flush,
which the pipeline asks for every ``flush_interval``), the position reached is written to
``state_topic`` (a compacted topic, keyed by the sink's state key) **in the same
transaction**, and the transaction is committed. A Kafka transaction therefore holds whole
source transactions and the position after the last of them, or nothing: a ``read_committed``
consumer sees every change once, and the position committed is exactly what it has seen. As
Kafka Connect does for exactly-once sources (KIP-618), the position is read back from Kafka,
never from a local file: at every open and after every failure.

Failures are not repaired by sending again, as at-least-once does (that would duplicate what
a commit the client did not hear about already published). Instead the sink **rewinds**: it
lets its producer go, starts a new one with the same transactional id (the broker aborts
whatever the old one left open), reads back the position committed, and raises
:class:`~cdcserver.core.errors.SinkRewound`; replication starts over from the checkpoints,
and this sink is fed again from its commit. Until then it refuses what the old pipeline still
hands it. A broker away for long waits in the reconnect (``/health`` says why).

Two instances with the same transactional id: the newer one's producer fences the older, whose
next send or commit fails with ``ProducerFenced``; the older raises
:class:`~cdcserver.core.errors.PublisherFenced` and stops publishing for good (exactly one
publishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from cdcserver.core.changes import Abort, Begin, Change, Commit, Rowless
from cdcserver.core.errors import PublisherFenced, SinkRewound
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.messages.events import AbortEvent
from cdcserver.sinks.kafka import connect, topics
from cdcserver.sinks.kafka.accumulator import Message, MessageAccumulator
from cdcserver.sinks.kafka.checkpoint import Checkpoint, StateRecord
from cdcserver.sinks.kafka.metrics import SinkStats
from cdcserver.sinks.kafka.sender import Sender, retrying

log = logging.getLogger("cdcserver.sinks.kafka.sink")

SAVE_EVERY = 1.0  # seconds between writes of state/kafka.json (not on the commit's path)
# A commit that took this share of request_timeout or more may have had its request time
# out and be sent again (the share: the event loop's clock may lag a little behind)
SENT_AGAIN = 0.8

FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)


def fenced(error: BaseException | None) -> bool:
    return isinstance(error, FENCED) or (
        error is not None and isinstance(error.__cause__, FENCED))


class TransactionalSender(Sender):
    def __init__(self, config: KafkaConfig, accumulator: MessageAccumulator,
                 checkpoint: Checkpoint, stats: SinkStats) -> None:
        super().__init__(config, accumulator, checkpoint, stats)
        self.transactional_id = config.transactional_id or checkpoint.key
        self.lock = asyncio.Lock()  # one of: routing a batch, committing
        self._open = False  # a Kafka transaction is open
        self._reached: BinlogPosition | None = None  # the last source transaction routed
        self._tail = 0  # messages routed after it (a commit waits for its end)
        # the position reached is past the checkpoint with nothing open (transactions with
        # no message for Kafka, or a commit made while a repair was pending): a flush
        # commits the position alone
        self._ahead = False
        self._rowless_open = False  # the source transaction half routed holds a Rowless
        # Transactions (GTIDs) the binlog rolls back part way (Abort ``again``) after part of
        # them was routed: the sink rewound, and on the replay drops them up to that point
        self._rolled_back: set[str] = set()
        self._dropping = ""  # the one being dropped now
        self._commit_wanted = False  # a flush came while a source transaction was open
        self._rewound = False  # until the next pipeline starts: refuse the old one's batches
        self._fenced: BaseException | None = None
        # Why the next use must read the committed position back first ("": it need not):
        # a commit cancelled under way (the pipeline torn down), which the brokers may have
        # committed or not; a rewind cancelled before it had a producer and that position
        self._unsure = ""
        self._began = 0.0  # time.monotonic() when the open transaction began
        self._beginning = False  # a begin waits (for the producer's id)
        self._saved = 0.0  # time.monotonic() when state/kafka.json was last written
        self._saved_position: BinlogPosition | None = None  # ... and what it holds

    def _producer(self) -> Any:
        return connect.producer(self.config, self.transactional_id)

    # -- what the sink calls ---------------------------------------------------------------

    async def open(self) -> None:
        """Connect (fencing every earlier producer with this id) and read back the position
        committed (``state_topic`` created first, compacted)."""
        await self.connect()
        if self.config.create_topics:
            await retrying(lambda: topics.create_topics(
                self.config, [self.config.state_topic], 1, compact=True))
        await self._read_back()

    async def close(self) -> None:
        """Commit nothing more: an open transaction is aborted (what it held is sent again
        from the committed position at the next start)."""
        producer = self.producer
        if producer is not None and self._open:
            # (AssertionError: aiokafka's transaction manager refuses the abort of a producer
            # it holds fenced, FATAL_ERROR, with an assert; the producer is stopped below
            # either way. Raised, it left the producer and its sockets open.)
            with contextlib.suppress(KafkaError, OSError, TimeoutError, AssertionError):
                async with asyncio.timeout(10):
                    await producer.abort_transaction()
        self._open = False
        await super().close()

    def starting_at(self, position: BinlogPosition) -> None:
        """A new pipeline feeds the sink: accept batches again. It starts from the position
        committed, so a Kafka transaction still open (the last pipeline ended between
        commits: a pause, a failover) holds changes it will route again: it is aborted
        first (at the next use), as after a failure."""
        self._rewound, self._dropping = False, ""
        if self._open and not self._unsure:
            self._unsure = "replication started over while a Kafka transaction held " \
                           "changes past the position committed"

    async def abandoned(self, abort: AbortEvent) -> None:
        """A source transaction was abandoned after part of it went into the open Kafka
        transaction (the source's connection lost mid-transaction, a rollback on the primary,
        a pause): that part must not be committed, and the transaction read again would
        follow it. The Kafka transaction is aborted: replication starts over from the
        position committed. A rollback the binlog holds comes back on the replay, at the
        same point: that transaction is then dropped up to it (:meth:`without_rolled_back`),
        or every replay would rewind again."""
        if self._tail:
            if abort.again and abort.gtid:
                self._rolled_back.add(abort.gtid)
            await self._rewind(RuntimeError(
                f"a source transaction was abandoned ({abort.reason}) after {self._tail} of "
                "its messages went into the open Kafka transaction"))

    def without_rolled_back(self, changes: list[Change]) -> list[Change]:
        """``changes`` without the part of a transaction before the rollback that made the
        sink rewind (:meth:`abandoned`): the binlog gives it again on every replay."""
        if not self._rolled_back and not self._dropping:
            return changes
        kept: list[Change] = []
        for change in changes:
            if not self._dropping and isinstance(change, Begin) and \
                    str(change.gtid) in self._rolled_back:
                self._dropping = str(change.gtid)
            if not self._dropping:
                kept.append(change)
            elif isinstance(change, Abort):  # (the transaction opened again follows)
                self._rolled_back.discard(self._dropping)
                self._dropping = ""
        return kept

    def repairs_begin(self, changes: list[Change]) -> None:
        """A flush that came in the middle of a source transaction commits at its end,
        unless a repair begins in it (a change without row events, Rowless, among
        ``changes`` or routed before them): the commit would pass that change before its
        repair is placed. The next flush, or the pipeline's keep-up while the repair is
        pending, commits instead."""
        for change in changes:
            if isinstance(change, Rowless):
                self._rowless_open, self._commit_wanted = True, False
            elif isinstance(change, (Commit, Abort)):
                self._rowless_open = False

    async def hold(self, message: Message) -> None:
        await self._ready()
        if not self._open:
            await self._begin()
        await super().hold(message)
        self._tail += 1

    async def partitions_for(self, topic: str) -> set[int]:
        await self._ready()  # (a rewind cancelled left no producer)
        return await super().partitions_for(topic)

    def end_transaction(self, position: BinlogPosition) -> None:
        super().end_transaction(position)
        self._reached, self._tail, self._ahead = position, 0, True

    async def at_boundary(self) -> None:
        """A source transaction ended: commit if a flush asked for it meanwhile."""
        if self._commit_wanted:
            await self._commit()

    async def flush(self) -> BinlogPosition | None:
        """Commit what is routed, if a source transaction is not half routed (else the next
        one routed to its end commits), or the position reached alone when nothing was sent
        since (it moved past the checkpoint by transactions with nothing for Kafka, or a
        commit made while a repair was pending published it); returns the position
        committed."""
        async with self.lock:
            await self._ready()
            if self._tail:
                self._commit_wanted = not self._rowless_open
            elif self._open:
                await self._commit()
            elif self._ahead and self._reached is not None:
                # Routed with nothing to send (tables the sink leaves out), or published by
                # a commit made while a repair was pending: the position alone is committed
                await self._begin()
                await self._commit()
            await self._keep_file()
        return self.checkpoint.durable

    async def _keep_file(self) -> None:
        """``state/kafka.json``, the operator's copy of the position (the sink reads its own
        back from Kafka): written once a second at most, off the commits' path."""
        position = self.checkpoint.durable
        if position is None or position == self._saved_position or \
                time.monotonic() - self._saved < SAVE_EVERY:
            return
        self._saved, self._saved_position = time.monotonic(), position
        async with self.checkpoint.lock:
            await self.checkpoint.save(position)

    # -- transactions ----------------------------------------------------------------------

    async def _begin(self) -> None:
        # The transaction's age counts from here: aiokafka's begin waits for the producer's
        # id, which it asks for again after failures, for as long as the brokers cannot be
        # reached; a fencing after such a wait is the brokers' abort for the age (_aged).
        # (Counted from the begin's end, a soak run took it for another instance's.)
        self._beginning, self._began = True, time.monotonic()
        try:
            await self.producer.begin_transaction()
        except (KafkaError, OSError, *connect.REFUSALS) as exc:
            await self._rewind(connect.refusal(self.producer, exc))
        finally:
            self._beginning = False
        self._open = True

    async def keep_up(self, unrepaired: Callable[[], frozenset[str] | None]) -> None:
        """A repair waits for its watermark, so the checkpoint may not move (a restart must
        read the change again): the open Kafka transaction is committed anyway, before the
        brokers abort it for its age (``transaction_timeout``: a catch-up that kept repairs
        pending longer made no progress, started over from the same commit each time). It
        records the position it published beside the checkpoint, and the repairs not yet
        placed there (:class:`~cdcserver.sinks.kafka.checkpoint.StateRecord`): a replay
        skips what was published and gives only those repairs again. Not in the middle of a
        source transaction (a later tick commits), nor while a repair is being read (which
        repairs are out is not known then)."""
        async with self.lock:
            await self._ready()
            causes = unrepaired()
            if self._open and not self._tail and causes is not None and \
                    self.checkpoint.durable is not None:  # (a restart needs one)
                await self._commit(causes)

    async def _commit(self, unrepaired: frozenset[str] | None = None) -> None:
        """The position reached, in ``state_topic``, and the transaction committed with it;
        with ``unrepaired`` (the causes of the repairs not yet placed, while one is pending)
        the checkpoint stays where it is and the position goes beside it as published."""
        self._commit_wanted = False
        position = self._reached
        if not self._open or position is None:
            return
        # (none left unplaced: as a commit with no repair pending)
        restart = self.checkpoint.durable or position if unrepaired else position
        record = StateRecord(restart, position, unrepaired or frozenset())
        await self._delivered()
        committing = time.monotonic()
        try:
            state = await self.producer.send(self.config.state_topic, record.to_json(),
                                             key=self.checkpoint.key.encode(), partition=0)
            # Acknowledged before the commit: the producer commits a transaction even when
            # one of its batches was refused, and a commit without its record had the
            # replay publish everything since the last one again (the soak, seed 83: a
            # timed-out produce request, retried, refused as OutOfOrderSequenceNumber).
            # (Flushed: a record left to linger is sent only by the commit's own flush.)
            await self.producer.flush()
            await state
            committing = time.monotonic()  # (the commit's own requests from here)
            await self.producer.commit_transaction()
        except (KafkaError, OSError, *connect.REFUSALS) as exc:
            await self._rewind(connect.refusal(self.producer, exc))
        except asyncio.CancelledError:
            self._unsure = "a commit was cancelled under way; whether the brokers committed " \
                           "it is read back"
            raise
        self._open = False
        self.stats.commits += 1
        self.stats.acknowledged += sum(1 for _ in self.in_flight.messages())
        self.in_flight.clear()
        self.checkpoint.durable = restart
        self.checkpoint.published, self.checkpoint.unrepaired = position, record.unrepaired
        self._ahead = restart != position  # (the next flush with none pending moves it)
        took = time.monotonic() - committing
        if took >= SENT_AGAIN * self.config.request_timeout:
            await self._new_epoch(took)

    async def _new_epoch(self, took: float) -> None:
        """After a commit whose request may have been sent twice, a new producer, in a new
        epoch, before the next transaction begins.

        The producer sends a commit (EndTxn) again when it hears no answer within
        ``request_timeout``, on a new connection; the first copy may still be in the network
        (the kernel retransmits what the closed connection had queued, once the link is
        back) and reach the broker after the second. A commit names no transaction, only
        the producer's id and epoch, so a copy that arrives once the next transaction is
        open commits that one, part sent and without its position: the sink then fails
        (the rest of it is refused) and rewinds to the position before it, and publishes
        it again (``test_a_commit_delivered_late_commits_nothing_of_the_next_transaction``;
        Kafka's transaction protocol 2, KIP-890, bumps the epoch at every commit for this,
        which aiokafka does not speak). The new producer's id request bumps the epoch, and
        the brokers refuse anything of the old one."""
        log.info("kafka: a commit took %.1f s, long enough for it to have been sent twice: "
                 "starting the producer again, in a new epoch", took)
        self.stats.new_epochs += 1
        producer, self.producer = self.producer, None
        self.accumulator.use(None)
        with contextlib.suppress(KafkaError, OSError, TimeoutError):
            async with asyncio.timeout(5):
                await producer.stop()
        try:
            await self.connect()
        except asyncio.CancelledError:  # (the pipeline torn down)
            self._unsure = "a new producer was being started after a slow commit"
            raise

    async def _ready(self) -> None:
        """Before the sink is used: not fenced out nor rewound, and after a commit or a
        rewind cancelled under way, a producer, the position committed read back, and
        replication started over from it (nothing published twice, nothing skipped)."""
        self._check_usable()
        if self._unsure:
            why, self._unsure = self._unsure, ""
            await self._rewind(RuntimeError(why))

    async def _delivered(self) -> None:
        """Every message of the transaction acknowledged, or a rewind: the producer commits
        a transaction even when one of its batches was refused (a message too large, say),
        so the batches are checked first."""
        await self.ship_all()
        waiting = self.in_flight.unfinished()
        if waiting:
            await asyncio.wait(waiting)
        async with self.checkpoint.lock:
            await self._harvest_locked()

    # -- failures --------------------------------------------------------------------------

    async def _harvest_locked(self) -> None:
        """Take what the broker acknowledged off the front, to make room: nothing is sent
        again, so nothing need be kept (the position moves only at a commit)."""
        while True:
            _, acknowledged, failed = self.in_flight.release()
            self.stats.acknowledged += acknowledged
            if failed is None:
                return
            await self._recover(failed.exception() if not failed.cancelled() else None)

    async def _recover(self, error: BaseException | None) -> None:
        await self._rewind(error)

    async def _rewind(self, error: BaseException | None) -> None:
        """Let the producer go, start a new one (the broker aborts the open transaction),
        read back the position committed, and have replication start over from it."""
        if fenced(error) and not self._aged():
            self._fenced = error
            await self._let_go()
            raise PublisherFenced(self._fenced_text()) from error
        log.warning("kafka: %s; aborting the open transaction and publishing again from "
                    "the position committed", error or "delivery cancelled")
        self.stats.reconnects += 1
        self.stats.rewinds += 1
        await self._let_go()
        self._rewound = True
        try:
            await self.connect()
            await self._read_back()
        except asyncio.CancelledError:  # (the pipeline torn down: a full disk's pause)
            self._unsure = "a rewind was cancelled under way; it is done again"
            raise
        raise SinkRewound(f"kafka: the open transaction was aborted ({error}); publishing "
                          f"again from {self.checkpoint.durable}") from error

    def _aged(self) -> bool:
        """The open transaction is old enough that the brokers may have aborted it for its
        age (``transaction_timeout``), which they report as a fencing: a producer fenced
        then rewinds, and is taken for fenced out by another instance only while its
        transaction is younger than half the timeout."""
        return (self._open or self._beginning) and \
            time.monotonic() - self._began >= self.config.transaction_timeout / 2

    async def _let_go(self) -> None:
        producer, self.producer = self.producer, None
        self.accumulator.use(None)
        self.in_flight.clear()
        self._open, self._tail, self._commit_wanted = False, 0, False
        self._rowless_open = False
        self._reached, self._ahead = None, False
        if producer is not None:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(5):
                    await producer.stop()

    async def _read_back(self) -> None:
        await self.checkpoint.read_back(committed=True)
        self._reached = self.checkpoint.durable

    def _check_usable(self) -> None:
        if self._fenced is not None:
            raise PublisherFenced(self._fenced_text())
        if self._rewound:
            raise SinkRewound("kafka: rewound; waiting for replication to start over")

    def _fenced_text(self) -> str:
        return (f"kafka: this instance's producer was fenced out ({self._fenced}): another "
                f"instance publishes this stream with transactional id "
                f"{self.transactional_id!r}, or a Kafka transaction stayed open longer than "
                "kafka.transaction_timeout and the brokers aborted it; this instance no "
                "longer publishes (exactly one does). Restart it to publish again (it then "
                "fences the other out)")

