"""A table's name: the database and the table, as MariaDB names them.

Every layer names tables this way, from the binlog's table maps to the protocol's requests;
how a name becomes a file name is the store's business (:mod:`cdcserver.store.naming`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mariadb_cdc_client.format.names import BadTableRef, parse_table, table_ref


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    database: str
    table: str

    def __str__(self) -> str:
        """For people: ``db.table`` as written, which two tables share when a name holds a
        dot (``a.b`` . ``c`` and ``a`` . ``b.c``); :meth:`ref` is one text per table."""
        return f"{self.database}.{self.table}"

    def ref(self) -> str:
        """The table as the protocol names it (``LIST-TABLES``' ``ref``): ``db.table``, a
        name quoted only when it needs it (a dot, a space...), so each table has its own."""
        return table_ref(self.database, self.table)

    @classmethod
    def from_ref(cls, text: str) -> TableName:
        """:meth:`ref`'s inverse. A name written before references were (``db.table``
        unquoted, in files of older versions) is split at its first dot, as it was then."""
        try:
            parsed = parse_table(text)
        except BadTableRef:
            return cls.parse(text)
        return cls(parsed.database, parsed.table)

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``db.table`` (``str()``'s inverse); ValueError without both parts."""
        database, dot, table = text.partition(".")
        if not dot or not database or not table:
            raise ValueError(f"expected DB.TABLE, not {text!r}")
        return cls(database, table)
