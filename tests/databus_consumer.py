"""A consumer of mysql-databus's messages written only from seed 001's Go structs.

It decodes JSON the way Go's ``encoding/json`` fills those structs, strictly: a field of the
wrong JSON type is an error (as ``json.Unmarshal`` reports it), keys match field names without
regard to case, unknown keys are ignored, ``[]byte`` is standard base64. Nothing here imports
the service: it is the oracle's reader.

    type KafkaKey struct { Pos mysql.Position; Action string }  // Position{Name; Pos uint32}
    type RowsEvent struct { Table *schema.Table; Action string; Rows [][]interface{} }
    type QueryEvent struct { Table *schema.Table; Action string; Query []byte }
    type Table struct { Schema, Name string; Columns []TableColumn; Indexes []*Index;
                        PKColumns []int }
    type TableColumn struct { Name string; Type int; RawType string; IsAuto bool;
                              EnumValues, SetValues []string }
    type Index struct { Name string; Columns []string; Cardinality []uint64 }

Values: "every column value is base64-encoded before it is written ... and decoded in the
client" (seed 001), so each element of ``Rows`` is a base64 string (or null) whose bytes are
the value's text.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

# The QueryEvent actions of mysql-databus's docs (getevent-structures.md: "DDL && DML
# Action", seven strings; update, insert and delete are a RowsEvent's). A consumer switches
# on them: any other string is a statement it drops.
STATEMENT_ACTIONS = ("alter", "create", "drop", "truncate")


class GoJSONError(ValueError):
    """What json.Unmarshal would return."""


def _field(obj: dict[str, Any], name: str) -> Any:
    """Go matches a key to a field by exact name first, then without regard to case."""
    if name in obj:
        return obj[name]
    for key, value in obj.items():
        if key.lower() == name.lower():
            return value
    return None


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GoJSONError(f"cannot unmarshal {type(value).__name__} into {where} of type string")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GoJSONError(f"cannot unmarshal {value!r} into {where} ({low}..{high})")
    return value


def _bool(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise GoJSONError(f"cannot unmarshal {value!r} into {where} of type bool")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise GoJSONError(f"cannot unmarshal {type(value).__name__} into {where} (a slice)")
    return value


def _object(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise GoJSONError(f"cannot unmarshal {type(value).__name__} into {where} (a struct)")
    return value


def _bytes(value: Any, where: str) -> bytes:
    text = _string(value, where)
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise GoJSONError(f"illegal base64 data in {where}: {exc}") from None


@dataclass
class Position:
    name: str
    pos: int


@dataclass
class KafkaKey:
    pos: Position
    action: str


@dataclass
class TableColumn:
    name: str
    type: int
    raw_type: str
    is_auto: bool
    enum_values: list[str]
    set_values: list[str]


@dataclass
class Index:
    name: str
    columns: list[str]
    cardinality: list[int]


@dataclass
class Table:
    schema: str
    name: str
    columns: list[TableColumn]
    indexes: list[Index]
    pk_columns: list[int]


@dataclass
class RowsEvent:
    table: Table | None
    action: str
    rows: list[list[Any]]


@dataclass
class QueryEvent:
    table: Table | None
    action: str
    query: bytes


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GoJSONError(f"invalid JSON: {exc}") from None


def decode_key(data: bytes) -> KafkaKey:
    obj = _object(_loads(data), "KafkaKey")
    if obj is None:
        raise GoJSONError("null KafkaKey")
    pos = _object(_field(obj, "Pos"), "KafkaKey.Pos") or {}
    return KafkaKey(Position(_string(_field(pos, "Name"), "Position.Name"),
                             _int(_field(pos, "Pos"), "Position.Pos", 0, 2**32 - 1)),
                    _string(_field(obj, "Action"), "KafkaKey.Action"))


def decode_table(value: Any) -> Table | None:
    obj = _object(value, "Table")
    if obj is None:
        return None
    columns = []
    for c in _list(_field(obj, "Columns"), "Table.Columns"):
        col = _object(c, "TableColumn") or {}
        columns.append(TableColumn(
            _string(_field(col, "Name"), "TableColumn.Name"),
            _int(_field(col, "Type"), "TableColumn.Type", -(2**63), 2**63 - 1),
            _string(_field(col, "RawType"), "TableColumn.RawType"),
            _bool(_field(col, "IsAuto"), "TableColumn.IsAuto"),
            [_string(v, "EnumValues") for v in _list(_field(col, "EnumValues"), "EnumValues")],
            [_string(v, "SetValues") for v in _list(_field(col, "SetValues"), "SetValues")]))
    indexes = []
    for i in _list(_field(obj, "Indexes"), "Table.Indexes"):
        index = _object(i, "Index")
        if index is None:
            continue  # a nil *Index
        indexes.append(Index(
            _string(_field(index, "Name"), "Index.Name"),
            [_string(v, "Index.Columns") for v in _list(_field(index, "Columns"), "Columns")],
            [_int(v, "Index.Cardinality", 0, 2**64 - 1)
             for v in _list(_field(index, "Cardinality"), "Cardinality")]))
    pk = [_int(v, "Table.PKColumns", -(2**63), 2**63 - 1)
          for v in _list(_field(obj, "PKColumns"), "PKColumns")]
    return Table(_string(_field(obj, "Schema"), "Table.Schema"),
                 _string(_field(obj, "Name"), "Table.Name"), columns, indexes, pk)


def decode_rows_event(data: bytes) -> RowsEvent:
    obj = _object(_loads(data), "RowsEvent") or {}
    rows = [_list(r, "RowsEvent.Rows[]") for r in _list(_field(obj, "Rows"), "RowsEvent.Rows")]
    return RowsEvent(decode_table(_field(obj, "Table")),
                     _string(_field(obj, "Action"), "RowsEvent.Action"), rows)


def decode_query_event(data: bytes) -> QueryEvent:
    obj = _object(_loads(data), "QueryEvent") or {}
    return QueryEvent(decode_table(_field(obj, "Table")),
                      _string(_field(obj, "Action"), "QueryEvent.Action"),
                      _bytes(_field(obj, "Query"), "QueryEvent.Query"))


def go_mysql_type(raw_type: str) -> int:
    """TableColumn.Type as siddontang/go-mysql 3ca161f's AddColumn sets it from RawType
    (schema/schema.go), but matching the type's name only, not ENUM/SET labels."""
    name = raw_type.split("(")[0]
    if "int" in name or name.startswith("year"):
        return 1  # TYPE_NUMBER
    if name.startswith(("float", "double", "decimal")):
        return 2  # TYPE_FLOAT
    checks = [("enum", 3), ("set", 4), ("datetime", 6), ("timestamp", 7), ("time", 9)]
    for prefix, code in checks:
        if name.startswith(prefix):
            return code
    if name == "date":
        return 8
    if name.startswith("bit"):
        return 10
    return 11 if name.startswith("json") else 5  # TYPE_JSON, TYPE_STRING


def column_text(value: Any) -> str | None:
    """A column value as the client gets it: base64 undone (seed 001), as text."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise GoJSONError(f"a column value is {type(value).__name__}, not a base64 string")
    return _bytes(value, "column value").decode("utf-8", errors="surrogateescape")


@dataclass
class Replica:
    """The table rebuilt from RowsEvents the way the seed's Do() applies them: REPLACE for an
    insert and an update's after image (keyed by PKColumns), DELETE by key."""

    rows: dict[tuple[str | None, ...], list[str | None]] = field(default_factory=dict)
    events: int = 0
    statements: list[str] = field(default_factory=list)
    table: Table | None = None  # the last RowsEvent's

    def apply(self, key: KafkaKey, value: bytes) -> None:
        if key.action == "DDL":
            event = decode_query_event(value)
            if event.table is None:
                raise GoJSONError("a QueryEvent without a Table (the SDK dereferences it)")
            if event.action not in STATEMENT_ACTIONS:
                raise GoJSONError(f"QueryEvent.Action {event.action!r} is not one of "
                                  "mysql-databus's")
            self.statements.append(event.query.decode("utf-8"))
            return
        if key.action != "DML":
            raise GoJSONError(f"KafkaKey.Action {key.action!r} is neither DML nor DDL")
        rows_event = decode_rows_event(value)
        table = rows_event.table
        if table is None:
            raise GoJSONError("a RowsEvent without a Table")
        self.events += 1
        self.table = table
        rows = [[column_text(v) for v in row] for row in rows_event.rows]
        if rows_event.action == "update":
            if len(rows) % 2:
                raise GoJSONError("an update with an odd number of rows")
            for before, after in zip(rows[0::2], rows[1::2], strict=True):
                self.rows.pop(self._key(table, before), None)
                self.rows[self._key(table, after)] = after
        elif rows_event.action == "insert":
            for row in rows:
                self.rows[self._key(table, row)] = row
        elif rows_event.action == "delete":
            for row in rows:
                self.rows.pop(self._key(table, row), None)
        else:
            raise GoJSONError(f"RowsEvent.Action {rows_event.action!r}")

    @staticmethod
    def _key(table: Table, row: list[str | None]) -> tuple[str | None, ...]:
        if len(row) != len(table.columns):
            raise GoJSONError(f"a row of {len(row)} values for {len(table.columns)} columns")
        columns = table.pk_columns or list(range(len(row)))
        return tuple(row[i] for i in columns)
