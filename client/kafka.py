"""Reading the service's Kafka topics back as typed changes, in every message format.

    reader = KafkaChangeReader("kafka:9092", ["shop.orders"], format="databus")
    async for change in reader.changes(start="earliest"):
        print(change.action, change.gtid, change.after)

Values come back as the change stream's Python types (Decimal, datetime, bytes...): every
message names its table's schema in its ``schema`` header, and the reader reads the schemas
from the service's schema topic. :class:`KafkaDecoder` does the decoding without I/O.

The debezium format's values sent as Avro (``[kafka] value_format = "avro"``: Confluent's wire
format) are read with their schemas from the registry: give the reader
``schema_registry_url`` (the one the service registers with), or the decoder each schema
(:meth:`KafkaDecoder.add_avro_schema`).

A start position is ``"earliest"``, ``"latest"``, ``{partition: offset}`` (for every topic
read), or a GTID state (``"0-1-57"``): the changes of the transactions it does not cover, as
after a dump (the reader scans from the beginning and skips the others).
"""

from __future__ import annotations

import base64
import io
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from mariadb_cdc_client.format.dump import decode_value
from mariadb_cdc_client.format.extras import require
from mariadb_cdc_client.format.schema import Field, fields_from_schema, from_json_value
from mariadb_cdc_client.kafka_values import (
    databus_labels,
    fields_from_databus,
    from_debezium,
    from_text,
)

FORMATS = ("databus", "dip", "debezium", "maxscale")


@dataclass(frozen=True)
class KafkaChange:
    """One message, decoded. ``action`` is insert, update or delete for a row change
    (maxscale: the record's event type, so also update_before and update_after), or the
    statement's kind (create, alter, drop, rename, truncate, query) with ``sql`` set."""

    database: str
    table: str
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    sql: str | None
    gtid: str
    event_number: int
    topic: str = ""
    partition: int = 0
    offset: int = 0
    key: bytes = b""

    @property
    def is_statement(self) -> bool:
        return self.sql is not None


class KafkaDecoder:
    def __init__(self, format: str) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r} (one of {', '.join(FORMATS)})")
        self.format = format
        self.schemas: dict[str, tuple[Field, ...]] = {}
        self.avro_schemas: dict[int, Any] = {}  # registry id -> parsed Avro schema
        self._labels = False

    def add_avro_schema(self, schema_id: int, text: bytes | str) -> None:
        """The Avro schema the registry has under ``schema_id``, for values in Confluent's
        wire format."""
        import fastavro

        self.avro_schemas[schema_id] = fastavro.parse_schema(json.loads(text))

    @staticmethod
    def avro_schema_id(value: bytes) -> int | None:
        """The registry id of a value in Confluent's wire format (None: not one)."""
        if len(value) >= 5 and value[0] == 0:
            return int.from_bytes(value[1:5], "big")
        return None

    def add_schema(self, schema_id: str, text: bytes | str) -> None:
        schema = json.loads(text)
        self.schemas[schema_id] = tuple(fields_from_schema({"fields": schema["fields"]}))[6:]

    def decode(self, value: bytes | None, headers: dict[str, bytes], key: bytes = b"",
               topic: str = "", partition: int = 0, offset: int = 0) -> KafkaChange | None:
        """A message as one change; None for a message that is not one (a maxscale schema).
        A databus message holds a whole binlog row event: use :meth:`decode_all`."""
        changes = self.decode_all(value, headers, key, topic, partition, offset)
        return changes[0] if changes else None

    def decode_all(self, value: bytes | None, headers: dict[str, bytes], key: bytes = b"",
                   topic: str = "", partition: int = 0, offset: int = 0) -> list[KafkaChange]:
        """The changes a message holds, in order: one for most formats, every row of its
        binlog row event for databus (numbered from the ``event`` header on, an update's
        before and after counting two, as the change stream numbers records)."""
        if value is None:  # a tombstone (debezium, after a delete): no change of its own
            return []
        binary = self.format == "debezium" and value[:1] == b"\x00"
        # (binary: Avro in Confluent's wire format)
        doc = self._avro(value) if binary else json.loads(value, parse_float=Decimal)
        fields = self.schemas.get(headers.get("schema", b"").decode())
        gtid = headers.get("gtid", b"").decode()
        event = int(headers.get("event", b"0") or 0)
        self._labels = headers.get("values") == b"labels"  # databus: ENUM/SET as labels
        decoded = self._debezium(doc, fields, gtid, event, binary) if binary else \
            getattr(self, f"_{self.format}")(doc, fields, gtid, event)
        if decoded is None:
            return []
        changes = []
        for database, table, action, before, after, sql in (
                decoded if isinstance(decoded, list) else [decoded]):
            changes.append(KafkaChange(database, table, action, before, after, sql, gtid,
                                       event, topic, partition, offset, key))
            event += 2 if action == "update" else 1
        return changes

    # -- the formats ---------------------------------------------------------------------

    def _databus(self, doc: dict[str, Any], fields: tuple[Field, ...] | None, gtid: str,
                 event: int) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        table = doc.get("Table") or {}
        database, name = table.get("Schema", ""), table.get("Name", "")
        if "Query" in doc:
            sql = base64.b64decode(doc["Query"]).decode("utf-8")
            return database, name, doc["Action"], None, None, sql
        fields = fields or fields_from_databus(table)
        labels = [None if self._labels else databus_labels(c)
                  for c in table.get("Columns") or []]
        rows = [{f.column: None if v is None else decode_value(
                    f, label(base64.b64decode(v)) if label else base64.b64decode(v))
                 for f, v, label in zip(fields, row, labels or [None] * len(fields),
                                        strict=True)}
                for row in doc["Rows"]]
        action = doc["Action"]
        if action == "update":
            return [(database, name, action, rows[i], rows[i + 1], None)
                    for i in range(0, len(rows) - 1, 2)]
        return [(database, name, action, row if action == "delete" else None,
                 row if action == "insert" else None, None) for row in rows]

    def _dip(self, doc: dict[str, Any], fields: tuple[Field, ...] | None, gtid: str,
             event: int) -> tuple[Any, ...]:
        if doc.get("isDdl"):
            kinds = {"CREATE": "create", "ALTER": "alter", "ERASE": "drop", "RENAME": "rename",
                     "TRUNCATE": "truncate"}
            return (doc["database"], doc["table"], kinds.get(doc["type"], "query"), None, None,
                    doc["sql"])
        action = {"I": "insert", "U": "update", "D": "delete"}[doc["TYPE"]]
        by_name = {f.column: f for f in fields or ()}

        def typed(values: dict[str, Any] | None) -> dict[str, Any] | None:
            if values is None:
                return None
            return {c: from_text(by_name.get(c), v) for c, v in values.items()}

        return (doc["DATABASE"], doc["TABLE"], action, typed(doc["OLD_VALUES"]),
                typed(doc["NEW_VALUES"]), None)

    def _avro(self, value: bytes) -> Any:
        import fastavro

        schema_id = self.avro_schema_id(value)
        assert schema_id is not None
        schema = self.avro_schemas.get(schema_id)
        if schema is None:
            raise LookupError(f"an Avro value with the registry's schema {schema_id}, which "
                              "this decoder was not given (KafkaChangeReader: give it "
                              "schema_registry_url)")
        return fastavro.schemaless_reader(io.BytesIO(memoryview(value)[5:]), schema, None)

    def _debezium(self, doc: dict[str, Any], fields: tuple[Field, ...] | None, gtid: str,
                  event: int, binary: bool = False) -> tuple[Any, ...] | None:
        """``binary``: decoded from Avro (bytes as they are, names adjusted for Avro)."""
        if "payload" in doc and "schema" in doc:  # written with its Connect schema
            doc = doc["payload"]
        source = doc.get("source", {})
        if "ddl" in doc:
            change = (doc.get("tableChanges") or [{}])[0]
            return (source.get("db", ""), source.get("table") or "",
                    str(change.get("type", "query")).lower(), None, None, doc["ddl"])
        if doc["op"] == "t":  # a TRUNCATE event: its schema change event reports it
            return None
        action = {"c": "insert", "u": "update", "d": "delete", "r": "insert"}[doc["op"]]
        by_name = {f.column: f for f in fields or ()}
        if binary:  # Avro field names back to the columns'; bytes in base64 as in JSON
            columns = {_avro_name(f.column): f.column for f in fields or ()}
            doc = {**doc, "before": _from_avro(doc["before"], columns),
                   "after": _from_avro(doc["after"], columns)}

        def typed(values: dict[str, Any] | None) -> dict[str, Any] | None:
            if values is None:
                return None
            return {c: from_debezium(by_name.get(c), v) for c, v in values.items()}

        return (source.get("db", ""), source.get("table", ""), action, typed(doc["before"]),
                typed(doc["after"]), None)

    def _maxscale(self, doc: dict[str, Any], fields: tuple[Field, ...] | None, gtid: str,
                  event: int) -> tuple[Any, ...] | None:
        if "event_type" not in doc:
            return None  # a schema message
        kinds = {f.name: f.kind for f in fields or ()}
        meta = ("domain", "server_id", "sequence", "event_number", "timestamp", "event_type",
                "table_schema", "table_name")
        values = {k: from_json_value(kinds[k], v) if k in kinds else v
                  for k, v in doc.items() if k not in meta}
        if fields is not None:  # column names, not Avro field names
            names = {f.name: f.column for f in fields}
            values = {names.get(k, k): v for k, v in values.items()}
        kind = doc["event_type"]
        before = values if kind in ("update_before", "delete") else None
        after = values if kind in ("update_after", "insert") else None
        return doc["table_schema"], doc["table_name"], kind, before, after, None


class KafkaChangeReader:
    """Consume topics (aiokafka) and decode their messages."""

    def __init__(self, bootstrap: str, topics: list[str], *, format: str = "databus",
                 schema_topic: str = "cdcserver-schemas", schema_registry_url: str = "",
                 **consumer_options: Any) -> None:
        """``schema_registry_url``: where the schemas of Avro values are (Confluent's REST
        API, as the service's ``[kafka] schema_registry_url``)."""
        require("kafka", "KafkaChangeReader")
        self.schema_registry_url = schema_registry_url.rstrip("/")
        self.bootstrap = bootstrap
        self.topics = topics
        self.decoder = KafkaDecoder(format)
        self.schema_topic = schema_topic
        self.options = consumer_options
        self._looked_for: set[str] = set()  # schema ids not found by a reload
        # Statements are written to every partition of their topic, to stay in order with
        # each partition's rows: the ones already yielded, so each is yielded once.
        self._statements: OrderedDict[tuple[object, ...], None] = OrderedDict()

    def _consumer(self) -> Any:
        from aiokafka import AIOKafkaConsumer

        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap.split(","),
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                **self.options)

    async def load_schemas(self) -> None:
        """Read the schema topic to its end."""
        if not self.schema_topic:
            return
        from aiokafka import TopicPartition

        consumer = self._consumer()
        await consumer.start()
        try:
            known = await _partitions(consumer)
            if self.schema_topic not in known:
                return
            tps = [TopicPartition(self.schema_topic, p)
                   for p in sorted(known[self.schema_topic])]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            # to the end offsets, however slowly the broker answers (a quiet moment is not
            # the end)
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                batch = await consumer.getmany(*tps, timeout_ms=500)
                for messages in batch.values():
                    for m in messages:
                        if m.key and m.value:
                            self.decoder.add_schema(m.key.decode(), m.value)
        finally:
            await consumer.stop()

    async def changes(self, start: str | dict[int, int] = "earliest",
                      idle_timeout: float | None = None, to_end: bool = False
                      ) -> AsyncIterator[KafkaChange]:
        """The topics' changes from ``start``; with ``idle_timeout``, until nothing arrived
        for that many seconds; with ``to_end``, until the end offsets the topics had when the
        read began (a ``read_committed`` reader's last stable offsets), however slowly the
        broker answers: a quiet moment is not the end."""
        from aiokafka import TopicPartition

        from mariadb_cdc_client.format.gtid import is_gtid_state

        await self.load_schemas()
        skip: Callable[[str], bool] = lambda gtid: False  # noqa: E731
        if isinstance(start, str) and is_gtid_state(start):
            skip = _covered_by(start)
            start = "earliest"
        consumer = self._consumer()
        await consumer.start()
        try:
            known = await _partitions(consumer)
            tps = []
            for topic in self.topics:
                if topic not in known:
                    raise LookupError(f"no topic {topic!r} on {self.bootstrap}")
                tps += [TopicPartition(topic, p) for p in sorted(known[topic])]
            consumer.assign(tps)
            if start == "latest":
                await consumer.seek_to_end(*tps)
            elif isinstance(start, dict):
                for tp in tps:
                    consumer.seek(tp, start.get(tp.partition, 0))
            else:
                await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps) if to_end else None
            while True:
                if ends is not None and \
                        all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                    return
                batch = await consumer.getmany(timeout_ms=int((idle_timeout or 1) * 1000))
                if not any(batch.values()):
                    if idle_timeout is not None:
                        return
                    continue
                for tp, messages in batch.items():
                    for m in messages:
                        headers = {k: v for k, v in m.headers or ()}
                        schema = headers.get("schema", b"").decode()
                        if schema and schema not in self.decoder.schemas \
                                and schema not in self._looked_for:
                            await self.load_schemas()  # published after we started
                            self._looked_for.add(schema)
                        if skip(headers.get("gtid", b"").decode()):
                            continue
                        avro_id = self.decoder.avro_schema_id(m.value or b"")
                        if avro_id is not None and avro_id not in self.decoder.avro_schemas:
                            await self._fetch_avro_schema(avro_id)
                        for change in self.decoder.decode_all(
                                m.value, headers, m.key or b"", tp.topic, tp.partition,
                                m.offset):
                            if change.sql is None or self._first_copy(change):
                                yield change
        finally:
            await consumer.stop()


    async def _fetch_avro_schema(self, schema_id: int) -> None:
        """The registry's schema ``schema_id`` (``GET /schemas/ids/<id>``) to the decoder."""
        if not self.schema_registry_url:
            return  # the decoder says what is missing
        import aiohttp

        url = f"{self.schema_registry_url}/schemas/ids/{schema_id}"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            if response.status != 200:
                raise LookupError(f"{url}: {response.status} {await response.text()}")
            self.decoder.add_avro_schema(schema_id, (await response.json(
                content_type=None))["schema"])

    def _first_copy(self, change: KafkaChange) -> bool:
        """Whether this statement message is the first of its copies (one per partition)."""
        assert change.sql is not None
        # its transaction and event number tell a copy from the same statement run again
        identity = (change.topic, change.key, change.gtid, change.event_number, change.database,
                    change.table, change.sql)
        if identity in self._statements:
            return False
        self._statements[identity] = None
        if len(self._statements) > _STATEMENTS_REMEMBERED:
            self._statements.popitem(last=False)
        return True


def _avro_name(name: str) -> str:
    """A column's name as the Avro schema has it (the service's ``avro_name``)."""
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name) \
        or "_"
    return "_" + name if name[0].isdigit() else name


def _from_avro(values: dict[str, Any] | None, columns: dict[str, str]
               ) -> dict[str, Any] | None:
    """A row decoded from Avro as its JSON form has it (the names of the columns, binary
    values in base64), for :func:`from_debezium`."""
    if values is None:
        return None
    out = {}
    for name, v in values.items():
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        elif isinstance(v, dict) and isinstance(v.get("wkb"), bytes):  # geometry
            v = {**v, "wkb": base64.b64encode(v["wkb"]).decode()}
        out[columns.get(name, name)] = v
    return out


_STATEMENTS_REMEMBERED = 65536  # statements are rare: far more than partitions ever lag by


async def _partitions(consumer: Any) -> dict[str, set[int]]:
    """Every topic of the cluster and its partitions, from metadata fetched now.

    Not ``consumer.partitions_for_topic``: that answers from the consumer's own metadata,
    which holds only the topics it was given, and none before (its bootstrap asks for no
    topic: Apache Kafka answers with none, where brokers that ignore the empty list gave
    every topic). ``consumer.topics()`` fetches every topic's metadata but keeps only the
    names."""
    cluster = await consumer._client.fetch_all_metadata()
    return {topic: set(cluster.partitions_for_topic(topic) or ()) for topic in
            cluster.topics()}


def _covered_by(state: str) -> Callable[[str], bool]:
    last: dict[str, int] = {}
    for item in state.split(","):
        if ":" in item:  # MySQL uuid:1-N
            uuid, _, numbers = item.partition(":")
            last[uuid] = int(numbers.rsplit("-", 1)[-1])
        else:
            domain, _, seq = item.rpartition("-")
            last[domain.split("-")[0]] = int(seq)

    def covered(gtid: str) -> bool:
        if not gtid:
            return False
        if ":" in gtid:
            uuid, _, seq = gtid.partition(":")
            return uuid in last and int(seq) <= last[uuid]
        domain, _, rest = gtid.partition("-")
        return domain in last and int(rest.rsplit("-", 1)[-1]) <= last[domain]

    return covered
