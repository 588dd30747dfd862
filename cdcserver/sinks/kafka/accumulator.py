"""The Kafka sink's record batches: each partition's batch being filled, handed to the
producer when full.

As in aiokafka's own split (``aiokafka/producer/message_accumulator.py``), this is where
messages wait to be sent. The router (:mod:`cdcserver.sinks.kafka.routing`) makes them; the
sender (:mod:`cdcserver.sinks.kafka.sender`) holds each one in flight, then appends it here
to its partition's open record batch (aiokafka's batch API: one delivery future per batch
instead of one per message, which halved the sink's cost per message). A batch is handed to
the producer when it is full, at the end of every ``apply`` and before a flush waits; each of
its messages then carries the batch's delivery future. When the sender has to start a new
producer, it hands it over here (:meth:`MessageAccumulator.use`), which drops the batches
open for the old one: their messages are in flight, and the sender batches them all again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaConnectionError, KafkaError

from cdcserver.sinks.kafka import connect

OVERHEAD = 128  # bytes counted per message beyond key and value


class Message:
    """One Kafka record, and the delivery future of the batch it was handed to the producer
    in (``None`` until then)."""

    __slots__ = ("created", "future", "headers", "key", "partition", "size", "topic", "value")

    def __init__(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]]) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value
        self.headers = headers
        self.size = len(key or b"") + len(value or b"") + OVERHEAD  # None: a tombstone
        self.future: asyncio.Future[Any] | None = None
        self.created = 0.0  # time.monotonic() when produced (its age while unacknowledged)


@dataclass
class Batch:
    """A partition's record batch being filled."""

    builder: Any
    messages: list[Message] = field(default_factory=list)


@dataclass
class _Partition:
    """A partition's closed batches not yet handed to the producer, in order, each with the
    delivery future its messages carry; and whether one is being handed over."""

    queue: collections.deque[tuple[Any, asyncio.Future[Any]]] = field(
        default_factory=collections.deque)
    busy: bool = False  # a hand-over is under way (only one at a time: the order)
    task: asyncio.Task[None] | None = None  # handing the queue over in the background
    last: asyncio.Future[Any] | None = None  # the producer's future of the last handed over


class MessageAccumulator:
    def __init__(self) -> None:
        self.producer: Any = None  # the sender's, while it has one
        self._open: dict[tuple[str, int], Batch] = {}  # batches not yet shipped
        self._partitions: dict[tuple[str, int], _Partition] = {}  # shipped, not handed over
        self._generation = 0  # producers used so far

    def use(self, producer: Any) -> None:
        """The producer to hand batches to (``None`` while the sender has none). A new one
        drops the batches open for the last: their messages are in flight, and the sender
        batches them again. Any change drops the batches shipped and not yet handed over:
        their futures fail (the sender batches their messages again, or forgets them)."""
        self.producer = producer
        if producer is not None:
            self._generation += 1
            self._open.clear()
        partitions, self._partitions = self._partitions, {}
        gone = KafkaConnectionError("the producer was let go before it took the batch")
        for partition in partitions.values():
            if partition.task is not None:
                partition.task.cancel()
            for _, future in partition.queue:
                _fail(future, gone)
            partition.queue.clear()

    async def add(self, message: Message) -> None:
        batch = self._open.get((message.topic, message.partition))
        if batch is None or batch.builder.append(timestamp=None, key=message.key,
                                                 value=message.value,
                                                 headers=message.headers) is None:
            await self._add_to_new_batch(message)
        else:
            batch.messages.append(message)

    async def _add_to_new_batch(self, message: Message) -> None:
        """Ship the partition's full batch, if any, and start a new one with the message;
        unless the producer is gone or was replaced meanwhile (then the sender batches every
        message in flight again, this one too)."""
        tp = (message.topic, message.partition)
        generation = self._generation
        await self.ship(tp)
        if self.producer is None or generation != self._generation:
            return
        batch = self._open[tp] = Batch(self.producer.create_batch())
        # An empty batch takes a message of any size (up to max_request_size).
        batch.builder.append(timestamp=None, key=message.key, value=message.value,
                             headers=message.headers)
        batch.messages.append(message)

    async def ship(self, tp: tuple[str, int]) -> None:
        """Close the partition's open batch and queue it for the producer; its messages
        carry its delivery future from now on (answered when the broker's is).

        The caller never waits for the partition's earlier batches: aiokafka's
        ``send_batch`` takes a partition's batch only once the one before it has gone out,
        and while the broker is away that is up to ``request_timeout`` per batch, which
        stalled replication long before ``max_buffer_bytes`` was held. Only when the
        partition has nothing unacknowledged is the batch handed over here (the producer
        takes it at once); otherwise one task per partition hands the queue over, in order.
        """
        if self.producer is None:  # being started again: it batches everything again
            return
        batch = self._open.pop(tp, None)
        if batch is None or not batch.messages:
            return
        batch.builder.close()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        for message in batch.messages:
            message.future = future
        partition = self._partitions.get(tp)
        if partition is None:
            partition = self._partitions[tp] = _Partition()
        partition.queue.append((batch.builder, future))
        if partition.busy:
            return  # handed over after the ones before it
        if partition.last is None or partition.last.done():
            await self._hand_over(tp, partition, once=True)
        if partition.queue and not partition.busy:
            partition.busy = True  # from now: a second task would send the same batch
            partition.task = asyncio.ensure_future(self._hand_over(tp, partition))
            partition.task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _hand_over(self, tp: tuple[str, int], partition: _Partition,
                         once: bool = False) -> None:
        """The partition's queued batches to the producer, in order (``once``: the first
        only). After a batch failed, the ones behind it fail too without being sent: the
        sender sends them all again, in order."""
        generation = self._generation
        partition.busy = True
        try:
            while partition.queue:
                producer = self.producer
                if producer is None or generation != self._generation:
                    return  # let go: use() failed what is queued
                builder, future = partition.queue[0]
                failed = _failure(partition.last)
                if failed is not None:
                    _fail(future, failed)
                else:
                    try:
                        sent: asyncio.Future[Any] = await producer.send_batch(
                            builder, tp[0], partition=tp[1])
                    except (KafkaError, OSError, *connect.REFUSALS) as exc:  # settle later
                        failure = connect.refusal(producer, exc)
                        partition.last = _failed(failure)
                        _fail(future, failure)
                    except BaseException as exc:  # cancelled, or a bug: nobody waits forever
                        _fail(future, exc if isinstance(exc, Exception) else
                              KafkaConnectionError("the hand-over was cancelled"))
                        raise
                    else:
                        partition.last = sent
                        sent.add_done_callback(functools.partial(_answer, future))
                if partition.queue and partition.queue[0][1] is future:
                    partition.queue.popleft()
                if once:
                    return
        finally:
            partition.busy = False

    async def ship_all(self) -> None:
        for tp in list(self._open):
            await self.ship(tp)

    async def drained(self) -> None:
        """Until every batch shipped is handed to the producer (or failed)."""
        tasks = {p.task for p in self._partitions.values()
                 if p.task is not None and not p.task.done()}
        if tasks:
            await asyncio.wait(tasks)


def _failed(exc: BaseException) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    _fail(future, exc)
    return future


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``future``, its exception taken as retrieved (the sender's harvest reads it)."""
    if not future.done():
        future.set_exception(exc)
        future.exception()


def _failure(future: asyncio.Future[Any] | None) -> BaseException | None:
    """Why the producer's future failed, if it is answered and failed."""
    if future is None or not future.done():
        return None
    if future.cancelled():
        return KafkaConnectionError("the batch before it was cancelled")
    return future.exception()


def _answer(future: asyncio.Future[Any], sent: asyncio.Future[Any]) -> None:
    """The broker's answer to a batch, to the future its messages carry."""
    if sent.cancelled():
        if not future.done():
            future.cancel()
        return
    exc = sent.exception()
    if exc is not None:
        _fail(future, exc)
    elif not future.done():
        future.set_result(sent.result())
