"""What ``[capture]`` selects of a source's tables, and what its column rules do to them, in words
(``cdcserver check``, and the dumps of every captured table)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdcserver.core.capture import CaptureFilter
from cdcserver.core.config import SourceAddress
from cdcserver.core.names import TableName
from cdcserver.replication import source as source_sql
from cdcserver.schema.masking import describe_columns
from mariadb_cdc_client.format.names import table_ref


@dataclass(frozen=True)
class Selection:
    """What ``[capture]`` selects of the source's tables (``cdcserver check``)."""

    captured: list[TableName]
    left_out: list[tuple[TableName, str]]  # and why
    columns: list[tuple[TableName, list[str]]] = field(default_factory=list)  # rules, in words
    rules: list[str] = field(default_factory=list)  # the column rules as configured

    def text(self, shown: int = 20) -> str:
        def names(tables: list[TableName]) -> str:
            listed = ", ".join(table_ref(t.database, t.table) for t in tables[:shown])
            return listed + (f", and {len(tables) - shown} more" if len(tables) > shown else "")

        lines = [f"capture: {len(self.captured)} tables captured"
                 + (f": {names(self.captured)}" if self.captured else "")]
        reasons: dict[str, list[TableName]] = {}
        for table, why in self.left_out:
            if not why.startswith(("the system schemas", "the password tables")):
                reasons.setdefault(why, []).append(table)
        for why, tables in reasons.items():
            lines.append(f"capture: {len(tables)} left out, {why}: {names(tables)}")
        if self.rules:
            lines.append(f"columns: rules {'; '.join(self.rules)}")
            if not self.columns:
                lines.append("columns: no rule names a column of a captured table")
        for table, what in self.columns:
            lines.append(f"columns: {table_ref(table.database, table.table)}: "
                         f"{', '.join(what)}")
        return "\n".join(lines)


def capture_selection(address: SourceAddress, capture: CaptureFilter) -> Selection:
    """The source's base tables outside the system schemas, as the filter sorts them."""
    conn = source_sql.connect(address)
    try:
        rows = source_sql.query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM "
                                      "information_schema.TABLES WHERE TABLE_TYPE IN "
                                      "('BASE TABLE', 'SYSTEM VERSIONED') ORDER BY 1, 2")
        captured, left_out = [], []
        for database, name in rows:
            table = TableName(str(database), str(name))
            why = capture.why_not(table)
            if why is None:
                captured.append(table)
            else:
                left_out.append((table, why))
        rules = capture.columns
        columns = [(t, described) for t in captured if rules.touches(t)
                   if (described := describe_columns(rules, t, _columns(conn, t)))]
    finally:
        conn.close()
    return Selection(captured, left_out, columns, rules.describe())


def _columns(conn: Any, table: TableName) -> list[tuple[str, str, bool]]:
    rows = source_sql.query(conn, "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_KEY FROM "
                                  "information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                                  "TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                            (table.database, table.table))
    return [(str(name), str(kind), str(key) == "PRI") for name, kind, key in rows]
