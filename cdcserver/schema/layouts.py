"""A table's definition as the binlog's layout: the columns and key a version is written in,
whether the binlog's table map agrees with the history's definition, and the names and types
the history gives the binlog's columns."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.core.errors import SchemaError
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import codec_for
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.schema.avrotypes import map_column
from cdcserver.schema.columnspec import ColumnSpec
from cdcserver.schema.definition import TableDefinition

log = logging.getLogger('cdcserver.schema.history')


def stored_shape(definition: TableDefinition) -> tuple[object, ...]:
    """What a new table version follows: the columns and the primary key; not indexes,
    AUTO_INCREMENT, the engine or other options."""
    return (tuple(replace(c, auto_increment=False) for c in definition.columns),
            definition.primary_key)


def layout_of(table: TableName, definition: TableDefinition) -> TableLayout:
    columns = definition.column_defs()
    pk = tuple(definition.index(name) for name in definition.primary_key)
    return TableLayout(table.database, table.table, columns, pk, sequence=definition.sequence,
                       description=definition.describe())


OLD_TEMPORAL = frozenset({T.TIME, T.DATETIME, T.TIMESTAMP})


def signature(col: ColumnDef, full: bool, precise: bool) -> tuple[object, ...]:
    """What must match between the two sources: the Avro mapping, without the types only
    the history knows. Without metadata the binlog knows neither signedness nor which
    columns hold characters; an old-format temporal column does not give its precision."""
    if not full:
        col = replace(col, unsigned=False, charset=None)
    mapping = map_column(replace(col, extended=None))
    return (mapping.kind, json.dumps(mapping.branches), mapping.fsp if precise else None,
            col.unsigned)


def agrees(layout: TableLayout, definition: TableDefinition) -> bool:
    ours = definition.column_defs()
    if len(ours) != len(layout.columns):
        return False
    described = layout.metadata != "none"
    for binlog, history in zip(layout.columns, ours, strict=True):
        if binlog.name and binlog.name.lower() != history.name.lower():
            return False
        precise = binlog.binlog_type not in OLD_TEMPORAL
        if signature(binlog, described, precise) != signature(history, described, precise):
            return False
        for labels in ("enum_values", "set_values"):
            a, b = getattr(binlog, labels), getattr(history, labels)
            if a and b and a != b:
                return False
    return True


def enrich(layout: TableLayout, definition: TableDefinition) -> TableLayout:
    columns = []
    for binlog, spec, history in zip(layout.columns, definition.columns,
                                     definition.column_defs(), strict=True):
        column = replace(
            binlog, name=binlog.name or history.name, extended=history.extended,
            enum_values=binlog.enum_values or history.enum_values,
            set_values=binlog.set_values or history.set_values)
        if layout.metadata == "none":  # the binlog said nothing of signs or character sets
            column = replace(column, unsigned=history.unsigned,
                             charset=_codec(layout, spec) if history.charset else None)
        if binlog.binlog_type in OLD_TEMPORAL:
            column = replace(column, meta=history.meta)  # MariaDB's own fractional format
        columns.append(column)
    pk = layout.primary_key or tuple(definition.index(n) for n in definition.primary_key)
    return replace(layout, columns=tuple(columns), primary_key=pk,
                   description=definition.describe())


def _codec(layout: TableLayout, spec: ColumnSpec) -> str:
    try:
        if spec.charset is None:
            raise LookupError("no character set is known")
        codec = codec_for(spec.charset)
        assert codec is not None
        return codec
    except LookupError as exc:
        raise SchemaError(
            f"{layout.database}.{layout.table}.{spec.name}: the binlog carries no character "
            f"sets and the schema history cannot supply one ({exc}); set "
            "binlog_row_metadata=MINIMAL or FULL on the source") from None


def describe(columns: tuple[ColumnDef, ...]) -> str:
    return ", ".join(f"{c.name or '?'} {map_column(replace(c, extended=None)).real_type}"
                     for c in columns)
