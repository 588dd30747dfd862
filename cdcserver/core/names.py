"""A table's name: the database and the table, as MariaDB names them.

Every layer names tables this way, from the binlog's table maps to the protocol's requests;
how a name becomes a file name is the store's business (:mod:`cdcserver.store.naming`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    database: str
    table: str

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``db.table`` (``str()``'s inverse); ValueError without both parts."""
        database, dot, table = text.partition(".")
        if not dot or not database or not table:
            raise ValueError(f"expected DB.TABLE, not {text!r}")
        return cls(database, table)
