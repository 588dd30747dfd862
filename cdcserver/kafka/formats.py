"""Kafka message formats: what a row change or a schema statement looks like on a topic.

``cdcserver/kafka/README.md`` shows an example of each. In short:

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
import binascii
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import orjson

from cdcserver.kafka.events import RowBatch, RowEvent, StatementEvent, TableShape
from cdcserver.schema.ddl import qualified
from mariadb_cdc_client.format.dump import value_encoder
from mariadb_cdc_client.format.schema import Field, Kind, float32_text, to_json_text

# (database, table, GTID) -> the table version current right after that transaction
VersionLookup = Callable[[str, str, str], int | None]

Message = tuple[bytes, bytes]  # key, value
RowMessage = tuple[bytes, bytes, int]  # key, value, the event_number of its first record



def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (orjson: the standard library's encoder took a third of the sink's
    time in bench/bench_kafka.py, mostly building an encoder per call)."""
    return orjson.dumps(value)


def position_key(action: str, file: str, pos: int, gtid: str, event: int) -> bytes:
    return dumps({"Pos": {"Name": file, "Pos": pos}, "Action": action, "GTID": gtid,
                  "Event": event})


def primary_key(shape: TableShape, row: tuple[Any, ...]) -> bytes:
    """The row's primary key as a JSON object (every column for a table without one)."""
    fields = shape.fields
    columns = shape.primary_key or tuple(range(len(fields)))
    return ("{" + ",".join(json.dumps(fields[i].column, ensure_ascii=False) + ":" +
                           to_json_text(fields[i].kind, row[i], fields[i].fsp)
                           for i in columns) + "}").encode("utf-8")


def _text(f: Field) -> Callable[[Any], str]:
    """A value's MariaDB text form (binary data as hex), for one column, chosen once."""
    if f.kind == Kind.BYTES:
        return lambda v: bytes(v).hex()
    encode = value_encoder(f)
    return lambda v: encode(v).decode("utf-8")


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
                 key_schema: bool = False, labels: bool = False) -> None:
        self.key_style = self.default_key if key == "auto" else key
        self.key_schema = key_schema
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

    def statement_key(self, e: StatementEvent, action: str) -> bytes:
        return position_key(action, e.file, e.pos, str(e.gtid), 0)


# -- databus ------------------------------------------------------------------------------

def go_mysql_type(raw_type: str) -> int:
    """The ``schema.TYPE_*`` code go-mysql gives a column of this ``SHOW COLUMNS`` type, as
    siddontang/go-mysql 3ca161f (2017-03-26) does, the last version whose ``TableColumn`` is
    the seed's (Name, Type, RawType, IsAuto, EnumValues, SetValues): NUMBER 1, FLOAT 2
    (DECIMAL too), ENUM 3, SET 4, STRING 5 (every other type), DATETIME 6, TIMESTAMP 7,
    DATE 8, TIME 9, BIT 10, JSON 11. Matched on the type's name, not on ENUM labels (a label
    containing "int" made that version say NUMBER)."""
    name = raw_type.split("(", 1)[0].split(" ", 1)[0]
    if "int" in name or name.startswith("year"):
        return 1
    if name.startswith(("float", "double", "decimal")):
        return 2
    for prefix, code in (("enum", 3), ("set", 4), ("datetime", 6), ("timestamp", 7),
                         ("time", 9)):
        if name.startswith(prefix):
            return code
    if name == "date":
        return 8
    return 10 if name.startswith("bit") else 11 if name.startswith("json") else 5


# The QueryEvent actions mysql-databus documents (getevent-structures.md: with update, insert
# and delete, its seven action strings). A consumer switches on them, so a statement of
# another kind (RENAME TABLE, a statement on no known table) goes as "alter", the schema
# change it is; its Query carries the statement itself.
DATABUS_STATEMENT_ACTIONS = frozenset({"alter", "create", "drop", "truncate"})


class Databus(MessageFormat):
    """mysql-databus's messages (seed 001): one per binlog row event, a ``RowsEvent`` with all
    its rows, and a ``QueryEvent`` per statement, keyed ``KafkaKey{Pos, Action}`` with
    ``Action`` ``DML`` or ``DDL`` and ``Pos`` where the event's transaction starts: the
    position ``SHOW MASTER STATUS`` gave before it, which is what its SDK searches Kafka for
    (and a dump's position); all on one topic, partition 0, which is where its SDK reads."""

    name = "databus"
    default_topic = "databus"
    default_ddl_topic = "auto"
    default_partitions = 1

    def table_json(self, shape: TableShape) -> bytes:
        """go-mysql's ``schema.Table``: each column's ``RawType`` as ``SHOW FULL COLUMNS``
        shows it and ``IsAuto``, every index as ``SHOW INDEX`` lists it (``Cardinality``:
        each column's position, what go-mysql gives before the server has statistics), from
        the schema history; from the table map alone when the history does not know the
        table (then ``RawType`` is the bare type name and only the primary key is listed)."""
        cached: bytes | None = shape.cache.get("databus.table")
        if cached is not None:
            return cached
        layout = shape.layout
        described = layout.description
        if described is not None:
            raw_types = described.column_types
            auto = described.auto_increment
            indexes = [(i.name, list(i.columns)) for i in described.indexes]
        else:
            raw_types = tuple(f.real_type + (" unsigned" if col.unsigned else "")
                              for f, col in zip(shape.fields, layout.columns, strict=True))
            auto = None
            pk_names = [shape.fields[i].column for i in layout.primary_key]
            indexes = [("PRIMARY", pk_names)] if pk_names else []
        columns = [{"Name": f.column, "Type": go_mysql_type(raw), "RawType": raw,
                    "IsAuto": f.column == auto,
                    "EnumValues": list(col.enum_values) or None,
                    "SetValues": list(col.set_values) or None}
                   for f, col, raw in zip(shape.fields, layout.columns, raw_types,
                                          strict=True)]
        table = dumps({"Schema": shape.table.database, "Name": shape.table.table,
                       "Columns": columns,
                       "Indexes": [{"Name": name, "Columns": cols,
                                    "Cardinality": list(range(1, len(cols) + 1))}
                                   for name, cols in indexes],
                       "PKColumns": list(layout.primary_key)})
        shape.cache["databus.table"] = table
        return table

    def value_encoders(self, shape: TableShape) -> list[Callable[[Any], bytes]]:
        encoders: list[Callable[[Any], bytes]] | None = shape.cache.get("databus.encoders")
        if encoders is None:
            encoders = shape.cache["databus.encoders"] = [
                self._encoder(f, col) for f, col in zip(shape.fields, shape.layout.columns,
                                                        strict=True)]
        return encoders

    def _encoder(self, f: Field, col: Any) -> Callable[[Any], bytes]:
        """A value's text as go-mysql gave it: ENUM as its index, SET as its bitmask (unless
        ``labels``); everything else MariaDB's text form, binary data as it is."""
        text = value_encoder(f)
        if self.labels or f.real_type not in ("enum", "set"):
            return text
        if f.real_type == "enum":
            index = {label: n for n, label in enumerate(col.enum_values, 1)}
            return lambda v: b"%d" % index.get(v, 0)
        bits = {label: 1 << n for n, label in enumerate(col.set_values)}
        return lambda v: b"%d" % sum(bits.get(label, 0) for label in v.split(",") if label)

    def row_event(self, batch: RowBatch) -> RowMessage:
        first = batch.rows[0]
        encoders = self.value_encoders(first.shape)
        b64 = binascii.b2a_base64
        rows = []
        for e in batch.rows:
            for row in (e.before, e.after):
                if row is not None:
                    rows.append(b"[" + b",".join([
                        b"null" if v is None else b'"' + b64(enc(v), newline=False) + b'"'
                        for enc, v in zip(encoders, row)]) + b"]")  # noqa: B905
        value = (b'{"Table":' + self.table_json(first.shape) + b',"Action":"' +
                 first.action.encode() + b'","Rows":[' + b",".join(rows) + b"]}")
        return self.event_key("DML", first.file, first.transaction_start, first.gtid_text,
                              first.event_number), value, first.event_number

    def row_value(self, e: RowEvent) -> bytes:
        return self.row_event(RowBatch((e,)))[1]

    @property
    def per_row_event(self) -> bool:  # type: ignore[override]
        """A message per row event; per row when keyed by primary key (one key per row)."""
        return self.key_style != "primary-key"

    def row_key(self, e: RowEvent) -> bytes:
        if self.key_style == "primary-key":
            return super().row_key(e)
        return self.event_key("DML", e.file, e.transaction_start, e.gtid_text, e.event_number)

    @staticmethod
    def event_key(action: str, file: str, transaction_start: int, gtid: str, event: int
                  ) -> bytes:
        return position_key(action, file, transaction_start, gtid, event)

    def statement(self, e: StatementEvent) -> Message:
        action = e.kind if e.kind in DATABUS_STATEMENT_ACTIONS else "alter"
        if e.shape is not None:
            table = self.table_json(e.shape)
        else:  # never null: the SDK reads Table.Schema of every QueryEvent
            table = dumps({"Schema": e.database, "Name": e.table or "", "Columns": [],
                           "Indexes": [], "PKColumns": []})
        # "Query is a DDL statement that can be run as it is, the schema already wrapped in"
        sql = qualified(e.sql, e.session_database)
        value = (b'{"Table":' + table + b',"Action":' + dumps(action) + b',"Query":"' +
                 base64.b64encode(sql.encode("utf-8")) + b'"}')
        return position_key("DDL", e.file, e.transaction_start, str(e.gtid), 0), value


# -- dip (official format one, with Canal's DDL) -------------------------------------------

_CANAL_TYPES = {"create": "CREATE", "alter": "ALTER", "drop": "ERASE", "rename": "RENAME",
                "truncate": "TRUNCATE"}


class Dip(MessageFormat):
    name = "dip"
    _TYPES = {"insert": "I", "update": "U", "delete": "D"}

    def _values(self, e: RowEvent, row: tuple[Any, ...] | None) -> dict[str, str | None] | None:
        if row is None:
            return None
        columns = e.shape.cache.get("dip.columns")
        if columns is None:
            columns = e.shape.cache["dip.columns"] = [(f.column, _text(f)) for f in e.shape.fields]
        return {name: None if v is None else text(v)
                for (name, text), v in zip(columns, row)}  # noqa: B905

    def row_value(self, e: RowEvent) -> bytes:
        when = dt.datetime.fromtimestamp(e.timestamp, self.zone).strftime("%Y%m%d%H%M%S")
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
        # examples (its RENAME example has milliseconds; protocol.md says why seconds).
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


def _debezium_converter(f: Field) -> Callable[[Any], Any]:
    k = f.kind
    if k == Kind.DECIMAL:
        return lambda v: format(v, "f") if f.real_type == "decimal" else int(v)
    if k == Kind.FLOAT:
        return lambda v: float(float32_text(v))
    if k == Kind.BYTES:
        if f.real_type == "geometry":
            return lambda v: {"wkb": base64.b64encode(v[4:]).decode(),
                              "srid": int.from_bytes(v[:4], "little")}
        return lambda v: base64.b64encode(v).decode()
    if k == Kind.DATE:
        return lambda v: None if isinstance(v, str) else (v - _EPOCH.date()).days
    if k == Kind.DATETIME:
        scale = 1000 if f.fsp <= 3 else 1  # io.debezium.time.Timestamp / MicroTimestamp
        return lambda v: None if isinstance(v, str) else (
            (v - _EPOCH) // dt.timedelta(microseconds=1)) // scale
    if k == Kind.TIMESTAMP:
        return lambda v: None if isinstance(v, str) else (
            v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") +
            (f".{v.microsecond:06d}"[: f.fsp + 1] if f.fsp else "") + "Z")
    if k == Kind.TIME:
        return lambda v: v // dt.timedelta(microseconds=1)
    if k == Kind.UUID:
        return str
    if k == Kind.BOOLEAN:  # BIT(1): the row holds the bit as an int
        return bool
    return lambda v: v


class Debezium(MessageFormat):
    name = "debezium"
    default_key = "primary-key"
    _OPS = {"insert": "c", "update": "u", "delete": "d"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Debezium writes schema changes to the topic named after the server (topic.prefix).
        self.statement_topic = self.source_name

    def row_key(self, e: RowEvent) -> bytes:
        key = super().row_key(e)
        if not self.key_schema or self.key_style != "primary-key":
            return key
        schema = e.shape.cache.get("debezium.key_schema")
        if schema is None:
            schema = e.shape.cache["debezium.key_schema"] = dumps(_connect_key_schema(
                e.shape, f"{self.source_name}.{e.table.database}.{e.table.table}.Key"))
        return b'{"schema":' + schema + b',"payload":' + key + b"}"

    def _row(self, e: RowEvent, row: tuple[Any, ...] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        converters = e.shape.cache.get("debezium.converters")
        if converters is None:
            converters = e.shape.cache["debezium.converters"] = [
                _debezium_converter(f) for f in e.shape.fields]
        return {f.column: None if v is None else convert(v)
                for f, v, convert in zip(e.shape.fields, row, converters, strict=True)}

    def row_value(self, e: RowEvent) -> bytes:
        source = {"version": "mariadb-cdc", "connector": self.flavor, "name": self.source_name,
                  "ts_ms": e.timestamp * 1000, "snapshot": "false", "db": e.table.database,
                  "sequence": None, "table": e.table.table, "server_id": e.gtid.server_id,
                  "gtid": e.gtid_text, "file": e.file, "pos": e.pos, "row": e.row,
                  "thread": None, "query": None}
        return dumps({"before": self._row(e, e.before), "after": self._row(e, e.after),
                      "source": source, "op": self._OPS[e.action],
                      "ts_ms": int(dt.datetime.now(dt.UTC).timestamp() * 1000),
                      "transaction": None})

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
            key = b'{"schema":' + dumps(_SCHEMA_CHANGE_KEY) + b',"payload":' + key + b"}"
        return key, value


# Kafka Connect schemas of Debezium's keys (its MySQL connector's default modes, with
# decimal.handling.mode=string, as the values are).
_SCHEMA_CHANGE_KEY = {"type": "struct", "fields": [
    {"type": "string", "optional": False, "field": "databaseName"}], "optional": False,
    "name": "io.debezium.connector.mysql.SchemaChangeKey"}
_CONNECT_INTS = {"tinyint": "int16", "smallint": "int16", "mediumint": "int32",
                 "int": "int32", "year": "int32", "bigint": "int64", "bit": "int64"}
_CONNECT_NAMES = {Kind.DATE: ("int32", "io.debezium.time.Date"),
                  Kind.TIME: ("int64", "io.debezium.time.MicroTime"),
                  Kind.TIMESTAMP: ("string", "io.debezium.time.ZonedTimestamp")}


def _connect_type(f: Field, unsigned: bool) -> dict[str, Any]:
    kind = f.kind
    if kind in (Kind.INT, Kind.LONG):
        t = _CONNECT_INTS.get(f.real_type, "int64")
        if unsigned and t != "int64":  # an unsigned column takes the next wider type
            t = {"int16": "int32", "int32": "int64"}[t]
        return {"type": t}
    if kind == Kind.DECIMAL:
        return {"type": "int64"} if f.real_type in ("bigint", "bit") else {"type": "string"}
    if kind == Kind.DATETIME:
        return {"type": "int64", "name": "io.debezium.time.Timestamp" if f.fsp <= 3
                else "io.debezium.time.MicroTimestamp"}
    if kind in _CONNECT_NAMES:
        t, name = _CONNECT_NAMES[kind]
        return {"type": t, "name": name}
    simple = {Kind.BOOLEAN: "boolean", Kind.FLOAT: "float32", Kind.DOUBLE: "float64",
              Kind.BYTES: "bytes"}
    return {"type": simple.get(kind, "string")}


def _connect_key_schema(shape: TableShape, name: str) -> dict[str, Any]:
    columns = shape.primary_key or tuple(range(len(shape.fields)))
    fields = [{**_connect_type(shape.fields[i], shape.layout.columns[i].unsigned),
               "optional": not shape.primary_key, "field": shape.fields[i].column}
              for i in columns]
    return {"type": "struct", "fields": fields, "optional": False, "name": name}


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
        head = (f'{{"domain":{g.domain},"server_id":{g.server_id},"sequence":{g.sequence},'
                f'"event_number":{number},"timestamp":{e.timestamp},'
                f'"event_type":"{event_type}","table_schema":'
                f'{json.dumps(e.table.database, ensure_ascii=False)},"table_name":'
                f'{json.dumps(e.table.table, ensure_ascii=False)}')
        columns = e.shape.cache.get("maxscale.columns")
        if columns is None:
            columns = e.shape.cache["maxscale.columns"] = [
                ("," + json.dumps(f.name, ensure_ascii=False) + ":", _json_text(f, self.zone))
                for f in e.shape.fields]
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
    return general


FORMATS: dict[str, type[MessageFormat]] = {f.name: f for f in (Databus, Dip, Debezium,
                                                                MaxScale)}
