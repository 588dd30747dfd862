"""Kafka message formats: what a row change or a schema statement looks like on a topic.

``cdcserver/sinks/kafka/README.md`` shows an example of each. In short:

- ``databus`` (the user's mysql-databus transfer format): the value is the RowsEvent
  ``{"Table": {...}, "Action": ..., "Rows": [[...]]}`` with every column value base64-encoded
  before JSON (an update's rows are its before/after pair), or the QueryEvent
  ``{"Table": ..., "Action": ..., "Query": base64(sql)}`` for a schema statement.
- ``dip`` (a data platform's "official format one"): DML as ``BINLOG_NAME``, ``BINLOG_POS``,
  ``DATABASE``, ``TABLE``, ``TYPE`` I/U/D, ``NEW_VALUES``/``OLD_VALUES`` (values as strings),
  ``GLOBAL_ID`` (the GTID), ``TIME``; DDL in Canal's JSON (``type`` CREATE/ALTER/ERASE/...).
- ``debezium``: the Debezium envelope (``before``, ``after``, ``source``, ``op``, ``ts_ms``) as
  its JsonConverter writes it without schemas, values in Debezium's default encodings except
  DECIMAL as a string.
- ``maxscale``: MaxScale KafkaCDC's compact JSON record, one message per record, keyed
  ``domain-server-sequence:event_number``; schema statements send the table's Avro schema.

``databus`` and ``dip`` are keyed by position (the user's KafkaKey): ``{"Pos": {"Name":
binlog file, "Pos": ...}, "Action": ..., "GTID": ..., "Event": ...}``, ``Pos`` the start of
the change's transaction for ``databus`` (``Action`` DML or DDL), the end of its event for
``dip``; ``GTID`` and ``Event`` (the record's ``event_number``) make each key unique to one
message, so a redelivered message is recognised by its key. ``debezium`` is keyed by the
row's primary key (``key = "primary-key"``, which any format can take), ``maxscale`` as
KafkaCDC keys.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson

from cdcserver.messages import connect_schema
from cdcserver.messages.base import (
    Message,
    MessageFormat,
    RoutedRow,
    RowMessage,
    dumps,
    primary_key,
    text_form,
)
from cdcserver.messages.connect_avro import avro_name
from cdcserver.messages.databus import Databus
from cdcserver.messages.events import RowEvent, StatementEvent, TableShape
from mariadb_cdc_client.format.schema import Field, Kind, float32_text, to_json_text

_CANAL_TYPES = {"create": "CREATE", "alter": "ALTER", "drop": "ERASE", "rename": "RENAME",
                "truncate": "TRUNCATE"}


class Dip(MessageFormat):
    name = "dip"
    _TYPES = {"insert": "I", "update": "U", "delete": "D"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._when: dict[int, str] = {}  # binlog timestamp -> TIME

    def _values(self, e: RowEvent, row: tuple[Any, ...] | None) -> dict[str, str | None] | None:
        if row is None:
            return None
        columns = e.shape.cache.get("dip.columns")
        if columns is None:
            columns = e.shape.cache["dip.columns"] = [(f.column, text_form(f))
                                                      for f in e.shape.fields]
        return {name: None if v is None else text(v)
                for (name, text), v in zip(columns, row)}  # noqa: B905

    def row_value(self, e: RowEvent) -> bytes:
        when = self._when.get(e.timestamp)
        if when is None:  # a transaction's rows share their timestamp
            if len(self._when) > 1024:
                self._when.clear()
            when = self._when[e.timestamp] = dt.datetime.fromtimestamp(
                e.timestamp, self.zone).strftime("%Y%m%d%H%M%S")
        # BINLOG_POS: where the transaction starts (its GTID event), as the seed's 154 on a
        # fresh binlog is.
        return dumps({"BINLOG_NAME": e.file, "BINLOG_POS": e.transaction_start,
                      "DATABASE": e.table.database, "EVENT_SERVER_ID": None,
                      "GLOBAL_ID": e.gtid_text, "GROUP_ID": None,
                      "NEW_VALUES": self._values(e, e.after),
                      "OLD_VALUES": self._values(e, e.before), "TABLE": e.table.table,
                      "TIME": when, "TYPE": self._TYPES[e.action]})

    def statement(self, e: StatementEvent) -> Message:
        kind = _CANAL_TYPES.get(e.kind, "QUERY") if e.table is not None else "QUERY"
        # es and ts: the statement's binlog time in seconds, equal, as in most of the seed's
        # examples (its RENAME example has milliseconds; the sink's README.md says why seconds).
        value = dumps({"data": None, "database": e.database, "es": e.timestamp, "id": 0,
                       "isDdl": True, "mysqlType": None, "old": None, "pkNames": None,
                       "sql": _without_server_comment(e.sql), "sqlType": None,
                       "table": e.table or "",
                       "ts": e.timestamp, "type": kind})
        return self.statement_key(e, e.kind), value


_SERVER_COMMENT = " /* generated by server */"


def _without_server_comment(sql: str) -> str:
    """The statement as the client sent it: the server appends this comment to the DROP
    TABLE it logs, which the data platform's messages do not show."""
    return sql[: -len(_SERVER_COMMENT)] if sql.endswith(_SERVER_COMMENT) else sql


# -- debezium -------------------------------------------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1)


def _debezium_converter(f: Field, binary: bool = False) -> Callable[[Any], Any]:
    """A column's value as Debezium's JSON has it; ``binary``: as its Avro has it (bytes
    as they are, not base64)."""
    k = f.kind
    if k == Kind.DECIMAL:
        if f.real_type == "decimal":
            return lambda v: format(v, "f")
        return _as_int64  # BIGINT UNSIGNED, BIT(64)
    if k == Kind.FLOAT:
        return lambda v: float(float32_text(v))
    if k == Kind.BYTES:
        # a geometry's SRID 0 (none given) is null, as Debezium's BinlogGeometry gives it
        if binary:
            if f.real_type == "geometry":
                return lambda v: {"wkb": bytes(v[4:]),
                                  "srid": int.from_bytes(v[:4], "little") or None}
            return bytes
        if f.real_type == "geometry":
            return lambda v: {"wkb": base64.b64encode(v[4:]).decode(),
                              "srid": int.from_bytes(v[:4], "little") or None}
        return lambda v: base64.b64encode(v).decode()
    if k == Kind.DATE:
        return lambda v: None if isinstance(v, str) else (v - _EPOCH.date()).days
    if k == Kind.DATETIME:
        scale = 1000 if f.fsp <= 3 else 1  # io.debezium.time.Timestamp / MicroTimestamp
        return lambda v: None if isinstance(v, str) else (
            (v - _EPOCH) // dt.timedelta(microseconds=1)) // scale
    if k == Kind.TIMESTAMP:
        return _zoned_timestamp(f.fsp)
    if k == Kind.TIME:
        return lambda v: v // dt.timedelta(microseconds=1)
    if k == Kind.UUID:
        return str
    if k == Kind.BOOLEAN:  # BIT(1): the row holds the bit as an int
        return bool
    return _same


def _zoned_timestamp(fsp: int) -> Callable[[Any], Any]:
    """A TIMESTAMP as io.debezium.time.ZonedTimestamp: UTC, ISO 8601, the column's digits of
    the fraction (one %-format made per precision: about half strftime's time)."""
    text = "%04d-%02d-%02dT%02d:%02d:%02d" + (f".%0{fsp}dZ" if fsp else "Z")
    divisor = 10 ** (6 - fsp)

    def zoned(v: Any) -> Any:
        if isinstance(v, str):  # a zero date
            return None
        if v.tzinfo is not dt.UTC:
            v = v.astimezone(dt.UTC)
        if fsp:
            return text % (v.year, v.month, v.day, v.hour, v.minute, v.second,
                           v.microsecond // divisor)
        return text % (v.year, v.month, v.day, v.hour, v.minute, v.second)

    return zoned


def _with_schema(schema: bytes, payload: bytes) -> bytes:
    """``payload`` as JsonConverter writes it with ``schemas.enable=true``."""
    return b'{"schema":' + schema + b',"payload":' + payload + b"}"


# What Debezium writes for a NOT NULL temporal column the binlog gives no value of (a zero or
# invalid date): the fallback of JdbcValueConverters.convertValue, the epoch, since the Connect
# schema makes the field required.
_FALLBACKS = {Kind.DATE: 0, Kind.DATETIME: 0, Kind.TIMESTAMP: "1970-01-01T00:00:00Z"}


def _required(f: Field, convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` for a NOT NULL column: a zero date is Debezium's fallback, not null."""
    if f.kind not in _FALLBACKS:
        return convert
    fallback = _FALLBACKS[f.kind]

    def required(value: Any) -> Any:
        converted = convert(value)
        return fallback if converted is None else converted

    return required


def _as_int64(value: Any) -> int:
    """A 64-bit unsigned value as Debezium's bigint.unsigned.handling.mode=long sends it: the
    INT64 of the same bits (above 2^63-1, negative, as the binlog holds it)."""
    n = int(value)
    return n - (1 << 64) if n >= 1 << 63 else n


def _same(value: Any) -> Any:
    """The value as it is (orjson writes it)."""
    return value


class Debezium(MessageFormat):
    name = "debezium"
    default_key = "primary-key"
    _OPS = {"insert": "c", "update": "u", "delete": "d"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Debezium writes schema changes to the topic named after the server (topic.prefix).
        self.statement_topic = self.source_name
        # [kafka] value_format/key_format = "avro": the Kafka sink's encoders of a table
        # shape's change events and keys (records with the names and values of their Avro
        # form) in Confluent's wire format; None: JSON
        self.encode_value: Callable[[TableShape, dict[str, Any]], bytes] | None = None
        self.encode_key: Callable[[TableShape, dict[str, Any]], bytes] | None = None

    def _key(self, e: RowEvent, row: tuple[Any, ...]) -> bytes:
        """The message key of ``row`` (one image of the change)."""
        if self.key_style != "primary-key":
            return super().row_key(e)
        if self.encode_key is not None:
            image = self._row(e, row, binary=True)
            assert image is not None
            return self.encode_key(e.shape, image)
        key = primary_key(e.shape, row)
        if not self.key_schema:
            return key
        cached = f"debezium.key_schema.{self.source_name}"  # shapes are shared, names not
        schema = e.shape.cache.get(cached)
        if schema is None:
            schema = e.shape.cache[cached] = dumps(
                connect_schema.key_schema(e.shape, self.source_name))
        return _with_schema(schema, key)

    def row_key(self, e: RowEvent) -> bytes:
        row = e.after if e.after is not None else e.before
        assert row is not None
        return self._key(e, row)

    def routed_rows(self, e: RowEvent) -> list[RoutedRow]:
        """Debezium's messages of a change (RelationalChangeRecordEmitter, EventDispatcher):
        an update that changes the primary key is a delete of the old key (header
        ``__debezium.newkey``), its tombstone and a create of the new key (header
        ``__debezium.oldkey``); a delete is followed by a tombstone (``tombstones``, as
        Debezium's ``tombstones.on.delete``, true by default)."""
        before, after = e.before, e.after
        if e.action == "update" and e.shape.primary_key and before is not None and \
                after is not None and (old := primary_key(e.shape, before)) != (
                    new := primary_key(e.shape, after)):
            old_key, new_key = self._key(e, before), self._key(e, after)
            to_new = (("__debezium.newkey", new),)
            messages = [RoutedRow(old_key, self._value(e, "d", before, None), e.event_number,
                                  before, to_new)]
            if self.tombstones:
                messages.append(RoutedRow(old_key, None, e.event_number, before, to_new))
            messages.append(RoutedRow(new_key, self._value(e, "c", None, after),
                                      e.event_number + 1, after, (("__debezium.oldkey", old),)))
            return messages
        key, value = self.row_key(e), self.row_value(e)
        if e.action == "delete" and self.tombstones:
            return [RoutedRow(key, value, e.event_number), RoutedRow(key, None, e.event_number)]
        return [RoutedRow(key, value, e.event_number)]

    def _row(self, e: RowEvent, row: tuple[Any, ...] | None,
             binary: bool = False) -> dict[str, Any] | None:
        """A row image's values by column; ``binary``: by Avro field name, as Avro has
        them (:mod:`cdcserver.messages.connect_avro`)."""
        if row is None:
            return None
        cached = "debezium.avro_row" if binary else "debezium.row"
        shaped = e.shape.cache.get(cached)
        if shaped is None:  # the column names, and the columns whose values are converted
            converters = [_required(f, _debezium_converter(f, binary)) if not col.nullable
                          else _debezium_converter(f, binary)
                          for f, col in zip(e.shape.fields, e.shape.layout.columns,
                                            strict=True)]
            shaped = e.shape.cache[cached] = (
                tuple(avro_name(f.column) if binary else f.column for f in e.shape.fields),
                tuple((i, c) for i, c in enumerate(converters) if c is not _same))
        names, converted = shaped
        if converted:
            values = list(row)
            for i, convert in converted:
                if values[i] is not None:
                    values[i] = convert(values[i])
            return dict(zip(names, values, strict=True))
        return dict(zip(names, row, strict=True))

    def row_value(self, e: RowEvent) -> bytes:
        # a snapshot row is Debezium's read event (op "r", before null)
        return self._value(e, "r" if e.snapshot else self._OPS[e.action], e.before, e.after)

    def _value(self, e: RowEvent, op: str, before: tuple[Any, ...] | None,
               after: tuple[Any, ...] | None) -> bytes:
        if self.encode_value is None:
            return self._json_value(e, op, before, after)
        source = {"version": "mariadb-cdc", "connector": self.flavor, "name": self.source_name,
                  "ts_ms": e.timestamp * 1000, "snapshot": e.snapshot or "false",
                  "db": e.table.database,
                  "sequence": None, "table": e.table.table, "server_id": e.gtid.server_id,
                  "gtid": e.gtid_text, "file": e.file, "pos": e.pos, "row": e.row,
                  "thread": None, "query": None}
        binary = self.encode_value is not None
        record = {"before": self._row(e, before, binary), "after": self._row(e, after, binary),
                  "source": source, "op": op, "ts_ms": int(time.time() * 1000),
                  "transaction": None}
        return self._encoded(e.shape, record)

    def _json_value(self, e: RowEvent, op: str, before: tuple[Any, ...] | None,
                    after: tuple[Any, ...] | None) -> bytes:
        """:meth:`_value` in JSON: the same bytes as ``dumps`` of its record (the unit
        tests compare them), the parts that are the same for every row of a table made
        once. (Building the record's two dicts and writing them took a tenth of the Kafka
        sink's thread in bench/bench_peers.py.)"""
        cached = f"debezium.json_parts.{self.source_name}.{self.flavor}.{self.value_schema}"
        parts = e.shape.cache.get(cached)
        if parts is None:
            opening, closing = b"", b""  # the Connect schema around it (value_schema)
            if self.value_schema:
                opening = b'{"schema":' + self._value_schema(e.shape) + b',"payload":'
                closing = b"}"
            parts = e.shape.cache[cached] = (
                opening + b'{"before":',
                b',"source":{"version":"mariadb-cdc","connector":' + dumps(self.flavor) +
                b',"name":' + dumps(self.source_name) + b',"ts_ms":',
                b'","db":' + dumps(e.table.database) +
                b',"sequence":null,"table":' + dumps(e.table.table) + b',"server_id":',
                b'"transaction":null}' + closing)
        opening, head, middle, end = parts
        return b"".join((
            opening, dumps(self._row(e, before)), b',"after":', dumps(self._row(e, after)),
            head, b"%d" % (e.timestamp * 1000), b',"snapshot":"',
            e.snapshot.encode() if e.snapshot else b"false", middle, b"%d" % e.gtid.server_id,
            b',"gtid":', dumps(e.gtid_text), b',"file":', dumps(e.file),
            b',"pos":%d,"row":%d,"thread":null,"query":null},"op":"%s","ts_ms":%d,' % (
                e.pos, e.row, op.encode(), int(time.time() * 1000)), end))

    def _encoded(self, shape: TableShape, record: dict[str, Any]) -> bytes:
        """A change event as the message's value: Avro (``encode_value``), or JSON with the
        envelope's Connect schema when ``value_schema`` says so."""
        if self.encode_value is not None:
            return self.encode_value(shape, record)
        return self._with_value_schema(shape, dumps(record))

    def _with_value_schema(self, shape: TableShape, value: bytes) -> bytes:
        """``value`` with the Connect schema of the table's envelope, with ``value_schema``."""
        if not self.value_schema:
            return value
        return _with_schema(self._value_schema(shape), value)

    def _value_schema(self, shape: TableShape) -> bytes:
        """The Connect schema of the table's envelope, in JSON (made once per table)."""
        cached = f"debezium.value_schema.{self.source_name}.{self.flavor}"
        schema: bytes | None = shape.cache.get(cached)
        if schema is None:
            schema = shape.cache[cached] = dumps(
                connect_schema.envelope_schema(shape, self.source_name, self.flavor))
        return schema

    def statement_rows(self, e: StatementEvent) -> list[tuple[bytes | None, bytes]]:
        """With ``truncate_events``, a TRUNCATE TABLE as Debezium's binlog connectors send it
        when ``skipped.operations`` leaves out ``t`` (its default skips it): a change event
        ``op: "t"``, ``before`` and ``after`` null, on the table's topic, with no key."""
        if not self.truncate_events or e.kind != "truncate" or e.table is None or \
                e.shape is None:
            return []
        source = {"version": "mariadb-cdc", "connector": self.flavor, "name": self.source_name,
                  "ts_ms": e.timestamp * 1000, "snapshot": "false", "db": e.database,
                  "sequence": None, "table": e.table, "server_id": e.gtid.server_id,
                  "gtid": str(e.gtid), "file": e.file, "pos": e.pos, "row": 0,
                  "thread": None, "query": None}
        return [(None, self._encoded(e.shape, {
            "before": None, "after": None, "source": source, "op": "t",
            "ts_ms": int(time.time() * 1000), "transaction": None}))]

    def statement(self, e: StatementEvent) -> Message:
        """Debezium's schema change event, on its schema change topic, keyed by the
        database as Debezium keys it."""
        value = dumps({"source": {"version": "mariadb-cdc", "connector": self.flavor,
                                  "name": self.source_name, "ts_ms": e.timestamp * 1000,
                                  "db": e.database, "table": e.table, "gtid": str(e.gtid),
                                  "file": e.file, "pos": e.pos},
                       "ts_ms": int(dt.datetime.now(dt.UTC).timestamp() * 1000),
                       "databaseName": e.database, "schemaName": None, "ddl": e.sql,
                       "tableChanges": [_table_change(e)] if e.table else []})
        key = dumps({"databaseName": e.database})
        if self.key_schema:
            key = _with_schema(dumps(connect_schema.SCHEMA_CHANGE_KEY), key)
        return key, value


_JDBC_TYPES = {"tinyint": -6, "smallint": 5, "mediumint": 4, "int": 4, "bigint": -5,
               "float": 7, "double": 8, "decimal": 3, "date": 91, "time": 92,
               "datetime": 93, "timestamp": 2014, "year": 4, "char": 1, "varchar": 12,
               "binary": -2, "varbinary": -3, "tinyblob": -4, "blob": -4, "mediumblob": -4,
               "longblob": -4, "tinytext": -1, "text": -1, "mediumtext": -1, "longtext": -1,
               "enum": 1, "set": 1, "bit": -7, "json": 12, "geometry": 1111}


def _table_change(e: StatementEvent) -> dict[str, Any]:
    """One entry of a schema change event's ``tableChanges``: the table after the statement
    (Debezium's shape; the columns as the binlog and the schema history describe them)."""
    change: dict[str, Any] = {"type": {"create": "CREATE", "drop": "DROP"}.get(e.kind, "ALTER"),
                              "id": f'"{e.database}"."{e.table}"'}
    if e.shape is None or e.kind == "drop":
        change["table"] = None
        return change
    columns = []
    described = e.shape.layout.description
    auto = described.auto_increment if described is not None else None
    for position, (f, col) in enumerate(zip(e.shape.fields, e.shape.layout.columns,
                                            strict=True), 1):
        type_name = f.real_type.upper() + (" UNSIGNED" if col.unsigned else "")
        columns.append({"name": f.column, "jdbcType": _JDBC_TYPES.get(f.real_type, 1111),
                        "nativeType": None, "typeName": type_name,
                        "typeExpression": type_name, "charsetName": None,
                        "length": f.precision or None, "scale": f.scale or None,
                        "position": position, "optional": col.nullable,
                        "autoIncremented": f.column == auto, "generated": False})
    change["table"] = {"defaultCharsetName": None, "primaryKeyColumnNames":
                       [e.shape.fields[i].column for i in e.shape.primary_key],
                       "columns": columns}
    return change


# -- maxscale -------------------------------------------------------------------------------

class MaxScale(MessageFormat):
    name = "maxscale"

    def rows(self, e: RowEvent) -> list[RowMessage]:
        if e.action == "update":
            return [self._record(e, e.before, "update_before", e.event_number),
                    self._record(e, e.after, "update_after", e.event_number + 1)]
        row = e.after if e.action == "insert" else e.before
        return [self._record(e, row, e.action, e.event_number)]

    def _record(self, e: RowEvent, row: tuple[Any, ...] | None, event_type: str,
                number: int) -> RowMessage:
        assert row is not None
        g = e.gtid
        shaped = e.shape.cache.get("maxscale.columns")
        if shaped is None:  # the table's names and each column's name and writer, once
            shaped = e.shape.cache["maxscale.columns"] = (
                f'"table_schema":{json.dumps(e.table.database, ensure_ascii=False)},'
                f'"table_name":{json.dumps(e.table.table, ensure_ascii=False)}',
                [("," + json.dumps(f.name, ensure_ascii=False) + ":", _json_text(f, self.zone))
                 for f in e.shape.fields])
        table, columns = shaped
        head = (f'{{"domain":{g.domain},"server_id":{g.server_id},"sequence":{g.sequence},'
                f'"event_number":{number},"timestamp":{e.timestamp},'
                f'"event_type":"{event_type}",{table}')
        body = "".join([name + ("null" if v is None else text(v))
                        for (name, text), v in zip(columns, row)])  # noqa: B905
        key = f"{g}:{number}".encode() if self.key_style != "primary-key" else self.row_key(e)
        return key, (head + body + "}").encode("utf-8"), number

    def statement(self, e: StatementEvent) -> Message | None:
        """KafkaCDC's schema message (its send_schema): the table's new schema, keyed by the
        statement's GTID; nothing for statements that leave no table schema."""
        if e.shape is None:
            return None
        schema = {**e.shape.schema.avsc, "gtid": str(e.gtid)}
        version = self.version_of(e.database, e.table or "", str(e.gtid))
        if version is not None:
            schema["version"] = version
        return str(e.gtid).encode(), json.dumps(schema, separators=(",", ":"),
                                                ensure_ascii=False).encode("utf-8")


def _json_text(f: Field, zone: dt.tzinfo) -> Callable[[Any], str]:
    """:func:`to_json_text` for one column, chosen once, with fast paths for the common types."""
    kind, fsp = f.kind, f.fsp

    def general(v: Any) -> str:
        return to_json_text(kind, v, fsp, zone)

    if kind in (Kind.INT, Kind.LONG):
        return lambda v: str(v) if type(v) is int else general(v)
    if kind in (Kind.STRING, Kind.ENUM):
        def string(v: Any) -> str:
            if type(v) is str:
                try:
                    return orjson.dumps(v).decode()
                except orjson.JSONEncodeError:  # a lone surrogate: the general escaping
                    pass
            return general(v)

        return string
    if kind == Kind.DOUBLE:
        return lambda v: repr(v) if type(v) is float else general(v)
    if kind == Kind.DECIMAL:
        return lambda v: format(v, "f") if type(v) is Decimal else general(v)
    spec = {0: "seconds", 3: "milliseconds", 6: "microseconds"}.get(fsp)
    if kind == Kind.DATETIME and spec is not None:  # a naive datetime: isoformat's digits
        return lambda v: ('"' + v.isoformat(" ", spec) + '"'
                          if type(v) is dt.datetime and v.tzinfo is None else general(v))
    return general


FORMATS: dict[str, type[MessageFormat]] = {f.name: f for f in (Databus, Dip, Debezium,
                                                                MaxScale)}
