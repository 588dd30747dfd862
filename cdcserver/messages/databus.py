"""mysql-databus's transfer format (the user's seed 001): a binlog row event as a
``RowsEvent`` (``{"Table": {...}, "Action": ..., "Rows": [[...]]}``, every column value
base64-encoded before JSON, an update's rows its before/after pair) and a schema statement as
a ``QueryEvent`` (``{"Table": ..., "Action": ..., "Query": base64(sql)}``). The Kafka sink
publishes it; the listener writes databus dumps in it (:mod:`cdcserver.dump.databus`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from cdcserver.messages.base import (
    Message,
    MessageFormat,
    RowMessage,
    dumps,
    position_key,
)
from cdcserver.messages.events import RowBatch, RowEvent, StatementEvent, TableShape
from cdcserver.schema.ddl import qualified
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.dump import value_encoder
from mariadb_cdc_client.format.schema import Field, Kind

# the compiled row writer (cdcserver/messages/_databus.pyx): the same bytes, in C
_databus = compiled_module("cdcserver.messages._databus")

# _databus.pyx's operations (keep in step)
_C_CALL = 0
_C_OPS = {Kind.INT: 1, Kind.LONG: 1, Kind.STRING: 2, Kind.ENUM: 2, Kind.BYTES: 3,
          Kind.DOUBLE: 7, Kind.FLOAT: 7, Kind.DECIMAL: 8}
_C_DATETIME = {0: 4, 3: 5, 6: 6}


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

    def _value_ops(self, shape: TableShape) -> tuple[int, ...]:
        """Per column, what _databus.pyx writes itself (else the column's encoder)."""
        ops: tuple[int, ...] | None = shape.cache.get("databus.ops")
        if ops is None:
            ops = shape.cache["databus.ops"] = tuple(
                _C_CALL if not self.labels and f.real_type in ("enum", "set")
                else _C_DATETIME.get(f.fsp, _C_CALL) if f.kind == Kind.DATETIME
                else _C_OPS.get(f.kind, _C_CALL) for f in shape.fields)
        return ops

    def rows_json(self, shape: TableShape, rows: list[tuple[Any, ...]]) -> bytes:
        """``[...],[...]``: each row's values base64-encoded (null for NULL)."""
        encoders = self.value_encoders(shape)
        if _databus is not None:
            written = _databus.rows_json(rows, self._value_ops(shape), tuple(encoders))
            if written is not None:
                return bytes(written)
        b64 = binascii.b2a_base64
        return b",".join([b"[" + b",".join([
            b"null" if v is None else b'"' + b64(enc(v), newline=False) + b'"'
            for enc, v in zip(encoders, row)]) + b"]" for row in rows])  # noqa: B905

    def row_event(self, batch: RowBatch) -> RowMessage:
        first = batch.rows[0]
        rows = [row for e in batch.rows for row in (e.before, e.after) if row is not None]
        value = (b'{"Table":' + self.table_json(first.shape) + b',"Action":"' +
                 first.action.encode() + b'","Rows":[' + self.rows_json(first.shape, rows) +
                 b"]}")
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
