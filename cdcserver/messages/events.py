"""From the replicator's changes to per-row and per-statement events, ready to format.

A Kafka message is about one row change (an update carries its before and after images) or
one schema statement. :class:`EventBuilder` follows the transaction the changes describe and
numbers its records exactly as the Avro store does (``event_number``: 1-based across the
transaction, an update counting two: before and after), so a message can always be matched
with the stream's records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cdcserver.core.capture import RULED_STATEMENT
from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, Gtid
from cdcserver.core.names import TableName
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.schema import Field

SHAPES_PER_TABLE = 4  # layouts of one table whose shapes (a schema each) are kept


@dataclass(frozen=True)
class TableShape:
    """A table's columns as messages describe them: the stream's Avro schema and fields."""

    table: TableName
    schema: TableSchema
    layout: TableLayout
    # What formats and the sink derive from the shape once (encoders, schema ids...), kept
    # with it so it lives exactly as long as the shape.
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def fields(self) -> tuple[Field, ...]:
        return self.schema.columns

    @property
    def primary_key(self) -> tuple[int, ...]:
        return self.layout.primary_key

    def key_values(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The row's primary key (the whole row for a table without one)."""
        pk = self.layout.primary_key
        return tuple(row[i] for i in pk) if pk else row


@dataclass(slots=True)
class RowEvent:
    """One row change, as the sinks' formats read it. Never changed once made; not frozen
    since a frozen dataclass's __init__ (a guarded setattr per field) took a fifth of the
    Kafka sink's time at 13 fields per row."""

    shape: TableShape
    action: str  # insert, update, delete
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None
    gtid: Gtid
    event_number: int  # of the first record (an update's after image is event_number + 1)
    timestamp: int  # the binlog event's, Unix seconds
    file: str
    pos: int  # the binlog event's end position
    row: int  # the row's index within its binlog event
    gtid_text: str = ""  # str(gtid), made once per transaction
    start: int = 0  # where the binlog event starts
    transaction_start: int = 0  # where the transaction's GTID event starts
    # A row of the Kafka sink's initial snapshot (not a change): Debezium's source.snapshot,
    # "true", or "first"/"first_in_data_collection"/"last_in_data_collection"/"last"; "": a
    # change of the stream
    snapshot: str = ""

    @property
    def table(self) -> TableName:
        return self.shape.table


@dataclass(frozen=True)
class RowBatch:
    """The row changes of one binlog row event, in order (formats that send one message per
    row event, as mysql-databus's RowsEvent is, need them together)."""

    rows: tuple[RowEvent, ...]


@dataclass(frozen=True)
class StatementEvent:
    """A schema statement, once per table it changed (``table`` None for one that changed
    no table, such as CREATE DATABASE)."""

    database: str
    table: str | None  # for a rename, the new name
    kind: str  # the statement's: create, alter, drop, rename, truncate, query
    sql: str
    gtid: Gtid
    timestamp: int
    file: str
    pos: int
    shape: TableShape | None  # the table's columns after the statement, when known
    renamed_from: str = ""  # for a rename: the old name, as a reference (TableName.ref)
    start: int = 0  # where the statement's binlog event starts
    transaction_start: int = 0  # where its transaction's GTID event starts
    session_database: str = ""  # the database the statement ran in (its USE)


@dataclass(frozen=True)
class CommitEvent:
    position: BinlogPosition


@dataclass(frozen=True)
class AbortEvent:
    """The open transaction was abandoned (read again after a reconnect, rolled back on the
    primary, or dropped at a pause): what was made of it so far is not part of the stream.
    ``gtid``: the transaction's; ``again``: as :class:`~cdcserver.core.changes.Abort`'s."""

    reason: str
    gtid: str = ""
    again: bool = False


Event = RowBatch | StatementEvent | CommitEvent | AbortEvent


class EventBuilder:
    def __init__(self) -> None:
        self._shapes: dict[int, TableShape] = {}  # by id() of the layout
        # Each table's, newest last: the decoder hands every table a new layout after any
        # DDL, so only the last few are kept, and a table's go at its own schema statement
        self._table_shapes: dict[TableName, list[int]] = {}
        self._gtid: Gtid | None = None
        self._gtid_text = ""
        self._event_no = 0
        self._transaction_start = 0

    def shape(self, layout: TableLayout) -> TableShape:
        key = id(layout)
        shape = self._shapes.get(key)
        if shape is not None and shape.layout is layout:
            return shape
        table = TableName(layout.database, layout.table)
        shape = TableShape(table, TableSchema.from_layout(layout, 1, ""), layout)
        kept = self._table_shapes.setdefault(table, [])
        if key in kept:
            kept.remove(key)
        while len(kept) >= SHAPES_PER_TABLE:
            self._shapes.pop(kept.pop(0), None)
        kept.append(key)
        self._shapes[key] = shape
        return shape

    def _forget(self, table: TableName) -> None:
        """A schema statement changed ``table``: its layouts until now are not seen again."""
        for key in self._table_shapes.pop(table, ()):
            self._shapes.pop(key, None)

    def events(self, changes: list[Change]) -> Iterator[Event]:
        for change in changes:
            if isinstance(change, Rows):
                yield RowBatch(tuple(self._rows(change)))
            elif isinstance(change, Begin):
                self._gtid = change.gtid
                self._gtid_text = str(change.gtid)
                self._event_no = 0
                self._transaction_start = change.pos
            elif isinstance(change, Ddl):
                yield from self._statement(change)
            elif isinstance(change, Commit):
                self._gtid = None
                yield CommitEvent(change.position)
            elif isinstance(change, Abort):  # the transaction is read again after a reconnect
                gtid, self._gtid = self._gtid_text if self._gtid is not None else "", None
                yield AbortEvent(change.reason, gtid, change.again)
            # (a marker inside the transaction, Rowless, Quarantine, Release, ends nothing)

    def _rows(self, rows: Rows) -> Iterator[RowEvent]:
        assert self._gtid is not None, "rows outside a transaction"
        shape = self.shape(rows.layout)
        gtid, text, values = self._gtid, self._gtid_text, rows.rows
        if rows.kind == RowsKind.UPDATE:
            for i in range(0, len(values) - 1, 2):
                self._event_no += 2
                yield RowEvent(shape, "update", values[i], values[i + 1], gtid,
                               self._event_no - 1, rows.timestamp, rows.file, rows.pos, i // 2,
                               text, rows.start, self._transaction_start)
            return
        insert = rows.kind == RowsKind.INSERT
        for i, row in enumerate(values):
            self._event_no += 1
            yield RowEvent(shape, "insert" if insert else "delete", None if insert else row,
                           row if insert else None, gtid, self._event_no, rows.timestamp,
                           rows.file, rows.pos, i, text, rows.start, self._transaction_start)

    def _statement(self, ddl: Ddl) -> Iterator[StatementEvent]:
        assert self._gtid is not None, "a statement outside a transaction"
        kind = ddl.kind if ddl.kind != "query" else _statement_kind(ddl.sql)
        if not ddl.changes:
            yield StatementEvent(ddl.database, None, kind, ddl.sql, self._gtid, ddl.timestamp,
                                 ddl.file, ddl.pos, None, "", ddl.start,
                                 self._transaction_start, ddl.database)
            return
        for change in ddl.changes:
            self._forget(TableName(change.database, change.table))
            if kind == "rename" and change.kind == "drop":
                continue  # a rename is told once, under the new name
            shape = self.shape(change.layout) if change.layout is not None else None
            ruled = change.layout is not None and change.layout.image is not None
            sql = RULED_STATEMENT if ruled else ddl.sql
            yield StatementEvent(change.database, change.table, kind, sql, self._gtid,
                                 ddl.timestamp, ddl.file, ddl.pos, shape,
                                 change.renamed.ref() if kind == "rename" and change.renamed
                                 else "", ddl.start,
                                 self._transaction_start, ddl.database)


def _statement_kind(sql: str) -> str:
    """create/drop/alter for a statement that changed no known table (CREATE DATABASE...)."""
    words = sql.lstrip("( \t\r\n").split(None, 1)
    first = words[0].lower() if words else ""
    return first if first in ("create", "drop", "alter", "rename", "truncate") else "query"
