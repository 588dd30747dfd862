"""The Kafka sink's deliveries: the producer, the broker's acknowledgements, and sending
again after a broker outage.

As in aiokafka's own split (``aiokafka/producer/sender.py``), this is the half that talks to
the broker. Every message the router makes is handed to the record batches
(:mod:`cdcserver.sinks.kafka.accumulator`) and held in flight (:class:`InFlight`) until the
broker acknowledges it. While the broker is away, up to ``max_buffer_bytes`` of messages
wait; then :meth:`Sender.hold` waits, which stops replication (the listener keeps serving
what is stored). A harvest takes what is acknowledged off the front and moves the checkpoint
(:mod:`cdcserver.sinks.kafka.checkpoint`) to the last transaction whose messages, and all
before them, are acknowledged.

If a delivery fails (the broker is gone longer than ``request_timeout``), the sender starts a
new producer, waiting for the broker as long as it takes, and sends everything not yet
acknowledged again, in order: a partition may hold a message twice, never out of order for
good. While the broker does not answer, why is in :attr:`Sender.waiting` (``/health`` shows
it). A message the sink makes while a new producer is being started is held in flight like
the others (the buffer keeps filling, up to its bound) and batched by the recovery, after every
older one: no message passes an older one being sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka.errors import KafkaConnectionError, KafkaError

from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.retry import Backoff
from cdcserver.messages.events import AbortEvent
from cdcserver.sinks.kafka import connect
from cdcserver.sinks.kafka.accumulator import Message, MessageAccumulator
from cdcserver.sinks.kafka.checkpoint import Checkpoint, InFlight
from cdcserver.sinks.kafka.metrics import SinkStats

log = logging.getLogger("cdcserver.sinks.kafka.sink")  # as before: operators grep for it

T = TypeVar("T")


def _backoff() -> Backoff:
    """How long to wait between attempts while the broker does not answer."""
    return Backoff(first=0.5, maximum=30.0)


async def retrying(action: Callable[[], Awaitable[T]]) -> T:
    """``action`` until the broker answers it."""
    backoff = _backoff()
    while True:
        try:
            return await action()
        except (KafkaError, OSError) as exc:
            delay = backoff.failed()
            log.warning("kafka: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)


def unanswered(exc: BaseException) -> bool:
    """Whether a producer's start failed because no broker answered as it should: an error
    of Kafka's or of the network, or aiokafka's own assertion that it knows of a broker
    (``Did we not perform bootstrap?``), which it makes when a metadata answer named none
    (a soak's Kafka partition stopped the service so). Another assertion is a defect."""
    if isinstance(exc, (KafkaError, OSError)):
        return True
    if not isinstance(exc, AssertionError) or exc.__traceback__ is None:
        return False
    innermost = exc.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    return str(innermost.tb_frame.f_globals.get("__name__", "")).startswith("aiokafka.")


class Sender:
    def __init__(self, config: KafkaConfig, accumulator: MessageAccumulator,
                 checkpoint: Checkpoint, stats: SinkStats) -> None:
        self.config = config
        self.accumulator = accumulator
        self.checkpoint = checkpoint
        self.stats = stats
        self.in_flight = InFlight()
        self.waiting = ""  # why the sink cannot deliver yet (the broker does not answer)
        self.producer: Any = None
        # held while a new producer starts and what is in flight is batched again: a message
        # held meanwhile is left to it
        self._recovering = asyncio.Lock()
        self._generation = 0  # producers started so far

    # -- the producer ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Until the broker answers: the wait is in ``waiting`` (``/health`` shows it), logged
        at the first failure and then once a minute or when the error changes."""
        backoff = _backoff()
        logged, logged_at = "", 0.0
        while True:
            producer = self._producer()
            try:
                await producer.start()
            except BaseException as exc:
                if not unanswered(exc):  # cancelled (a stop): let go
                    with contextlib.suppress(Exception):
                        await asyncio.shield(producer.stop())
                    raise
                with contextlib.suppress(KafkaError, OSError, AssertionError):
                    await producer.stop()
                if self.config.idempotence and "InitProducerId" in repr(exc):
                    raise ConfigError("the Kafka broker refused an idempotent producer; set "
                                      "kafka.idempotence = false for it") from exc
                delay = backoff.failed()
                self.waiting = (f"waiting for the Kafka broker at {self.config.bootstrap} "
                                f"(replication starts when it answers): {exc}")
                if self.waiting != logged or time.monotonic() - logged_at >= 60:
                    log.warning("kafka: %s; trying again (every %.0fs at most)",
                                self.waiting, backoff.maximum)
                    logged, logged_at = self.waiting, time.monotonic()
                await asyncio.sleep(delay)
                continue
            if self.waiting:
                log.info("kafka: connected to %s", self.config.bootstrap)
            self.waiting = ""
            self.producer = producer
            self._generation += 1
            self.accumulator.use(producer)
            return

    def _producer(self) -> Any:
        return connect.producer(self.config)

    async def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(10):
                    await self.checkpoint.handed_over(self.producer)  # the last position
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(10):  # the batches shipped, to the producer
                    await self.accumulator.drained()
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(10):  # (stopped even if the last one was not
                    await self.producer.stop()  # handed over; it delivers what it holds)
            self.producer = None
            self.accumulator.use(None)

    # -- messages in flight ----------------------------------------------------------------

    async def hold(self, message: Message) -> None:
        """Keep ``message`` until the broker acknowledges it (waiting for room first), and
        batch it."""
        if self.in_flight.bytes + message.size > self.config.max_buffer_bytes and \
                self.in_flight:
            await self._make_room(message.size)
        self.in_flight.hold(message)
        self.stats.messages += 1
        if self._recovering.locked():
            return  # the recovery batches it, after every older message
        await self.accumulator.add(message)

    async def ship_all(self) -> None:
        """Hand every open record batch to the producer (none while it is started again)."""
        await self.accumulator.ship_all()

    async def partitions_for(self, topic: str) -> set[int]:
        if self.producer is None:  # being started again
            async with self._recovering:
                pass
        self._check_usable()  # (a producer let go for good is not waited for)
        if self.producer is None:
            raise KafkaConnectionError("the producer is being started again")
        return set(await self.producer.partitions_for(topic))

    def _check_usable(self) -> None:
        """Raise where the sink can no longer send (exactly once: fenced out, or rewound
        and waiting for replication to start over); at least once it always can."""

    def end_transaction(self, position: BinlogPosition) -> None:
        self.in_flight.end_transaction(position)
        self.stats.transactions += 1

    async def at_boundary(self) -> None:
        """A source transaction was routed to its end (exactly-once commits there)."""

    async def abandoned(self, abort: AbortEvent) -> None:
        """The source transaction being routed was abandoned, to be read again: at least
        once, what was sent of it stays published (a consumer sees that part twice)."""

    def starting_at(self, position: BinlogPosition) -> None:
        """A pipeline starts feeding the sink."""

    async def flush(self) -> BinlogPosition | None:
        """Wait until what was sent so far is acknowledged, then record the position."""
        await self.ship_all()
        waiting = self.in_flight.unfinished()
        if waiting:
            await asyncio.wait(waiting)
        await self.harvest()
        return self.checkpoint.durable

    async def _make_room(self, size: int) -> None:
        while self.in_flight.bytes + size > self.config.max_buffer_bytes and self.in_flight:
            await self._settle_oldest()

    async def _settle_oldest(self) -> None:
        """Wait for the oldest message's acknowledgement (resending on failure), then take
        every acknowledged message and marker off the front."""
        await self.ship_all()
        head = self.in_flight.oldest()
        if head is not None and head.future is not None:
            await asyncio.wait([head.future])
        elif head is not None:  # not batched yet: a new producer is being started
            async with self._recovering:
                pass
            if head.future is None:  # (no producer: do not spin)
                await asyncio.sleep(0.05)
        await self.harvest()

    # -- acknowledgements ------------------------------------------------------------------

    async def harvest(self) -> None:
        async with self.checkpoint.lock:
            await self._harvest_locked()

    async def _harvest_locked(self) -> None:
        moved = None
        while True:
            passed, acknowledged, failed = self.in_flight.release()
            self.stats.acknowledged += acknowledged
            if passed is not None:
                moved = passed
            if failed is None:
                break
            await self._recover(failed.exception() if not failed.cancelled() else None)
        if moved is not None:
            await self.checkpoint.save(moved)
            self.checkpoint.send(moved, self.producer)

    async def _recover(self, error: BaseException | None) -> None:
        """A delivery failed: reconnect and send everything unacknowledged again, in order."""
        generation = self._generation
        async with self._recovering:
            if generation != self._generation:
                return  # another waiter already recovered
            log.warning("kafka: delivery failed (%s); reconnecting and sending the %d "
                        "unacknowledged messages again", error or "cancelled",
                        sum(1 for _ in self.in_flight.messages()))
            self.stats.reconnects += 1
            self.accumulator.use(None)  # the batches queued for it: all sent again below
            await self.close()
            await self.connect()  # (the open batches are dropped: batched again below)
            await self._batch_again()

    async def _batch_again(self) -> None:
        """Every message in flight batched again, in order, with those held meanwhile (the
        sink goes on while the batches are shipped); the lock is let go only once none is
        left, with nothing awaited between the last look and the release."""
        done = 0
        while True:
            left = list(itertools.islice(self.in_flight.messages(), done, None))
            if not left:
                return
            for message in left:
                message.future = None
                await self.accumulator.add(message)
                self.stats.resent += 1
            done += len(left)
            await self.accumulator.ship_all()
