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
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

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


class MessageAccumulator:
    def __init__(self) -> None:
        self.producer: Any = None  # the sender's, while it has one
        self._open: dict[tuple[str, int], Batch] = {}  # batches not yet shipped
        self._ship_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._generation = 0  # producers used so far

    def use(self, producer: Any) -> None:
        """The producer to hand batches to (``None`` while the sender has none). A new one
        drops the batches open for the last: their messages are in flight, and the sender
        batches them again."""
        self.producer = producer
        if producer is not None:
            self._generation += 1
            self._open.clear()

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
        """Hand the partition's open batch to the producer. Batches of a partition reach it
        in the order they were closed: ``apply`` and ``flush`` both ship, and aiokafka takes a
        batch as soon as the partition's queue is empty, so two shippers waiting for the
        queue could otherwise swap. The per-partition lock is first come, first served."""
        if self.producer is None:  # being started again: it batches everything again
            return
        batch = self._open.pop(tp, None)
        if batch is None or not batch.messages:
            return
        batch.builder.close()
        lock = self._ship_locks.get(tp)
        if lock is None:
            lock = self._ship_locks[tp] = asyncio.Lock()
        generation = self._generation
        try:
            async with lock:
                producer = self.producer
                if producer is None or generation != self._generation:
                    return  # replaced while this waited its turn: batched again there
                future: asyncio.Future[Any] = await producer.send_batch(
                    batch.builder, tp[0], partition=tp[1])
        except (KafkaError, OSError) as exc:  # the producer cannot take it: settle later
            future = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            future.exception()  # retrieved here; the sender's harvest handles it
        if generation != self._generation:
            return  # a reconnect meanwhile batched these messages again
        for message in batch.messages:
            message.future = future

    async def ship_all(self) -> None:
        for tp in list(self._open):
            await self.ship(tp)
