"""Which tables the service captures: never the system schemas' unless named, never the
password tables.

``mysql``, ``information_schema``, ``performance_schema`` and ``sys`` hold the server's own
data; ``mysql.global_priv`` (and the view ``mysql.user`` before it) hold every account's
password hash. A replication user with ``SELECT ON *.*`` (what dumps need) could otherwise
dump them, and the service would stream their changes to any client allowed every table.
Their tables are captured, streamed and dumped only when ``[capture] system_tables`` names
them one by one; the password tables never are.
"""

from __future__ import annotations

from collections.abc import Iterable

from cdcserver.core.names import TableName

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
NEVER = frozenset({("mysql", "global_priv"), ("mysql", "user")})  # password hashes


class CaptureFilter:
    def __init__(self, system_tables: Iterable[TableName] = ()) -> None:
        self.system_tables = frozenset(
            t for t in system_tables if (t.database.lower(), t.table.lower()) not in NEVER)

    @classmethod
    def parse(cls, text: str) -> CaptureFilter:
        """``db.table,db.table`` (as ``[capture] system_tables`` holds them)."""
        return cls(TableName.parse(item.strip()) for item in text.split(",") if item.strip())

    def captures(self, database: str, table: str) -> bool:
        if (database.lower(), table.lower()) in NEVER:
            return False
        if database.lower() in SYSTEM_SCHEMAS:
            return TableName(database, table) in self.system_tables
        return True

    def captures_table(self, table: TableName) -> bool:
        return self.captures(table.database, table.table)


EVERY_USER_TABLE = CaptureFilter()
