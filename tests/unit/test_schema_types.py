"""A value's type never changes because the schema history lost a table: the columns only
DDL can type (UUID, INET4, INET6, JSON) keep their type by name, from the source's definition
now or the table's last known one. (The history is driven directly here; no service.)"""

from __future__ import annotations

from dataclasses import replace

from cdcserver.core.names import TableName
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.layouts import layout_of

TABLE = TableName("db", "u")
CREATE = "CREATE TABLE u (id INT PRIMARY KEY, a UUID, b INET6, c INET4, j JSON, x BINARY(16))"


def _table_map(history: SchemaHistory, *extra: str) -> object:
    """The binlog's table map for the table as ``history`` knows it plus ``extra`` columns:
    no extended types (the binlog cannot carry them)."""
    scratch = SchemaHistory(None)
    scratch.apply(CREATE[:-1] + "".join(f", {e}" for e in extra) + ")", "db", None)
    layout = layout_of(TABLE, scratch.tables[TABLE])
    return replace(layout, columns=tuple(replace(c, extended=None) for c in layout.columns))


def _types(layout: object) -> dict[str, str | None]:
    return {c.name: c.extended for c in layout.columns}  # type: ignore[attr-defined]


def test_a_forgotten_table_keeps_its_column_types():
    history = SchemaHistory(None, lookup=lambda table: None)  # the table is gone now
    history.apply(CREATE, "db", None)
    history.forget(TABLE)
    layout = history.reconcile(_table_map(history, "n INT"), None)  # type: ignore[arg-type]
    assert _types(layout) == {"id": None, "a": "uuid", "b": "inet6", "c": "inet4",
                              "j": "json", "x": None, "n": None}


def test_an_unreadable_statement_keeps_column_types():
    history = SchemaHistory(None, lookup=lambda table: None)
    history.apply(CREATE, "db", None)
    history.apply("ALTER TABLE u ADD COLUMN n INT, ADD FROBNICATE 7", "db", None)
    assert TABLE in history.unknown
    layout = history.reconcile(_table_map(history, "n INT"), None)  # type: ignore[arg-type]
    assert _types(layout)["a"] == "uuid" and _types(layout)["b"] == "inet6"


def test_the_source_definition_now_wins_over_the_last_known():
    history = SchemaHistory(None, lookup=lambda table: (
        "CREATE TABLE u (id INT PRIMARY KEY, a BINARY(16), b INET6, c INET4, j JSON,"
        " x UUID, n INT, m INT)"))
    history.apply(CREATE, "db", None)
    history.forget(TABLE)
    # the table map has one more column than the source's definition: not adopted whole
    layout = history.reconcile(_table_map(history, "n INT"), None)  # type: ignore[arg-type]
    assert _types(layout) == {"id": None, "a": None, "b": "inet6", "c": "inet4",
                              "j": "json", "x": "uuid", "n": None}
