"""The schema history: each table's definition at the replication position, from DDL.

Row data is always decoded with the binlog's own table map; the history is the second source.
It supplies what the binlog cannot say (INET4, INET6, UUID and JSON columns travel as BINARY and
LONGTEXT; column names and ENUM/SET labels when ``binlog_row_metadata`` is not FULL), tells the
store what each DDL statement did, and is checked against every new table map: when a table's
history and its table map disagree, replication stops with an error instead of labelling
rows wrongly.

Where definitions come from:
- replayed DDL (``CREATE``/``ALTER``/``RENAME``/``DROP``/``TRUNCATE``, :mod:`.ddl`);
- for a table whose creation predates the binlog, ``SHOW CREATE TABLE`` on the source, adopted
  only if it agrees with the table map being decoded (the table may have changed since the
  position being replicated; then the table stays unknown and the lookup is tried again at its
  next layout; :mod:`.fromsource`).

Each change is appended to ``state/schema_history.jsonl`` with the GTID of its transaction and
fsynced. On start, entries the replication start position does not cover are dropped: they
will be replayed (:mod:`.historyfile`). An ``ALTER TABLE``'s actions are applied by
:mod:`.applyalter`; foreign keys follow a renamed parent by :mod:`.foreignkeys`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from cdcserver.core.changes import TableChange, TableLayout
from cdcserver.core.errors import SchemaError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.schema import ddl
from cdcserver.schema.alter import column_renames
from cdcserver.schema.applyalter import MAY_REWRITE, Applied, apply_actions
from cdcserver.schema.definition import ForeignKey, TableDefinition
from cdcserver.schema.foreignkeys import (
    referencing,
    with_renamed_parent,
    with_renamed_parent_column,
)
from cdcserver.schema.fromsource import (
    Lookup,
    LookupFailed,
    described_by,
    source_definition,
    typed_by_name,
)
from cdcserver.schema.historyfile import append_change, compact_history, read_history
from cdcserver.schema.layouts import agrees, describe, enrich, layout_of, stored_shape
from cdcserver.schema.statements import (
    AlterTable,
    CreateTable,
    DropDatabase,
    DropTables,
    RenameTables,
    RenameTo,
    RowsChanged,
    TruncateTable,
    Unparsed,
)

log = logging.getLogger(__name__)

TRANSACTIONAL_ENGINES = frozenset({"innodb", "xtradb", "rocksdb", "tokudb"})


class SchemaHistory:
    def __init__(self, path: str | None, lookup: Lookup | None = None) -> None:
        self.path = path
        self.lookup = lookup
        self.tables: dict[TableName, TableDefinition] = {}
        self.unknown: set[TableName] = set()
        self.relearned: list[TableName] = []  # disagreed with a table map (reconcile)
        # what a table was before it became unknown: its columns' types are kept by name
        self.last_known: dict[TableName, TableDefinition] = {}
        self._looked_up: dict[TableName, TableDefinition | None] = {}  # by the last bootstrap
        # children_of for every parent, built when first asked after a change (every rows
        # event asks; scanning every table each time made a commit's cost grow with them)
        self._children: dict[TableName, list[tuple[TableName, ForeignKey]]] | None = None

    # -- persistence ---------------------------------------------------------------------

    def load(self, start: GtidState) -> None:
        """Read the history up to ``start`` and compact the file to that."""
        self.tables.clear()
        self._children = None
        if self.path is None or not os.path.exists(self.path):
            return
        self.tables.update(read_history(self.path, start))
        compact_history(self.path, self.tables)

    def _record(self, table: TableName, definition: TableDefinition | None,
                gtid: Gtid | None) -> None:
        self._children = None
        if definition is None:
            self.tables.pop(table, None)
        else:
            self.tables[table] = definition
            self.unknown.discard(table)
        if self.path is not None:
            append_change(self.path, table, definition, gtid)

    def _forget(self, table: TableName, gtid: Gtid | None, why: str) -> None:
        if table in self.tables:
            log.warning("schema history: %s is now unknown (%s)", table, why)
            self.last_known[table] = self.tables[table]
        self._record(table, None, gtid)
        self.unknown.add(table)

    # -- DDL -------------------------------------------------------------------------------

    def apply(self, sql: str, database: str, gtid: Gtid | None) -> tuple[str, tuple[TableChange,
                                                                                   ...]]:
        """Replay one statement; returns its kind and its effect on each table."""
        statement = ddl.parse(sql, database)
        if isinstance(statement, CreateTable):
            return "create", self._create(statement, gtid)
        if isinstance(statement, AlterTable):
            return self._alter(statement, gtid)
        if isinstance(statement, RenameTables):
            moves: list[TableChange] = []
            for old, new in statement.pairs:
                moves += self._move(old, new, self.tables.get(old), gtid)
            return "rename", tuple(moves)
        if isinstance(statement, DropTables):
            return "drop", tuple(self._drop(t, gtid) for t in statement.tables)
        if isinstance(statement, TruncateTable):
            table = statement.table
            return "truncate", (TableChange("truncate", table.database, table.table,
                                            self._layout(table)),)
        if isinstance(statement, DropDatabase):
            gone = [t for t in self.tables if t.database == statement.database]
            return "drop", tuple(self._drop(t, gtid) for t in gone)
        if isinstance(statement, Unparsed):
            log.warning("schema history: %s", statement.reason)
            for table in statement.tables:
                self._forget(table, gtid, "a statement could not be read")
            return "query", tuple(TableChange("alter", t.database, t.table)
                                  for t in statement.tables)
        return "query", ()

    def _create(self, statement: CreateTable, gtid: Gtid | None) -> tuple[TableChange, ...]:
        table = statement.table
        if statement.if_not_exists and table in self.tables:
            return ()
        definition = statement.definition
        if statement.like is not None:
            definition = self.tables.get(statement.like)
        if definition is None:
            self._forget(table, gtid, f"created like unknown {statement.like}")
            return (TableChange("create", table.database, table.table),)
        self._record(table, definition, gtid)
        return (TableChange("create", table.database, table.table, self._layout(table)),)

    def _alter(self, statement: AlterTable, gtid: Gtid | None
               ) -> tuple[str, tuple[TableChange, ...]]:
        table = statement.table
        before = self.tables.get(table)
        applied = apply_actions(table, before, statement.actions)
        for old, new in applied.renamed_columns:
            self._rename_referenced(table, old, new, gtid)
        if applied.renamed_to is not None:
            only_rename = all(isinstance(a, RenameTo) for a in statement.actions)
            return ("rename" if only_rename else "alter",
                    tuple(self._move(table, applied.renamed_to, applied.definition, gtid)))
        if applied.definition is None:
            return "alter", (self._altered_unknown(table, statement, applied.moved, gtid),)
        return "alter", tuple(self._altered(table, before, applied,
                                            column_renames(statement.actions, before), gtid))

    def _altered_unknown(self, table: TableName, statement: AlterTable,
                         moved: list[RowsChanged], gtid: Gtid | None) -> TableChange:
        """The table is forgotten (its columns are learned again); its rows are read again
        where the statement may have changed them."""
        self._forget(table, gtid, "altered while unknown or in a way not understood")
        reasons = [m.reason for m in moved]
        if any(isinstance(a, MAY_REWRITE) for a in statement.actions):
            # The old columns are unknown, so whether their values survived cannot be told:
            # the table is read again (a narrowing MODIFY after `schema forget`)
            reasons.append("an ALTER of a table whose columns were unknown may have "
                           "rewritten its values")
        return TableChange("alter", table.database, table.table, rewrites="; ".join(reasons))

    def _altered(self, table: TableName, before: TableDefinition | None, applied: Applied,
                 renames: tuple[tuple[str, str], ...], gtid: Gtid | None
                 ) -> list[TableChange]:
        definition = applied.definition
        assert definition is not None
        rewrites = [m.reason for m in applied.moved] + applied.rewrites
        changed = before is None or bool(rewrites) or stored_shape(definition) != \
            stored_shape(before)
        self._record(table, definition, gtid)
        changes = [TableChange("alter", table.database, table.table, self._layout(table),
                               changed=changed, rewrites="; ".join(rewrites),
                               renamed_columns=renames,
                               previous=None if before is None else layout_of(table, before))]
        for move in applied.moved:
            if move.other is not None:
                changes += self._moved_rows(move, definition, gtid)
        return changes

    def _moved_rows(self, move: RowsChanged, definition: TableDefinition,
                    gtid: Gtid | None) -> list[TableChange]:
        """The other table of a partition exchange or conversion."""
        other = move.other
        assert other is not None
        if move.other_fate == "dropped":
            return [self._drop(other, gtid)]
        if move.other_fate == "created":
            self._record(other, replace(definition, foreign_keys=()), gtid)
            return [TableChange("create", other.database, other.table, self._layout(other),
                                rewrites=move.reason)]
        return [TableChange("alter", other.database, other.table, self._layout(other),
                            rewrites=move.reason)]

    def _move(self, old: TableName, new: TableName, definition: TableDefinition | None,
              gtid: Gtid | None) -> list[TableChange]:
        self._repoint(old, new, gtid)
        if definition is not None:  # a key of the table on itself follows it too
            definition = referencing(definition, old, new)
        self._record(old, None, gtid)
        self.unknown.discard(old)
        if definition is None:
            self._forget(new, gtid, f"renamed from unknown {old}")
        else:
            self._record(new, definition, gtid)
        return [TableChange("drop", old.database, old.table, note=f"renamed to {new.ref()}",
                            renamed=new),
                TableChange("create", new.database, new.table, self._layout(new),
                            note=f"renamed from {old.ref()}", renamed=old)]

    def _drop(self, table: TableName, gtid: Gtid | None) -> TableChange:
        self._record(table, None, gtid)
        self.unknown.discard(table)
        return TableChange("drop", table.database, table.table)

    def _layout(self, table: TableName) -> TableLayout | None:
        definition = self.tables.get(table)
        if definition is None:
            return None
        return layout_of(table, definition)

    # -- table maps ------------------------------------------------------------------------

    def reconcile(self, layout: TableLayout, gtid: Gtid | None) -> TableLayout:
        """Check a table map against the history and add what only the history knows. Where
        the two disagree the history missed a schema change: the table is learned again
        (from the source, once it agrees; until then from the binlog's own columns), and
        :meth:`take_relearned` names it, so that the stream re-reads its rows (a change the
        history missed may have rewritten them)."""
        table = TableName(layout.database, layout.table)
        definition = self.tables.get(table)
        if definition is not None and not agrees(layout, definition):
            self._forget(table, gtid, f"the binlog's table map ({describe(layout.columns)}) "
                         f"disagrees with the history ({describe(definition.column_defs())})")
            self.relearned.append(table)
            definition = None
        if definition is None:
            definition = self._bootstrap(table, layout, gtid)
        elif not definition.described and agrees(layout, definition):
            definition = self._describe(table, layout, definition, gtid)
        if definition is None:
            if any(not c.name for c in layout.columns):
                raise SchemaError(
                    f"the binlog has no column names for {table} and the schema history "
                    "cannot supply them: set binlog_row_metadata=FULL on the source "
                    "(SET GLOBAL binlog_row_metadata=FULL)")
            return self._typed_by_name(table, layout)
        return enrich(layout, definition)

    def _typed_by_name(self, table: TableName, layout: TableLayout) -> TableLayout:
        """An unknown table's layout, with the types only DDL can tell that the source's
        definition now, or the table's last known one, gives its columns by name."""
        return typed_by_name(layout, [d for d in (self._looked_up.get(table),
                                                  self.last_known.get(table))
                                      if d is not None])

    def _bootstrap(self, table: TableName, layout: TableLayout, gtid: Gtid | None
                   ) -> TableDefinition | None:
        if self.lookup is None:
            return None
        try:  # (a failed lookup leaves the table unknown)
            definition = source_definition(self.lookup, table, "definition")
        except LookupFailed:
            return None
        if definition is None:
            self.unknown.add(table)
            return None
        self._looked_up[table] = definition
        if not agrees(layout, definition):
            if table not in self.unknown:
                log.info("schema history: %s has changed since the position being "
                         "replicated; its extended types are unknown until it matches again",
                         table)
            self.unknown.add(table)
            return None
        self._record(table, definition, gtid)
        log.info("schema history: learned %s from the source", table)
        return definition

    def _describe(self, table: TableName, layout: TableLayout, definition: TableDefinition,
                  gtid: Gtid | None) -> TableDefinition:
        """A definition recorded before the history kept indexes and AUTO_INCREMENT: the
        source's, when it agrees with the table map and with the recorded columns (else it
        stays as it is, and is tried again at the table's next layout)."""
        if self.lookup is None:
            return definition
        try:  # (a failed lookup leaves it as it is)
            found = source_definition(self.lookup, table, "definition")
        except LookupFailed:
            return definition
        described = None if found is None else described_by(definition, found, layout)
        if described is None:
            return definition
        self._record(table, described, gtid)
        log.info("schema history: learned the indexes of %s from the source", table)
        return described

    def transactional(self, table: TableName) -> bool:
        """Whether ``table`` is known to use an engine that rolls back (InnoDB and kin)."""
        definition = self.tables.get(table)
        engine = definition.engine if definition is not None else None
        if engine is None and self.lookup is not None:
            try:  # (unknown means "not known transactional")
                found = source_definition(self.lookup, table, "engine")
            except LookupFailed:
                found = None
            if found is not None:
                engine = found.engine
        return engine in TRANSACTIONAL_ENGINES

    def take_relearned(self) -> list[TableName]:
        """The tables learned again since the last call (see :meth:`reconcile`)."""
        tables, self.relearned = self.relearned, []
        return tables

    def forget(self, table: TableName) -> None:
        self._forget(table, None, "forgotten on request")

    def is_sequence(self, table: TableName) -> bool:
        """Whether the table is a SEQUENCE (one row, which each write replaces)."""
        definition = self.tables.get(table)
        return definition is not None and definition.sequence

    def children_of(self, parent: TableName) -> list[tuple[TableName, ForeignKey]]:
        """The known foreign keys whose parent is ``parent``: each child table with its key.
        Only InnoDB (and kin) keep foreign keys; other engines parse and ignore them."""
        if self._children is None:
            self._children = {}
            for child, definition in self.tables.items():
                if definition.engine is not None and definition.engine not in \
                        TRANSACTIONAL_ENGINES:
                    continue
                for key in definition.foreign_keys:
                    self._children.setdefault(TableName(*key.parent), []).append((child, key))
        return list(self._children.get(parent, ()))

    def _rename_referenced(self, parent: TableName, old: str, new: str,
                           gtid: Gtid | None) -> None:
        """A parent's column renamed: the foreign keys on it name the new column."""
        for child, definition in with_renamed_parent_column(self.tables, parent, old,
                                                            new).items():
            self._record(child, definition, gtid)

    def _repoint(self, old: TableName, new: TableName, gtid: Gtid | None) -> None:
        """A renamed table's children reference it by its new name (InnoDB does so)."""
        for child, definition in with_renamed_parent(self.tables, old, new).items():
            self._record(child, definition, gtid)
