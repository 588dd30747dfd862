"""A table's stored versions frozen at one moment, for a fold beside the stream.

A whole-table repair read beside the stream (:mod:`.beside`) folds the table's stored versions
as they were at the transaction that made the change, in a process of its own, while the store
goes on writing: :class:`FrozenCatalog` holds their committed sizes then (and those of the
tables a rename brought the table's rows from), and is pickled to that process.
"""

from __future__ import annotations

from dataclasses import replace

from cdcserver.core.names import TableName
from cdcserver.store.catalog import Catalog, TableEntry


class FrozenCatalog:
    """A table's stored versions as they were at one moment (and those of the tables a
    rename brought its rows from): what a fold reads while the store goes on writing."""

    def __init__(self, catalog: Catalog, table: TableName) -> None:
        self.entries: dict[TableName, TableEntry] = {}
        self._freeze(catalog, table)

    def _freeze(self, catalog: Catalog, table: TableName) -> None:
        """The table's entry and those of every table a rename brought rows from, down the
        chain (walked, not recursed: a table swapped thousands of times)."""
        waiting = [table]
        while waiting:
            table = waiting.pop()
            entry = catalog.get(table)
            if entry is None or table in self.entries:
                continue
            self.entries[table] = TableEntry(table, {
                number: replace(info, notes=dict(info.notes))
                for number, info in entry.versions.items()})
            for info in entry.versions.values():
                if info.ddl.renamed_from is not None:
                    waiting.append(info.ddl.renamed_from)

    def get(self, table: TableName) -> TableEntry | None:
        return self.entries.get(table)
