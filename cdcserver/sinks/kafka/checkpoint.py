"""The Kafka sink's checkpoint: which positions the broker has acknowledged, and where the
sink keeps the last one.

:class:`InFlight` keeps every message sent, in the order produced, until the broker
acknowledges it; the end of each transaction is a :class:`Marker` among them. The position
may move to a marker once every message before it is acknowledged (:meth:`InFlight.release`),
never past an unacknowledged one, so what is lost in a crash is sent again. :class:`Checkpoint`
keeps that position: in ``state/kafka.json`` (one writer at a time, and a write cancelled
while its thread runs keeps the others out until it ends) and, with ``state_topic``, as a
record keyed by the sink's state key, which a sink without the file (a new instance behind
the publisher lease) reads back when it opens.

This module is the seam for exactly-once delivery (issue 52). The router only marks where
each transaction ends, the record batches know nothing of positions, and the sender
(:mod:`cdcserver.sinks.kafka.sender`) asks this module which position the acknowledged
messages reach, then hands it that position to keep (:meth:`Checkpoint.save`,
:meth:`Checkpoint.send`). A transactional checkpoint sends the position's record inside the
producer's transaction with the messages before it, instead of after their
acknowledgements, and reads it back committed; routing and batching stay as they are.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError

from cdcserver.core.durable import outlast, write_atomically
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka import connect
from cdcserver.sinks.kafka.accumulator import Message

log = logging.getLogger("cdcserver.sinks.kafka.sink")  # as before: operators grep for it

STATE_READ_TIMEOUT = 120.0  # seconds reading the state topic back may take at most


@dataclass
class Marker:
    """The end of a transaction: once everything before it is acknowledged, the sink's
    checkpoint may move to ``position``."""

    position: BinlogPosition


class InFlight:
    """The messages sent and not yet taken off as acknowledged, with the transactions' ends
    among them, in order."""

    def __init__(self) -> None:
        self._entries: collections.deque[Message | Marker] = collections.deque()
        self.bytes = 0  # the messages' size

    def __len__(self) -> int:
        return len(self._entries)

    def hold(self, message: Message) -> None:
        message.created = time.monotonic()
        self._entries.append(message)
        self.bytes += message.size

    def end_transaction(self, position: BinlogPosition) -> None:
        self._entries.append(Marker(position))

    def clear(self) -> None:
        """Forget every message (exactly-once rewinds: nothing is sent again), their
        failures taken as seen."""
        for message in self.messages():
            future = message.future
            if future is not None and future.done() and not future.cancelled():
                future.exception()
        self._entries.clear()
        self.bytes = 0

    def messages(self) -> Iterator[Message]:
        return (e for e in self._entries if isinstance(e, Message))

    def oldest(self) -> Message | None:
        return next(self.messages(), None)

    def unfinished(self) -> list[asyncio.Future[Any]]:
        """The delivery futures the broker has not answered yet."""
        return [m.future for m in self.messages() if m.future is not None
                and not m.future.done()]

    def oldest_unacknowledged(self) -> float:
        """Seconds the oldest message the broker has not acknowledged has waited (0: none).
        The ones before it were acknowledged since the last flush: at most a flush's worth."""
        for message in self.messages():
            if not _acknowledged(message):
                return time.monotonic() - message.created
        return 0.0

    def release(self) -> tuple[BinlogPosition | None, int, asyncio.Future[Any] | None]:
        """Take the acknowledged messages, and the markers they reach, off the front: the
        last marker's position passed (``None``: none), how many messages were acknowledged,
        and the oldest message's future if its delivery failed (it stays at the front)."""
        passed, acknowledged = None, 0
        while self._entries:
            entry = self._entries[0]
            if isinstance(entry, Marker):
                passed = entry.position
                self._entries.popleft()
                continue
            future = entry.future
            if future is None or not future.done():
                break
            if future.cancelled() or future.exception() is not None:
                return passed, acknowledged, future
            self._entries.popleft()
            self.bytes -= entry.size
            acknowledged += 1
        return passed, acknowledged, None


class Checkpoint:
    """The position every message before it was acknowledged at: in the file and in
    ``state_topic``."""

    def __init__(self, config: KafkaConfig, path: str, key: str) -> None:
        self.config = config
        self.path = path  # state/kafka.json
        self.key = key  # the record's key on the state topic
        self.durable: BinlogPosition | None = _load_state(path)
        # Exactly-once: the position the last commit published (past ``durable`` when it was
        # made while a repair was pending: ``durable`` stays where a restart must replay
        # from), and the causes of the repairs not yet placed there (StateRecord)
        self.published: BinlogPosition | None = None
        self.unrepaired: frozenset[str] | None = None
        self.lock = asyncio.Lock()  # one writer at a time: held over a whole harvest
        self._sent: asyncio.Future[Any] | None = None  # the last position sent to Kafka
        self._sent_position: BinlogPosition | None = None  # (and which one it was)

    async def save(self, position: BinlogPosition) -> None:
        """Write the file, then move to ``position``: :attr:`durable` is only ever what the
        file holds (a refused write leaves it where it was, and what is let go by it, the
        events of prepared XA transactions, stays). The caller holds :attr:`lock`."""
        saving = asyncio.ensure_future(asyncio.to_thread(_save_state, self.path, position))
        try:
            await asyncio.shield(saving)
        except asyncio.CancelledError:
            # the thread goes on: keep the lock until it ends, or the next harvest's
            # write of the same file would race it (its temporary file removed under it)
            await outlast(saving)
            if not saving.cancelled() and saving.exception() is None:
                self.durable = position
            raise
        self.durable = position

    def send(self, position: BinlogPosition, producer: Any) -> None:
        """Record ``position`` in ``state_topic`` too, without waiting for the broker.

        Each position is handed to the producer after the one before it: ``producer.send``
        waits for the topic's metadata first, and sends waiting at once resume in any order
        (against Apache Kafka, a state topic just created has no leader for a moment), which
        put an older position last in the topic, the one read back."""
        if not self.config.state_topic or producer is None:
            return
        value = json.dumps(position.to_json()).encode()
        previous = self._sent
        self._sent_position = position

        async def after_previous() -> Any:
            if previous is not None:
                await asyncio.wait({previous})
            with contextlib.suppress(KafkaError, OSError):
                return await producer.send(self.config.state_topic, value,
                                           key=self.key.encode(), partition=0)
            return None

        task = asyncio.ensure_future(after_previous())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._sent = task

    async def handed_over(self, producer: Any) -> None:
        """Until the producer has taken the last position (before it stops): the durable one
        sent first if it was not yet (a stop that interrupted a harvest between the file's
        write and the send left the topic one position behind the file)."""
        if self.durable is not None and self.durable != self._sent_position:
            self.send(self.durable, producer)
        if self._sent is not None:
            await asyncio.wait({self._sent})

    async def read_back(self, committed: bool = False) -> None:
        """The position the state topic holds for this key, as the checkpoint (the topic
        exists: the caller made sure); ``committed``: of committed Kafka transactions only
        (exactly-once), up to the last stable offset."""
        topic = self.config.state_topic
        found: StateRecord | None = None
        consumer = connect.consumer(self.config, isolation_level="read_committed") \
            if committed else connect.consumer(self.config)
        await consumer.start()
        try:
            from aiokafka import TopicPartition

            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            # (exactly-once: each commit also takes an offset for its marker, and other
            # streams' instances may share the topic)
            consumer.seek(tp, max(end - (100_000 if committed else 1000), 0))
            # Up to the end offset, however slow the broker answers: a pause is not the end
            # (stopping at the first quiet second read an older position on a busy machine).
            async with asyncio.timeout(STATE_READ_TIMEOUT):
                while await consumer.position(tp) < end:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    for message in batch.get(tp, []):
                        if message.key == self.key.encode() and message.value:
                            found = StateRecord.parse(message.value)
        finally:
            await consumer.stop()
        self.durable = found.position if found is not None else None
        self.published = found.published if found is not None else None
        self.unrepaired = found.unrepaired if found is not None else None
        if found is not None:
            log.info("kafka: position %s read back from topic %s (published: %s)",
                     found.position.gtid_state, topic, found.published.gtid_state)


@dataclass(frozen=True)
class StateRecord:
    """What an exactly-once commit records in ``state_topic``: ``position``, where replication
    restarts for this sink (never past a change whose repair is not placed yet); the
    position the commit ``published`` (the same, or further when the commit was made while a
    repair waited for its watermark: a Kafka transaction must end within
    ``transaction_timeout``); and the causes (GTIDs) of the repairs not yet placed there.
    A replay from ``position`` skips what was published, and of the repairs read again
    gives only those (the others were published). The value is the position's JSON with
    the other two beside it, so a record written before them reads as a position."""

    position: BinlogPosition
    published: BinlogPosition
    unrepaired: frozenset[str]

    def to_json(self) -> bytes:
        return json.dumps({**self.position.to_json(), "published": self.published.to_json(),
                           "unrepaired": sorted(self.unrepaired)}).encode()

    @classmethod
    def parse(cls, value: bytes) -> StateRecord:
        data = json.loads(value)
        position = BinlogPosition.from_json(data)
        if "published" not in data:  # (written by a version before them)
            return cls(position, position, frozenset())
        return cls(position, BinlogPosition.from_json(data["published"]),
                   frozenset(str(c) for c in data.get("unrepaired", ())))


def _acknowledged(message: Message) -> bool:
    future = message.future
    return future is not None and future.done() and not future.cancelled() and \
        future.exception() is None


def _load_state(path: str) -> BinlogPosition | None:
    try:
        with open(path, "rb") as f:
            return BinlogPosition.from_json(json.loads(f.read())["position"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is unreadable: {exc}") from exc


def _save_state(path: str, position: BinlogPosition) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, json.dumps({"position": position.to_json()}).encode())
