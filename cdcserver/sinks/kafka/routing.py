"""The Kafka sink's routing: each change made into messages, each message to its topic and
partition, with its headers.

A row change goes to its table's topic (``topic`` template), to the partition its primary key
hashes to (see :func:`.rowmessages.partition`), so each row's changes stay in order; an update
that changes the key goes to both keys' partitions. A schema statement goes to every
partition of the table's topic, so it is in order with every row's changes; a statement that
changes no table goes to ``ddl_topic``. A topic name holding characters Kafka does not allow
(``[A-Za-z0-9._-]``, 249 at most), as a table named in any other script would give, is made
legal by :func:`legal_topic`. Every message carries the headers ``gtid``, ``event`` (the
record's ``event_number``) and ``schema`` (the id of the table's schema on ``schema_topic``,
which clients read to type the values); a databus message sent with ``databus_labels`` also
``values: labels``. Missing topics are created here, as they are first used.

The router sits above the sender (:mod:`cdcserver.sinks.kafka.sender`): it hands it every
message in order, and the end of every transaction, and waits while the sender has no room.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zlib
import zoneinfo
from collections.abc import Callable
from typing import Any

from cdcserver.core.capture import TableSelection
from cdcserver.core.changes import Change, Ddl, Rows
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.names import TableName
from cdcserver.messages.base import MessageFormat, VersionLookup
from cdcserver.messages.connect_avro import envelope_schema, key_names, key_schema
from cdcserver.messages.events import (
    AbortEvent,
    CommitEvent,
    EventBuilder,
    RowBatch,
    RowEvent,
    StatementEvent,
    TableShape,
)
from cdcserver.messages.formats import FORMATS, Debezium
from cdcserver.sinks.kafka.accumulator import Message
from cdcserver.sinks.kafka.dumpevents import DumpEvents
from cdcserver.sinks.kafka.metrics import SinkStats
from cdcserver.sinks.kafka.registry import AvroEncoder, Registry, record_name, subject
from cdcserver.sinks.kafka.rowmessages import message_headers, row_messages
from cdcserver.sinks.kafka.sender import Sender, retrying
from cdcserver.sinks.kafka.snapshotworker import FormatJob, FormattingProcess
from cdcserver.sinks.kafka.topics import TopicCreator

log = logging.getLogger("cdcserver.sinks.kafka.sink")  # operators grep for it

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


def _encode_value(shape: TableShape, record: dict[str, Any]) -> bytes:
    """A change event in Confluent's wire format, with its shape's registered schema
    (:meth:`Router._avro_ready` made the encoders first)."""
    encoder: AvroEncoder = shape.cache["kafka.avro"][0]
    return encoder.encode(record)


def _encode_key(shape: TableShape, image: dict[str, Any]) -> bytes:
    """A row image's key in Confluent's wire format."""
    _, encoder, names = shape.cache["kafka.avro"]
    return encoder.encode({n: image[n] for n in names})


class Router:
    def __init__(self, config: KafkaConfig, sender: Sender, stats: SinkStats,
                 versions: VersionLookup | None = None) -> None:
        """``versions`` numbers the table versions in messages as the Avro store created
        them."""
        self.config = config
        self.sender = sender
        self.stats = stats
        self.topics = TopicCreator(config)
        zone = zoneinfo.ZoneInfo(config.time_zone)  # checked when the configuration loaded
        # (the zone by its name: the snapshot's formatting process makes the same format)
        self.format_options: dict[str, Any] = {
            "key": config.key, "zone": config.time_zone, "source_name": config.client_id,
            "key_schema": config.key_schema, "labels": config.databus_labels,
            "value_schema": config.value_schema, "tombstones": config.tombstones,
            "truncate_events": config.truncate_events}
        self.format: MessageFormat = FORMATS[config.format](**{**self.format_options,
                                                               "zone": zone})
        fmt = self.format
        self.topic = fmt.default_topic if config.topic == "auto" else config.topic
        self.ddl_topic = fmt.default_ddl_topic if config.ddl_topic == "auto" \
            else config.ddl_topic
        if self.ddl_topic == "auto":  # the format's one topic, or its database's part
            self.ddl_topic = self.topic if "{table}" not in self.topic else \
                fmt.default_ddl_topic_for(self.topic)
        self.partitions = config.partitions or fmt.default_partitions
        if versions is not None:
            self.format.version_of = versions
        self.builder = EventBuilder()
        self.tables = TableSelection.parse(config.include, config.exclude, "kafka")
        self._partitions: dict[str, int] = {}
        # value_format = "avro" (the debezium format, as the configuration checks)
        self.registry = Registry(config) if config.avro else None
        if self.registry is not None:
            assert isinstance(fmt, Debezium)
            fmt.encode_value = _encode_value
            if config.key_format == "avro":
                fmt.encode_key = _encode_key

    def _publishes(self, change: Change) -> bool:
        """``[kafka] include``/``exclude``: rows and statements of the tables selected (a
        statement naming no table, CREATE DATABASE, goes as before)."""
        if isinstance(change, Rows):
            return self.tables.selects(TableName(change.layout.database, change.layout.table))
        if isinstance(change, Ddl) and change.changes:
            return any(self.tables.selects(TableName(c.database, c.table))
                       for c in change.changes)
        return True

    async def route(self, changes: list[Change]) -> None:
        """Every message of ``changes`` to the sender, in order, and each transaction's end."""
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
                self.sender.end_transaction(event.position)
                await self.sender.at_boundary()
            elif isinstance(event, AbortEvent):
                await self.sender.abandoned(event)

    async def snapshot_rows(self, rows: list[RowEvent]) -> None:
        """Rows of a table's initial snapshot (one table's, in order): to the topic and
        partitions its changes go to, as the format sends an insert (a format with a
        message per row event: one message for them all)."""
        if self.format.per_row_event:
            await self._row_event(RowBatch(tuple(rows)))
            return
        for row in rows:
            await self._row(row)

    async def snapshot_dump(self, dump: DumpEvents, path: str,
                            read: Callable[[int], None]) -> int | None:
        """A big table's snapshot rows (``dump``, from the file at ``path``) made into
        messages by a process of their own (:mod:`.snapshotworker`) and sent from here, in
        order; how many rows (``read`` is told as they go). None: the format makes its
        messages here (Avro with a registry, a message per row event)."""
        if self.format.per_row_event or self.registry is not None or \
                self.config.key_format == "avro":
            return None
        shape = dump.shape
        topic, count, schema = await self._route(shape)
        job = FormatJob(path, shape.table.database, shape.table.table, dump.first_table,
                        dump.last_table, self.config.format, self.format_options,
                        self.format.flavor, count, schema.decode())
        log.info("kafka: the snapshot of %s formatted by a process of its own (%d rows)",
                 shape.table, dump.total)
        rows = 0
        async with FormattingProcess(job) as formatting:
            while (part := await formatting.next_part()) is not None:
                rows, messages = part
                for partition, key, value, headers in messages:
                    await self.sender.hold(Message(topic, partition, key, value, headers))
                read(rows)
        return rows

    async def partition_count(self, topic: str) -> int:
        """The topic's partitions (the topic created first, with ``create_topics``)."""
        count = self._partitions.get(topic)
        if count is None:
            if self.config.create_topics:
                await retrying(lambda: self.topics.create([topic], self.partitions))
            partitions = await retrying(lambda: self.sender.partitions_for(topic))
            count = self._partitions[topic] = len(partitions)
            self.stats.topics.add(topic)
        return count

    # -- messages --------------------------------------------------------------------------

    async def _row(self, e: RowEvent) -> None:
        shape = e.shape
        topic, count, schema = await self._route(shape)
        if self.registry is not None and "kafka.avro" not in shape.cache:
            await self._avro_ready(shape, topic)
        for partition, key, value, headers in row_messages(
                self.format, e, count, schema, self.config.key_format == "avro"):
            await self.sender.hold(Message(topic, partition, key, value, headers))

    async def _avro_ready(self, shape: TableShape, topic: str) -> None:
        """The table shape's Avro schemas registered (the value's, and the key's with
        ``key_format = "avro"``) and their encoders kept with it, which the format's
        ``encode_value``/``encode_key`` use."""
        assert self.registry is not None
        fmt, strategy, what = self.format, self.config.subject_name_strategy, str(shape.table)
        value = envelope_schema(shape, fmt.source_name, fmt.flavor)
        value_id = await self.registry.id(subject(strategy, topic, record_name(value)), value,
                                          what)
        keys: AvroEncoder | None = None
        if self.config.key_format == "avro":
            key = key_schema(shape, fmt.source_name)
            key_id = await self.registry.id(
                subject(strategy, topic, record_name(key), key=True), key,
                f"{what} (its key)")
            keys = AvroEncoder(key_id, key)
        shape.cache["kafka.avro"] = (AvroEncoder(value_id, value), keys, key_names(shape))

    async def _row_event(self, batch: RowBatch) -> None:
        """One message for a whole binlog row event (the databus format). Its rows may hash
        to different partitions, so a table's row events all go to one partition (the CRC-32
        of its name), which keeps every row's changes in order. A message larger than
        ``max_message_bytes`` (a statement that changed many rows can make one row event of
        megabytes) is sent as two, each with half the rows, again until each fits: brokers
        refuse a message over their ``message.max.bytes``."""
        if not batch.rows:
            return
        first = batch.rows[0]
        topic, count, schema = await self._route(first.shape)
        partition = zlib.crc32(str(first.shape.table).encode()) % count
        for key, value, event in self._fitting(batch):
            headers = message_headers(first.gtid_text.encode(), event, schema)
            if self.format.labels:  # ENUM and SET values are labels, not indexes and bitmasks
                headers.append(("values", b"labels"))
            await self.sender.hold(Message(topic, partition, key, value, headers))

    def _fitting(self, batch: RowBatch) -> list[tuple[bytes, bytes, int]]:
        """``batch``'s message, or its halves' messages when it is too large."""
        message = self.format.row_event(batch)
        if len(message[1]) <= self.config.max_message_bytes or len(batch.rows) == 1:
            return [message]
        half = len(batch.rows) // 2
        return [*self._fitting(RowBatch(batch.rows[:half])),
                *self._fitting(RowBatch(batch.rows[half:]))]

    async def _statement(self, e: StatementEvent) -> None:
        message = self.format.statement(e)
        if message is None:
            return
        key, value = message
        schema = await self._schema(e.shape) if e.shape is not None else ""
        headers = message_headers(str(e.gtid).encode(), 0, schema.encode())  # once per statement
        if self.format.statement_topic:  # the format's schema-change topic, once
            await self._to_first_partition(self.format.statement_topic, key, value, headers)
        elif e.table is None:
            topic = legal_topic(self.ddl_topic.replace("{db}", e.database))
            await self._to_first_partition(topic, key, value, headers)
        else:
            topic = self._topic(e.database, e.table)
            for partition in range(await self.partition_count(topic)):
                await self.sender.hold(Message(topic, partition, key, value, headers))
        if e.table is not None:  # the debezium format's TRUNCATE event: once, as Debezium
            if self.registry is not None and self.format.truncate_events and \
                    e.shape is not None and "kafka.avro" not in e.shape.cache:
                await self._avro_ready(e.shape, self._topic(e.database, e.table))
            for row_key, row_value in self.format.statement_rows(e):
                await self._to_first_partition(self._topic(e.database, e.table), row_key,
                                               row_value, headers)

    async def _to_first_partition(self, topic: str, key: bytes | None, value: bytes,
                                  headers: list[tuple[str, bytes]]) -> None:
        await self.partition_count(topic)
        await self.sender.hold(Message(topic, 0, key, value, headers))

    # -- topics, partitions, schemas -------------------------------------------------------

    async def _route(self, shape: TableShape) -> tuple[str, int, bytes]:
        route: tuple[str, int, bytes] | None = shape.cache.get("kafka.route")
        if route is None:
            topic = self._topic(shape.table.database, shape.table.table)
            route = shape.cache["kafka.route"] = (
                topic, await self.partition_count(topic), (await self._schema(shape)).encode())
        return route

    def _topic(self, database: str, table: str) -> str:
        return legal_topic(self.topic.replace("{db}", database).replace("{table}", table))

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
            await self._to_first_partition(self.config.schema_topic, schema_id.encode(),
                                           text.encode(), [])
        shape.cache["kafka.schema_id"] = schema_id
        return schema_id
