"""What every message format shares: the key styles, the topics a format defaults to, and
the compact JSON they are written in. The formats themselves: :mod:`cdcserver.messages.databus`
(shared by the Kafka sink and the databus dump layout) and :mod:`cdcserver.messages.formats`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

import orjson

from cdcserver.messages.events import RowBatch, RowEvent, StatementEvent, TableShape
from mariadb_cdc_client.format.dump import value_encoder
from mariadb_cdc_client.format.schema import Field, Kind, to_json_text

# (database, table, GTID) -> the table version current right after that transaction
VersionLookup = Callable[[str, str, str], int | None]

Message = tuple[bytes, bytes]  # key, value
RowMessage = tuple[bytes, bytes, int]  # key, value, the event_number of its first record


class RoutedRow(NamedTuple):
    """A row change's message with what routes it: ``row``, the image whose key picks its
    partition (None: the change's, both keys' for an update that changed the key), and
    headers of its own. ``value`` None is a tombstone."""

    key: bytes
    value: bytes | None
    event: int
    row: tuple[Any, ...] | None = None
    headers: tuple[tuple[str, bytes], ...] = ()



def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (orjson: the standard library's encoder took a third of the sink's
    time in bench/bench_kafka.py, mostly building an encoder per call)."""
    return orjson.dumps(value)


def position_key(action: str, file: str, pos: int, gtid: str, event: int) -> bytes:
    return dumps({"Pos": {"Name": file, "Pos": pos}, "Action": action, "GTID": gtid,
                  "Event": event})


def primary_key(shape: TableShape, row: tuple[Any, ...]) -> bytes:
    """The row's primary key as a JSON object (every column for a table without one). The
    Kafka sink asks twice for each row (its partition, then its message's key): the last
    row's key is kept with the shape (with the row itself, so the identity cannot be
    another row's)."""
    last = shape.cache.get("key.last")
    if last is not None and last[0] is row:
        return last[1]
    make = shape.cache.get("key.maker")
    if make is None:
        make = shape.cache["key.maker"] = _key_maker(shape)
    key: bytes = make(row)
    shape.cache["key.last"] = (row, key)
    return key


def _key_maker(shape: TableShape) -> Callable[[tuple[Any, ...]], bytes]:
    """:func:`primary_key` for one table shape: the names' JSON made once, an int's digits
    without ``to_json_text``'s dispatch."""
    fields = shape.fields
    columns = shape.primary_key or tuple(range(len(fields)))
    parts = [(i, json.dumps(fields[i].column, ensure_ascii=False).encode("utf-8") + b":",
              _key_value(fields[i])) for i in columns]
    if len(parts) == 1:
        (at, name, value), = parts
        return lambda row: b"{" + name + value(row[at]) + b"}"
    return lambda row: b"{" + b",".join([name + value(row[i]) for i, name, value in parts]) \
        + b"}"


def _key_value(f: Field) -> Callable[[Any], bytes]:
    kind, fsp = f.kind, f.fsp
    if kind in (Kind.INT, Kind.LONG):
        return lambda v: b"%d" % v if type(v) is int else \
            to_json_text(kind, v, fsp).encode("utf-8")
    return lambda v: to_json_text(kind, v, fsp).encode("utf-8")


def text_form(f: Field) -> Callable[[Any], str]:
    """A value's MariaDB text form (binary data as hex), for one column, chosen once."""
    kind = f.kind
    if kind == Kind.BYTES:
        return lambda v: bytes(v).hex()
    encode = value_encoder(f)

    def general(v: Any) -> str:
        return encode(v).decode("utf-8")

    # The common types without the bytes in between (the same text: tests/unit/
    # test_message_values.py compares them with the general path).
    if kind in (Kind.INT, Kind.LONG):
        return lambda v: str(v) if type(v) is int else general(v)
    if kind in (Kind.STRING, Kind.ENUM):
        return lambda v: v if type(v) is str and v.isascii() else general(v)
    if kind == Kind.DOUBLE:
        return lambda v: repr(v) if type(v) is float else general(v)
    if kind == Kind.DECIMAL:
        return lambda v: format(v, "f") if type(v) is Decimal else general(v)
    spec = {0: "seconds", 3: "milliseconds", 6: "microseconds"}.get(f.fsp)
    if kind == Kind.DATETIME and spec is not None:
        return lambda v: (v.isoformat(" ", spec)
                          if type(v) is dt.datetime and v.tzinfo is None else general(v))
    return general


class MessageFormat:
    name = ""

    default_key = "position"  # what key = "auto" means for this format
    default_topic = "{db}.{table}"  # what topic = "auto" means
    default_ddl_topic = "{db}"  # ... and ddl_topic = "auto" ("auto": the one topic)

    @staticmethod
    def default_ddl_topic_for(topic: str) -> str:
        """Where statements that name no table go when the format sends them to its one
        topic but ``topic`` names a table: the topic with its table part left out
        (``cdc.{db}.{table}`` -> ``cdc.{db}``), never a topic literally named ``{table}``."""
        cut = topic.replace(".{table}", "").replace("_{table}", "").replace("-{table}", "")
        return cut.replace("{table}", "") or "{db}"
    default_partitions = 3  # ... and partitions = 0
    # A topic all of the format's schema statements go to (partition 0), instead of the
    # tables' topics; "" for the tables' topics.
    statement_topic = ""

    def __init__(self, key: str = "auto", zone: dt.tzinfo = dt.UTC,
                 source_name: str = "cdcserver", flavor: str = "mariadb",
                 key_schema: bool = False, labels: bool = False, value_schema: bool = False,
                 tombstones: bool = True, truncate_events: bool = False) -> None:
        self.key_style = self.default_key if key == "auto" else key
        self.key_schema = key_schema
        # debezium: values with their Connect schema, a tombstone after each delete, and
        # TRUNCATE TABLE as a change event ([kafka] value_schema, tombstones, truncate_events)
        self.value_schema = value_schema
        self.tombstones = tombstones
        self.truncate_events = truncate_events
        self.labels = labels  # databus: ENUM/SET labels instead of index/bitmask
        self.zone = zone
        self.source_name = source_name
        self.flavor = flavor
        # The Avro store's version number of a table's schema created by a GTID, when the
        # store made one (set by the service; the maxscale format's schema says it).
        self.version_of: VersionLookup = lambda db, table, gtid: None

    # True: one message per binlog row event (``row_event``), else per row (``rows``).
    per_row_event = False

    def rows(self, e: RowEvent) -> list[RowMessage]:
        return [(self.row_key(e), self.row_value(e), e.event_number)]

    def routed_rows(self, e: RowEvent) -> list[RoutedRow]:
        """:meth:`rows` with what routes each message (a format whose messages of one change
        go to different keys says which image each one is keyed by)."""
        return [RoutedRow(key, value, event) for key, value, event in self.rows(e)]

    def row_event(self, batch: RowBatch) -> RowMessage:
        raise NotImplementedError

    def row_key(self, e: RowEvent) -> bytes:
        if self.key_style == "primary-key":
            row = e.after if e.after is not None else e.before
            assert row is not None
            return primary_key(e.shape, row)
        return position_key(e.action, e.file, e.pos, e.gtid_text, e.event_number)

    def row_value(self, e: RowEvent) -> bytes:
        raise NotImplementedError

    def statement(self, e: StatementEvent) -> Message | None:
        raise NotImplementedError

    def statement_rows(self, e: StatementEvent) -> list[tuple[bytes | None, bytes]]:
        """Messages a statement also sends to its table's topic, as a change of its rows
        (the debezium format's TRUNCATE event): key (None: none) and value."""
        return []

    def statement_key(self, e: StatementEvent, action: str) -> bytes:
        return position_key(action, e.file, e.pos, str(e.gtid), 0)
