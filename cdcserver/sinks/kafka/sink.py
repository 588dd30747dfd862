"""The Kafka sink: every committed change published, at least once, in order per row.

**Topics and partitions.** A row change goes to its table's topic (``topic`` template), to
the partition its primary key hashes to (see ``_partition``), so each row's changes stay in
order; an update that changes the key goes to both keys' partitions. A schema statement goes
to every partition of the table's topic, so it is in order with every row's changes; a
statement that changes no table goes to ``ddl_topic``. A topic name holding characters Kafka
does not allow (``[A-Za-z0-9._-]``, 249 at most), as a table named in any other script would
give, is made legal by :func:`legal_topic`. Every message carries the headers
``gtid``, ``event`` (the record's ``event_number``) and ``schema`` (the id of the table's
schema on ``schema_topic``, which clients read to type the values); a databus message sent
with ``databus_labels`` also ``values: labels``.

**Delivery.** Messages are packed into one record batch per partition (aiokafka's batch
API: one delivery future per batch instead of one per message, which halved the sink's cost
per message) and shipped when a batch is full and at the end of every ``apply``; they are
kept, with their batch's delivery future, in order until the broker acknowledges them; the
end of each transaction is a marker among them. ``flush`` waits for the acknowledgements and
moves the sink's checkpoint (``state/kafka.json``, and ``state_topic``) to the last
transaction whose messages, and all before them, are acknowledged. After a crash replication
resumes from there: nothing is lost, and what is sent again has the same key. If a delivery
fails (the broker is gone longer than ``request_timeout``), the sink starts a new producer,
waiting for the broker as long as it takes, and sends everything not yet acknowledged again,
in order: a partition may hold a message twice, never out of order for good. While the
broker is away, up to ``max_buffer_bytes`` of messages wait; then ``apply`` waits, which
stops replication (the listener keeps serving what is stored).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import time
import zlib
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from cdcserver.core.capture import TableSelection
from cdcserver.core.changes import Change, Ddl, Rows
from cdcserver.core.durable import outlast, write_atomically
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.names import TableName
from cdcserver.core.retry import Backoff
from cdcserver.messages.base import MessageFormat, VersionLookup, primary_key
from cdcserver.messages.events import (
    CommitEvent,
    EventBuilder,
    RowBatch,
    RowEvent,
    StatementEvent,
    TableShape,
)
from cdcserver.messages.formats import FORMATS
from cdcserver.sinks.base import SinkStatus, SourceInfo
from cdcserver.sinks.kafka import connect
from cdcserver.sinks.kafka.metrics import SinkStats, Totals
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.dump import value_encoder

log = logging.getLogger(__name__)

_OVERHEAD = 128  # bytes counted per message beyond key and value
STATE_READ_TIMEOUT = 120.0  # seconds reading the state topic back may take at most


_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")


def legal_topic(name: str) -> str:
    """``name`` itself when Kafka allows it as a topic; else with every character it does
    not allow written ``_``, the name cut to fit 249 characters, and ``-`` and 12 hex digits
    of the name's SHA-256 after it, so two names never share a topic."""
    if _LEGAL_TOPIC.fullmatch(name) and name not in (".", ".."):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{_ILLEGAL.sub('_', name)[:249 - 13]}-{digest}"


class _Message:
    __slots__ = ("created", "future", "headers", "key", "partition", "size", "topic", "value")

    def __init__(self, topic: str, partition: int, key: bytes, value: bytes,
                 headers: list[tuple[str, bytes]]) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value
        self.headers = headers
        self.size = len(key) + len(value) + _OVERHEAD
        self.future: asyncio.Future[Any] | None = None
        self.created = 0.0  # time.monotonic() when produced (its age while unacknowledged)


@dataclass
class _Batch:
    """A partition's record batch being filled."""

    builder: Any
    messages: list[_Message] = field(default_factory=list)


@dataclass
class _Marker:
    """The end of a transaction: once everything before it is acknowledged, the sink's
    checkpoint may move to ``position``."""

    position: BinlogPosition


class KafkaSink:
    name = "kafka"

    def __init__(self, config: KafkaConfig, data_dir: str, state_key: str,
                 versions: VersionLookup | None = None) -> None:
        """``versions`` numbers the table versions in messages as the Avro store created
        them; the store then applies each batch first."""
        self.waiting = ""  # why the sink cannot deliver yet (the broker does not answer)
        self.config = config
        self.state_path = DataDir(data_dir).kafka_state
        self.state_key = state_key
        zone = zoneinfo.ZoneInfo(config.time_zone)  # checked when the configuration loaded
        self.format: MessageFormat = FORMATS[config.format](
            key=config.key, zone=zone, source_name=config.client_id,
            key_schema=config.key_schema, labels=config.databus_labels)
        fmt = self.format
        self.topic = fmt.default_topic if config.topic == "auto" else config.topic
        self.ddl_topic = fmt.default_ddl_topic if config.ddl_topic == "auto" \
            else config.ddl_topic
        if self.ddl_topic == "auto":  # the format's one topic, or its database's part
            self.ddl_topic = self.topic if "{table}" not in self.topic else \
                fmt.default_ddl_topic_for(self.topic)
        self.partitions = config.partitions or fmt.default_partitions
        self.after: tuple[str, ...] = ()
        if versions is not None:
            self.format.version_of = versions
            self.after = ("avro",)
        self.builder = EventBuilder()
        self.tables = TableSelection.parse(config.include, config.exclude, "kafka")
        self.durable: BinlogPosition | None = _load_state(self.state_path)
        self.stats = SinkStats()
        self._producer: Any = None
        self._state_sent: asyncio.Future[Any] | None = None  # the last position sent to Kafka
        self._pending: collections.deque[_Message | _Marker] = collections.deque()
        self._bytes = 0
        self._open: dict[tuple[str, int], _Batch] = {}  # batches not yet shipped
        self._ship_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._partitions: dict[str, int] = {}
        self._recovering = asyncio.Lock()
        self._harvesting = asyncio.Lock()  # one writer of the checkpoint at a time
        self._generation = 0  # producers started so far

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, source: SourceInfo) -> None:
        """Connect (waiting for the broker) and, without local state, read the position back
        from the state topic."""
        self.format.flavor = "mariadb" if source.mariadb else "mysql"
        await self._connect()
        if self.durable is None and self.config.state_topic:
            self.durable = await self._read_state_topic()
            if self.durable is not None:
                log.info("kafka: position %s read back from topic %s", self.durable.gtid_state,
                         self.config.state_topic)

    async def close(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(10):
                    if self._state_sent is not None:  # the last position, handed over
                        await asyncio.wait({self._state_sent})
                    await self._producer.stop()  # (which delivers what it holds)
            self._producer = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of messages sent but not yet acknowledged."""
        return self._bytes

    @property
    def held_messages(self) -> int:
        """Messages held until the checkpoint passes them (``buffered_bytes`` is their size)."""
        return self.stats.messages - self.stats.acknowledged

    def oldest_unacknowledged(self) -> float:
        """Seconds the oldest message the broker has not acknowledged has waited (0: none).
        The ones before it were acknowledged since the last flush: at most a flush's worth."""
        for entry in self._pending:
            if isinstance(entry, _Message) and not _acknowledged(entry):
                return time.monotonic() - entry.created
        return 0.0

    def starting_at(self, position: BinlogPosition) -> None:
        """Nothing to record: the checkpoint says where this sink stands."""

    @property
    def applied(self) -> BinlogPosition | None:
        """Its checkpoint: what it sent since is sent again, as after a crash (at least
        once)."""
        return self.durable

    @property
    def active(self) -> bool:
        return True

    def status(self) -> SinkStatus:
        return SinkStatus(self.name, waiting=self.waiting,
                          metrics=Totals().figures(self, self.config.max_buffer_bytes))

    # -- the Sink interface ----------------------------------------------------------------

    def _publishes(self, change: Change) -> bool:
        """``[kafka] include``/``exclude``: rows and statements of the tables selected (a
        statement naming no table, CREATE DATABASE, goes as before)."""
        if isinstance(change, Rows):
            return self.tables.selects(TableName(change.layout.database, change.layout.table))
        if isinstance(change, Ddl) and change.changes:
            return any(self.tables.selects(TableName(c.database, c.table))
                       for c in change.changes)
        return True

    async def apply(self, changes: list[Change]) -> None:
        if not self.tables.everything:
            changes = [c for c in changes if self._publishes(c)]
        for event in self.builder.events(changes):
            if isinstance(event, RowBatch):
                if self.format.per_row_event:
                    await self._row_event(event)
                else:
                    for row in event.rows:
                        await self._row(row)
            elif isinstance(event, StatementEvent):
                await self._statement(event)
            elif isinstance(event, CommitEvent):
                self._pending.append(_Marker(event.position))
                self.stats.transactions += 1
        await self._ship_all()

    async def keep_up(self) -> None:
        """Nothing: acknowledged messages leave the buffer as room is needed."""

    async def flush(self) -> BinlogPosition | None:
        """Wait until what was sent so far is acknowledged, then record the position."""
        await self._ship_all()
        waiting = [e.future for e in self._pending if isinstance(e, _Message)
                   and e.future is not None and not e.future.done()]
        if waiting:
            await asyncio.wait(waiting)
        await self._harvest()
        return self.durable

    # -- producing -------------------------------------------------------------------------

    async def _row(self, e: RowEvent) -> None:
        shape = e.shape
        topic, count, schema = await self._route(shape)
        before, after = e.before, e.after
        if before is None or after is None:
            row = after if before is None else before
            assert row is not None
            partitions: tuple[int, ...] = (self._partition(shape, row, count),)
        else:  # an update: both keys' partitions, if the key changed
            partitions = tuple(sorted({self._partition(shape, before, count),
                                       self._partition(shape, after, count)}))
        gtid = e.gtid_text.encode()
        for key, value, event in self.format.rows(e):
            headers = [("gtid", gtid), ("event", b"%d" % event), ("schema", schema)] \
                if schema else [("gtid", gtid), ("event", b"%d" % event)]
            for partition in partitions:
                await self._produce(_Message(topic, partition, key, value, headers))

    async def _row_event(self, batch: RowBatch) -> None:
        """One message for a whole binlog row event (the databus format). Its rows may hash
        to different partitions, so a table's row events all go to one partition (the CRC-32
        of its name), which keeps every row's changes in order."""
        if not batch.rows:
            return
        first = batch.rows[0]
        topic, count, schema = await self._route(first.shape)
        partition = zlib.crc32(str(first.shape.table).encode()) % count
        key, value, event = self.format.row_event(batch)
        gtid = first.gtid_text.encode()
        headers = [("gtid", gtid), ("event", b"%d" % event), ("schema", schema)] \
            if schema else [("gtid", gtid), ("event", b"%d" % event)]
        if self.format.labels:  # ENUM and SET values are labels, not indexes and bitmasks
            headers.append(("values", b"labels"))
        await self._produce(_Message(topic, partition, key, value, headers))

    async def _route(self, shape: TableShape) -> tuple[str, int, bytes]:
        route: tuple[str, int, bytes] | None = shape.cache.get("kafka.route")
        if route is None:
            topic = self._topic(shape.table.database, shape.table.table)
            route = shape.cache["kafka.route"] = (
                topic, await self._partition_count(topic), (await self._schema(shape)).encode())
        return route

    async def _statement(self, e: StatementEvent) -> None:
        message = self.format.statement(e)
        if message is None:
            return
        key, value = message
        schema = await self._schema(e.shape) if e.shape is not None else ""
        headers = self._headers(str(e.gtid), 0, schema)  # once per statement
        if self.format.statement_topic:  # the format's schema-change topic, once
            await self._partition_count(self.format.statement_topic)
            await self._produce(_Message(self.format.statement_topic, 0, key, value, headers))
            return
        if e.table is None:
            topic = legal_topic(self.ddl_topic.replace("{db}", e.database))
            await self._partition_count(topic)
            await self._produce(_Message(topic, 0, key, value, headers))
            return
        topic = self._topic(e.database, e.table)
        for partition in range(await self._partition_count(topic)):
            await self._produce(_Message(topic, partition, key, value, headers))

    def _topic(self, database: str, table: str) -> str:
        return legal_topic(self.topic.replace("{db}", database).replace("{table}", table))

    def _partition(self, shape: TableShape, row: tuple[Any, ...], count: int) -> int:
        """With primary-key message keys, Kafka's own partitioner (murmur2 of the key), so
        the topic is partitioned as any producer of those keys would; else a CRC-32 of the
        table and the primary key's text."""
        if self.format.key_style == "primary-key":
            return (murmur2(primary_key(shape, row)) & 0x7FFFFFFF) % count
        encoders = shape.cache.get("kafka.key_encoders")
        if encoders is None:
            fields = shape.fields
            key_columns = shape.primary_key or tuple(range(len(fields)))
            encoders = shape.cache["kafka.key_encoders"] = (
                str(shape.table).encode(), [(i, value_encoder(fields[i])) for i in key_columns])
        name, columns = encoders
        key = b"\x00".join([name, *[b"\x01" if row[i] is None else encode(row[i])
                                    for i, encode in columns]])
        return zlib.crc32(key) % count

    @staticmethod
    def _headers(gtid: str, event: int, schema: str) -> list[tuple[str, bytes]]:
        headers = [("gtid", gtid.encode()), ("event", str(event).encode())]
        if schema:
            headers.append(("schema", schema.encode()))
        return headers

    async def _schema(self, shape: TableShape) -> str:
        """The schema's id; published on the schema topic the first time it is used."""
        known: str | None = shape.cache.get("kafka.schema_id")
        if known is not None:
            return known
        schema = shape.schema.avsc
        text = json.dumps({k: schema[k] for k in ("database", "table", "fields")} |
                          {"primary_key": schema.get("primary_key", [])},
                          separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        schema_id = hashlib.sha256(text.encode()).hexdigest()[:16]
        if self.config.schema_topic:
            await self._partition_count(self.config.schema_topic)
            await self._produce(_Message(self.config.schema_topic, 0, schema_id.encode(),
                                         text.encode(), []))
        shape.cache["kafka.schema_id"] = schema_id
        return schema_id

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            if self.config.create_topics:
                await self._retrying(lambda: connect.create_topics(self.config, [topic],
                                                                   self.partitions))
            partitions = await self._retrying(lambda: self._producer.partitions_for(topic))
            count = self._partitions[topic] = len(partitions)
            self.stats.topics.add(topic)
        return count

    async def _produce(self, message: _Message) -> None:
        if self._bytes + message.size > self.config.max_buffer_bytes and self._pending:
            await self._make_room(message.size)
        message.created = time.monotonic()
        self._pending.append(message)
        self._bytes += message.size
        self.stats.messages += 1
        await self._add_to_batch(message)

    async def _make_room(self, size: int) -> None:
        while self._bytes + size > self.config.max_buffer_bytes and self._pending:
            await self._settle_oldest()

    async def _add_to_batch(self, message: _Message) -> None:
        batch = self._open.get((message.topic, message.partition))
        if batch is None or batch.builder.append(timestamp=None, key=message.key,
                                                 value=message.value,
                                                 headers=message.headers) is None:
            await self._add_to_new_batch(message)
        else:
            batch.messages.append(message)

    async def _add_to_new_batch(self, message: _Message) -> None:
        """Ship the partition's full batch, if any, and start a new one with the message."""
        tp = (message.topic, message.partition)
        await self._ship(tp)
        batch = self._open[tp] = _Batch(self._producer.create_batch())
        # An empty batch takes a message of any size (up to max_request_size).
        batch.builder.append(timestamp=None, key=message.key, value=message.value,
                             headers=message.headers)
        batch.messages.append(message)

    async def _ship(self, tp: tuple[str, int]) -> None:
        """Hand the partition's open batch to the producer. Batches of a partition reach it
        in the order they were closed: ``apply`` and ``flush`` both ship, and aiokafka takes a
        batch as soon as the partition's queue is empty, so two shippers waiting for the
        queue could otherwise swap. The per-partition lock is first come, first served."""
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
                future: asyncio.Future[Any] = await self._producer.send_batch(
                    batch.builder, tp[0], partition=tp[1])
        except (KafkaError, OSError) as exc:  # the producer cannot take it: settle later
            future = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            future.exception()  # retrieved here; _harvest_locked handles it
        if generation != self._generation:
            return  # a reconnect meanwhile batched these messages again
        for message in batch.messages:
            message.future = future

    async def _ship_all(self) -> None:
        for tp in list(self._open):
            await self._ship(tp)

    # -- acknowledgements -------------------------------------------------------------------

    async def _settle_oldest(self) -> None:
        """Wait for the oldest message's acknowledgement (resending on failure), then take
        every acknowledged message and marker off the front."""
        await self._ship_all()
        head = next((e for e in self._pending if isinstance(e, _Message)), None)
        if head is not None and head.future is not None:
            await asyncio.wait([head.future])
        await self._harvest()

    async def _harvest(self) -> None:
        async with self._harvesting:
            await self._harvest_locked()

    async def _harvest_locked(self) -> None:
        moved = None
        while self._pending:
            entry = self._pending[0]
            if isinstance(entry, _Marker):
                moved = entry.position
                self._pending.popleft()
                continue
            future = entry.future
            if future is None or not future.done():
                break
            if future.cancelled() or future.exception() is not None:
                await self._recover(future.exception() if not future.cancelled() else None)
                continue
            self._pending.popleft()
            self._bytes -= entry.size
            self.stats.acknowledged += 1
        if moved is not None:
            self.durable = moved
            saving = asyncio.ensure_future(asyncio.to_thread(_save_state, self.state_path,
                                                             moved))
            try:
                await asyncio.shield(saving)
            except asyncio.CancelledError:
                # the thread goes on: keep the lock until it ends, or the next harvest's
                # write of the same file would race it (its temporary file removed under it)
                await outlast(saving)
                raise
            self._record_state_in_kafka(moved)

    async def _recover(self, error: BaseException | None) -> None:
        """A delivery failed: reconnect and send everything unacknowledged again, in order."""
        generation = self._generation
        async with self._recovering:
            if generation != self._generation:
                return  # another waiter already recovered
            log.warning("kafka: delivery failed (%s); reconnecting and sending the %d "
                        "unacknowledged messages again", error or "cancelled",
                        sum(isinstance(e, _Message) for e in self._pending))
            self.stats.reconnects += 1
            await self.close()
            await self._connect()
            self._open.clear()  # their messages are pending: batched again below
            for entry in self._pending:
                if isinstance(entry, _Message):
                    entry.future = None
                    await self._add_to_batch(entry)
                    self.stats.resent += 1
            await self._ship_all()

    async def _connect(self) -> None:
        """Until the broker answers: the wait is in ``waiting`` (``/health`` shows it), logged
        at the first failure and then once a minute or when the error changes."""
        backoff = Backoff(first=0.5, maximum=30.0)
        logged, logged_at = "", 0.0
        while True:
            producer = connect.producer(self.config)
            try:
                await producer.start()
            except (KafkaError, OSError) as exc:
                with contextlib.suppress(KafkaError, OSError):
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
            self._producer = producer
            self._generation += 1
            return

    async def _retrying(self, action: Any) -> Any:
        backoff = Backoff(first=0.5, maximum=30.0)
        while True:
            try:
                return await action()
            except (KafkaError, OSError) as exc:
                delay = backoff.failed()
                log.warning("kafka: %s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    # -- the position in Kafka -------------------------------------------------------------

    def _record_state_in_kafka(self, position: BinlogPosition) -> None:
        if not self.config.state_topic or self._producer is None:
            return
        value = json.dumps(position.to_json()).encode()
        with contextlib.suppress(KafkaError, OSError):
            task = asyncio.ensure_future(self._producer.send(
                self.config.state_topic, value, key=self.state_key.encode(), partition=0))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._state_sent = task

    async def _read_state_topic(self) -> BinlogPosition | None:
        topic = self.config.state_topic
        await self._partition_count(topic)
        found: BinlogPosition | None = None
        consumer = connect.consumer(self.config)
        await consumer.start()
        try:
            from aiokafka import TopicPartition

            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, max(end - 1000, 0))
            # Up to the end offset, however slow the broker answers: a pause is not the end
            # (stopping at the first quiet second read an older position on a busy machine).
            async with asyncio.timeout(STATE_READ_TIMEOUT):
                while await consumer.position(tp) < end:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    for message in batch.get(tp, []):
                        if message.key == self.state_key.encode() and message.value:
                            found = BinlogPosition.from_json(json.loads(message.value))
        finally:
            await consumer.stop()
        return found


def _acknowledged(message: _Message) -> bool:
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
