"""How the stream's view of a table differs from the source's rows at a watermark, and the
records that bring the stream to the source's rows (:mod:`cdcserver.reread.repair` reads
both; this module compares them and writes the records)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdcserver.core.changes import (
    Commit,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, binlog_ordinal, same_state
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.tableview import Row, TableView
from cdcserver.reread.values import from_text
from cdcserver.reread.view import key_names
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.schema import Field, Kind


@dataclass
class Scope:
    """The rows of one table a repair covers: ``keys`` (None: every row) and what the
    source held for them at the watermark."""

    table: TableName
    layout: TableLayout | None  # None until read: the stream did not know the columns
    reason: str
    keys: set[bytes] | None
    source: dict[bytes, tuple[Row, int]] = field(default_factory=dict)
    key: tuple[str, ...] | None = None  # the view's, once read (:func:`view_key`)




def view_key(stream: TableLayout | None, source: TableLayout | None) -> tuple[str, ...]:
    """The key a scope's view and the source's rows are compared under: the stream's
    primary key and the source's together. The source's alone may be narrower where it has
    moved on (a swap put another table under the name, versioning was dropped since):
    rows the stream keeps apart, a row and its history rows, would merge in the view, and
    be lost where a rename the store does not hold yet allows no fold again. A column only
    one side has is NULL on the other, so neither side's rows merge."""
    stream_key = key_names(stream) if stream is not None else ()
    source_key = key_names(source) if source is not None else ()
    if not stream_key or not source_key:  # no key: the view is a multiset of whole rows
        return stream_key if stream is not None else source_key
    return stream_key + tuple(c for c in source_key if c not in stream_key)


def differences(view: TableView, scope: Scope) -> list[tuple[Row | None, Row | None]]:
    """(the view's row, the source's row) for each row that differs; None where absent."""
    changed: list[tuple[Row | None, Row | None]] = []
    if view.key and scope.keys is None:  # the whole table: one pass over the view's rows
        seen: set[bytes] = set()
        for row, _ in view.rows():
            key = view.key_of(row)
            seen.add(key)
            known = scope.source.get(key)
            if known is None or not same_row(row, known[0]):
                changed.append((row, None if known is None else known[0]))
        changed += [(None, row) for key, (row, _) in scope.source.items() if key not in seen]
        return changed
    if view.key:
        assert scope.keys is not None
        for key in set(scope.keys):
            mine = view.get(key)
            theirs = scope.source.get(key)
            source_row = theirs[0] if theirs else None
            if mine is None and source_row is None:
                continue
            if mine is None or source_row is None or not same_row(mine, source_row):
                changed.append((mine, source_row))
        return changed
    mine_counts: dict[bytes, tuple[Row, int]] = {view.key_of(r): (r, n) for r, n in view.rows()}
    for key in set(mine_counts) | set(scope.source):
        row_a, a = mine_counts.get(key, (None, 0))
        row_b, b = scope.source.get(key, (None, 0))
        changed += [(row_a, None)] * max(a - b, 0) + [(None, row_b)] * max(b - a, 0)
    return changed


def same_row(mine: Row, theirs: Row) -> bool:
    """A column the stream's row lacks (added after the row was sent) is NULL to a
    consumer: the same as the source's NULL, different from any default value."""
    return all(mine.get(name) == value for name, value in theirs.items())


def records(scope: Scope, view: TableView, note: str, commit: Commit) -> list[Rows]:
    layout = scope.layout
    assert layout is not None, "a scope is read before its records are made"
    names = [c.name for c in layout.columns]

    def values(row: Row) -> tuple[Any, ...]:
        return tuple(row.get(n) for n in names)

    inserts, updates, deletes = [], [], []
    changed = differences(view, scope)
    fit = Fit(layout)
    for mine, theirs in changed:
        if mine is None and theirs is not None:
            inserts.append(values(theirs))
        elif theirs is None and mine is not None:
            deletes.append(values(fit(mine, None)))
        elif mine is not None and theirs is not None:
            updates += [values(fit(mine, theirs)), values(theirs)]
    if layout.sequence and len(deletes) == len(inserts) == 1:  # its one row, changed
        updates, deletes, inserts = [deletes[0], inserts[0]], [], []
    out = []
    for kind, rows in ((RowsKind.DELETE, deletes), (RowsKind.UPDATE, updates),
                       (RowsKind.INSERT, inserts)):
        if rows:
            out.append(Rows(layout, kind, commit.timestamp, _sorted(rows, layout, kind),
                            commit.position.file, commit.position.pos, repair=note))
    return out


class Fit:
    """A row as the stream last had it, in the table's columns now. A value whose Python
    type the column's type does not hold (a column an ALTER retyped: a DATETIME that became
    a DECIMAL, an INT that became a VARCHAR) is converted the way its text reads in the new
    type; failing that it is the source's value, or NULL. Whatever ``mine`` holds, the store
    can write the result."""

    def __init__(self, layout: TableLayout) -> None:
        fields = TableSchema.from_layout(layout, 0, "").columns
        self.fields = {f.column: f for f in fields}
        self.converters = {f.column: from_text(f) for f in fields}

    def __call__(self, mine: Row, theirs: Row | None) -> Row:
        row = dict(mine)
        for name, value in mine.items():
            field = self.fields.get(name)
            if value is None or field is None or holds(field, value):
                continue
            try:
                converted = self.converters[name](_text(value))
            except (ValueError, TypeError, ArithmeticError, UnicodeError, OverflowError):
                converted = None
            if converted is None or not holds(field, converted):
                converted = theirs.get(name) if theirs is not None else None
            row[name] = converted
        return row


_HELD: dict[Kind, tuple[type, ...]] = {
    Kind.BOOLEAN: (int,), Kind.INT: (int,), Kind.LONG: (int,), Kind.FLOAT: (float, int),
    Kind.DOUBLE: (float, int), Kind.DECIMAL: (Decimal, int), Kind.STRING: (str,),
    Kind.ENUM: (str,), Kind.BYTES: (bytes, bytearray), Kind.UUID: (str,),
    Kind.DATE: (dt.date, str), Kind.DATETIME: (dt.datetime, str),
    Kind.TIMESTAMP: (dt.datetime, str), Kind.TIME: (dt.timedelta, str), Kind.NULL: (),
}


def holds(field: Field, value: Any) -> bool:
    """Whether the store writes ``value`` in ``field`` (the binlog decoder's types; MariaDB's
    text for a zero or partial date)."""
    if isinstance(value, bool):
        return False
    if field.kind == Kind.DATE and isinstance(value, dt.datetime):
        return False  # a datetime is a date in Python, not in the store
    return isinstance(value, _HELD.get(field.kind, ()))


def _text(value: Any) -> bytes:
    """A value as MariaDB prints it (what ``from_text`` reads)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None).isoformat(sep=" ").encode()
    if isinstance(value, dt.timedelta):
        seconds = int(value.total_seconds())
        sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
        return f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}".encode()
    return str(value).encode("utf-8", "surrogateescape")


def _sorted(rows: list[tuple[Any, ...]], layout: TableLayout, kind: RowsKind
            ) -> Sequence[tuple[Any, ...]]:
    """In key order, so that two services make the same records (pairs stay together)."""
    key = layout.primary_key or tuple(range(len(layout.columns)))

    def order(row: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(repr(row[i]) for i in key)

    if kind != RowsKind.UPDATE:
        return sorted(rows, key=order)
    pairs = sorted(zip(rows[::2], rows[1::2], strict=True), key=lambda p: order(p[0]))
    return [row for pair in pairs for row in pair]


def same_shape(a: TableLayout, b: TableLayout) -> bool:
    """Whether rows of ``a`` and ``b`` are the same Avro records: the same columns, in
    the same order, of the same types, under the same primary key."""
    first, second = TableSchema.from_layout(a, 0, ""), TableSchema.from_layout(b, 0, "")
    return (first.avsc["fields"] == second.avsc["fields"]
            and first.avsc.get("primary_key") == second.avsc.get("primary_key"))


def reached(position: BinlogPosition, point: SnapshotPoint) -> bool:
    """Whether the stream, right after the transaction that ends at ``position``, stands at
    the watermark (or has passed it: the merge step kept the repair exact)."""
    return Stand(position).reached(point)


class Stand:
    """Where the stream stands right after a transaction, told against many watermarks:
    each in a comparison or two (a stream that lags holds thousands of repairs waiting)."""

    __slots__ = ("ordinal", "position", "sequences")

    def __init__(self, position: BinlogPosition) -> None:
        self.position = position
        self.ordinal = binlog_ordinal(position.file, position.pos) if position.file else None
        self.sequences = position.gtid_state.sequences()

    def reached(self, point: SnapshotPoint) -> bool:
        """:func:`reached`: at the watermark's GTID state, or at or past its position."""
        if self.ordinal is not None and self.ordinal >= point.ordinal:
            return True
        return self.sequences == point.sequences and \
            same_state(self.position.gtid_state, point.gtid)


def past_watermark(file: str, pos: int, point: SnapshotPoint) -> bool:
    """Whether the binlog event ending at ``file``:``pos`` comes after the watermark (a change
    the read at ``point`` does not hold yet)."""
    return bool(file) and binlog_ordinal(file, pos) > point.ordinal
