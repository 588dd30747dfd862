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
  next layout).

Each change is appended to ``state/schema_history.jsonl`` with the GTID of its transaction and
fsynced. On start, entries the replication start position does not cover are dropped: they
will be replayed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cdcserver.core.changes import ColumnDef, Index, TableChange, TableLayout
from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import SchemaError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import codec_for
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.schema import ddl
from cdcserver.schema.avrotypes import map_column
from cdcserver.schema.definition import (
    CHARACTER_TYPES,
    IMPLICIT_ROW_END,
    IMPLICIT_ROW_START,
    ColumnSpec,
    ForeignKey,
    TableDefinition,
    named,
    with_foreign_key_index,
    with_index,
)
from cdcserver.schema.rewrites import action_rewrites

log = logging.getLogger(__name__)

Lookup = Callable[[TableName], str | None]  # SHOW CREATE TABLE text now, None if no table
TRANSACTIONAL_ENGINES = frozenset({"innodb", "xtradb", "rocksdb", "tokudb"})
# ALTER actions that can rewrite stored values (rewrites.py judges them when the old columns
# are known; on a table whose columns are not, each of them means a re-read)
_MAY_REWRITE = (ddl.ChangeColumn, ddl.AddColumns, ddl.ConvertCharset, ddl.SetVersioning)


@dataclass
class _Applied:
    """What an ALTER TABLE's actions did, as they were applied one by one."""

    definition: TableDefinition | None
    renamed_to: TableName | None = None
    moved: list[ddl.RowsChanged] = field(default_factory=list)  # rows without row events
    rewrites: list[str] = field(default_factory=list)  # values rewritten in place


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
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                if not line.endswith("\n"):
                    # A torn last line (a crash or a full disk while appending): its
                    # transaction was not applied, so the entry is replayed.
                    log.warning("schema history: ignoring an incomplete last line")
                    break
                entry = json.loads(line)
                if entry["gtid"] and not start.covers(Gtid.parse(entry["gtid"])):
                    continue
                table = TableName(*entry["table"])
                if entry["definition"] is None:
                    self.tables.pop(table, None)
                else:
                    self.tables[table] = TableDefinition.from_json(entry["definition"])
        lines = [json.dumps({"gtid": "", "table": [t.database, t.table],
                             "definition": d.to_json()}) for t, d in sorted(self.tables.items())]
        write_atomically(self.path, "".join(line + "\n" for line in lines).encode("utf-8"))

    def _record(self, table: TableName, definition: TableDefinition | None,
                gtid: Gtid | None) -> None:
        self._children = None
        if definition is None:
            self.tables.pop(table, None)
        else:
            self.tables[table] = definition
            self.unknown.discard(table)
        if self.path is None:
            return
        line = json.dumps({"gtid": str(gtid) if gtid else "", "table": [table.database,
                                                                        table.table],
                           "definition": definition.to_json() if definition else None})
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            except OSError:
                os.ftruncate(fd, size)  # no torn line (a full disk): the caller stops
                raise
            os.fsync(fd)
        finally:
            os.close(fd)

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
        if isinstance(statement, ddl.CreateTable):
            return "create", self._create(statement, gtid)
        if isinstance(statement, ddl.AlterTable):
            return self._alter(statement, gtid)
        if isinstance(statement, ddl.RenameTables):
            moves: list[TableChange] = []
            for old, new in statement.pairs:
                moves += self._move(old, new, self.tables.get(old), gtid)
            return "rename", tuple(moves)
        if isinstance(statement, ddl.DropTables):
            return "drop", tuple(self._drop(t, gtid) for t in statement.tables)
        if isinstance(statement, ddl.TruncateTable):
            table = statement.table
            return "truncate", (TableChange("truncate", table.database, table.table,
                                            self._layout(table)),)
        if isinstance(statement, ddl.DropDatabase):
            gone = [t for t in self.tables if t.database == statement.database]
            return "drop", tuple(self._drop(t, gtid) for t in gone)
        if isinstance(statement, ddl.Unparsed):
            log.warning("schema history: %s", statement.reason)
            for table in statement.tables:
                self._forget(table, gtid, "a statement could not be read")
            return "query", tuple(TableChange("alter", t.database, t.table)
                                  for t in statement.tables)
        return "query", ()

    def _create(self, statement: ddl.CreateTable, gtid: Gtid | None) -> tuple[TableChange, ...]:
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

    def _alter(self, statement: ddl.AlterTable, gtid: Gtid | None
               ) -> tuple[str, tuple[TableChange, ...]]:
        table = statement.table
        before = self.tables.get(table)
        applied = self._apply_actions(table, before, statement.actions, gtid)
        if applied.renamed_to is not None:
            only_rename = all(isinstance(a, ddl.RenameTo) for a in statement.actions)
            return ("rename" if only_rename else "alter",
                    tuple(self._move(table, applied.renamed_to, applied.definition, gtid)))
        if applied.definition is None:
            return "alter", (self._altered_unknown(table, statement, applied.moved, gtid),)
        return "alter", tuple(self._altered(table, before, applied,
                                            column_renames(statement.actions, before), gtid))

    def _apply_actions(self, table: TableName, definition: TableDefinition | None,
                       actions: tuple[object, ...], gtid: Gtid | None) -> _Applied:
        """The statement's actions one at a time, in MariaDB's order, on the definition
        (None once it cannot be followed): what it renames the table to, the rows it moves
        without row events, the values it rewrites."""
        applied = _Applied(definition)
        for action in _one_at_a_time(sorted(actions, key=_phase)):
            if isinstance(action, ddl.RenameTo):
                applied.renamed_to = action.table
            elif isinstance(action, ddl.RowsChanged):
                applied.moved.append(action)
            elif applied.definition is not None:
                applied.definition = self._apply_action(table, applied, action, gtid)
        if applied.definition is not None:
            applied.definition = applied.definition.with_keys_sorted()
        return applied

    def _apply_action(self, table: TableName, applied: _Applied, action: object,
                      gtid: Gtid | None) -> TableDefinition | None:
        definition = applied.definition
        assert definition is not None
        applied.rewrites += action_rewrites(definition, action)
        renamed = _renamed_column(definition, action)
        if renamed is not None:
            self._rename_referenced(table, *renamed, gtid)
        try:
            return _alter(table, definition, action)
        except IndexesUnknown as exc:
            log.info("schema history: %s: %s; its indexes are re-learned from the source "
                     "when it agrees", table, exc)
            return replace(definition, described=False)
        except (KeyError, ValueError) as exc:
            log.warning("schema history: %s: %s", table, exc)
            return None

    def _altered_unknown(self, table: TableName, statement: ddl.AlterTable,
                         moved: list[ddl.RowsChanged], gtid: Gtid | None) -> TableChange:
        """The table is forgotten (its columns are learned again); its rows are read again
        where the statement may have changed them."""
        self._forget(table, gtid, "altered while unknown or in a way not understood")
        reasons = [m.reason for m in moved]
        if any(isinstance(a, _MAY_REWRITE) for a in statement.actions):
            # The old columns are unknown, so whether their values survived cannot be told:
            # the table is read again (a narrowing MODIFY after `schema forget`)
            reasons.append("an ALTER of a table whose columns were unknown may have "
                           "rewritten its values")
        return TableChange("alter", table.database, table.table, rewrites="; ".join(reasons))

    def _altered(self, table: TableName, before: TableDefinition | None, applied: _Applied,
                 renames: tuple[tuple[str, str], ...], gtid: Gtid | None
                 ) -> list[TableChange]:
        definition = applied.definition
        assert definition is not None
        rewrites = [m.reason for m in applied.moved] + applied.rewrites
        changed = before is None or bool(rewrites) or _stored_shape(definition) != \
            _stored_shape(before)
        self._record(table, definition, gtid)
        changes = [TableChange("alter", table.database, table.table, self._layout(table),
                               changed=changed, rewrites="; ".join(rewrites),
                               renamed_columns=renames)]
        for move in applied.moved:
            if move.other is not None:
                changes += self._moved_rows(move, definition, gtid)
        return changes

    def _moved_rows(self, move: ddl.RowsChanged, definition: TableDefinition,
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
            definition = replace(definition, foreign_keys=tuple(
                replace(k, parent=(new.database, new.table)) if TableName(*k.parent) == old
                else k for k in definition.foreign_keys))
        self._record(old, None, gtid)
        self.unknown.discard(old)
        if definition is None:
            self._forget(new, gtid, f"renamed from unknown {old}")
        else:
            self._record(new, definition, gtid)
        return [TableChange("drop", old.database, old.table, note=f"renamed to {new}",
                            renamed=str(new)),
                TableChange("create", new.database, new.table, self._layout(new),
                            note=f"renamed from {old}", renamed=str(old))]

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
            self._forget(table, gtid, f"the binlog's table map ({_describe(layout.columns)}) "
                         f"disagrees with the history ({_describe(definition.column_defs())})")
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
        """An unknown table's layout, each column with the type only DDL can tell (UUID,
        INET4, INET6, JSON) that the source's definition now, or the table's last known
        definition, gives a column of that name and binlog type: a value's type does not
        change because a statement could not be read."""
        described = layout.metadata != "none"
        sources = [d for d in (self._looked_up.get(table), self.last_known.get(table))
                   if d is not None]
        columns = []
        for column in layout.columns:
            precise = column.binlog_type not in _OLD_TEMPORAL
            mine = _signature(column, described, precise)
            for definition in sources:
                if definition.has(column.name):
                    spec = definition.columns[definition.index(column.name)]
                    if _signature(spec.column_def(), described, precise) == mine:
                        column = replace(column, extended=spec.extended)
                        break
            columns.append(column)
        return replace(layout, columns=tuple(columns))

    def _bootstrap(self, table: TableName, layout: TableLayout, gtid: Gtid | None
                   ) -> TableDefinition | None:
        if self.lookup is None:
            return None
        try:
            text = self.lookup(table)
        except Exception as exc:  # noqa: BLE001 - a failed lookup leaves the table unknown
            log.warning("schema history: cannot read the definition of %s: %s", table, exc)
            return None
        statement = ddl.parse(text, table.database) if text else None
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            self.unknown.add(table)
            return None
        self._looked_up[table] = statement.definition
        if not agrees(layout, statement.definition):
            if table not in self.unknown:
                log.info("schema history: %s has changed since the position being "
                         "replicated; its extended types are unknown until it matches again",
                         table)
            self.unknown.add(table)
            return None
        self._record(table, statement.definition, gtid)
        log.info("schema history: learned %s from the source", table)
        return statement.definition

    def _describe(self, table: TableName, layout: TableLayout, definition: TableDefinition,
                  gtid: Gtid | None) -> TableDefinition:
        """A definition recorded before the history kept indexes and AUTO_INCREMENT: the
        source's, when it agrees with the table map and with the recorded columns (else it
        stays as it is, and is tried again at the table's next layout)."""
        if self.lookup is None:
            return definition
        try:
            text = self.lookup(table)
        except Exception as exc:  # noqa: BLE001 - a failed lookup leaves it as it is
            log.warning("schema history: cannot read the definition of %s: %s", table, exc)
            return definition
        statement = ddl.parse(text, table.database) if text else None
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            return definition
        found = statement.definition
        if not agrees(layout, found) or [(c.name.lower(), c.column_type()) for c in
                                         found.columns] != [(c.name.lower(), c.column_type())
                                                            for c in definition.columns]:
            return definition
        described = replace(definition, indexes=found.indexes, columns=tuple(
            replace(mine, auto_increment=theirs.auto_increment, zerofill=theirs.zerofill)
            for mine, theirs in zip(definition.columns, found.columns, strict=True)),
            described=True)
        self._record(table, described, gtid)
        log.info("schema history: learned the indexes of %s from the source", table)
        return described

    def transactional(self, table: TableName) -> bool:
        """Whether ``table`` is known to use an engine that rolls back (InnoDB and kin)."""
        definition = self.tables.get(table)
        engine = definition.engine if definition is not None else None
        if engine is None and self.lookup is not None:
            try:
                text = self.lookup(table)
            except Exception as exc:  # noqa: BLE001 - unknown means "not known transactional"
                log.warning("schema history: cannot read the engine of %s: %s", table, exc)
                text = None
            statement = ddl.parse(text, table.database) if text else None
            if isinstance(statement, ddl.CreateTable) and statement.definition is not None:
                engine = statement.definition.engine
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
        for child, definition in list(self.tables.items()):
            if child == parent:
                continue
            keys = tuple(replace(k, parent_columns=tuple(
                new if c.lower() == old.lower() else c for c in k.parent_columns))
                if TableName(*k.parent) == parent else k for k in definition.foreign_keys)
            if keys != definition.foreign_keys:
                self._record(child, replace(definition, foreign_keys=keys), gtid)

    def _repoint(self, old: TableName, new: TableName, gtid: Gtid | None) -> None:
        """A renamed table's children reference it by its new name (InnoDB does so)."""
        for child, definition in list(self.tables.items()):
            if any(TableName(*k.parent) == old for k in definition.foreign_keys):
                keys = tuple(replace(k, parent=(new.database, new.table))
                             if TableName(*k.parent) == old else k
                             for k in definition.foreign_keys)
                self._record(child, replace(definition, foreign_keys=keys), gtid)


# -- definitions and layouts ---------------------------------------------------------------

def _stored_shape(definition: TableDefinition) -> tuple[object, ...]:
    """What a new table version follows: the columns and the primary key; not indexes,
    AUTO_INCREMENT, the engine or other options."""
    return (tuple(replace(c, auto_increment=False) for c in definition.columns),
            definition.primary_key)


def layout_of(table: TableName, definition: TableDefinition) -> TableLayout:
    columns = definition.column_defs()
    pk = tuple(definition.index(name) for name in definition.primary_key)
    return TableLayout(table.database, table.table, columns, pk, sequence=definition.sequence,
                       description=definition.describe())


_OLD_TEMPORAL = frozenset({T.TIME, T.DATETIME, T.TIMESTAMP})


def _signature(col: ColumnDef, full: bool, precise: bool) -> tuple[object, ...]:
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
        precise = binlog.binlog_type not in _OLD_TEMPORAL
        if _signature(binlog, described, precise) != _signature(history, described, precise):
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
        if binlog.binlog_type in _OLD_TEMPORAL:
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


def _describe(columns: tuple[ColumnDef, ...]) -> str:
    return ", ".join(f"{c.name or '?'} {map_column(replace(c, extended=None)).real_type}"
                     for c in columns)


def column_renames(actions: Sequence[object], definition: TableDefinition | None
                   ) -> tuple[tuple[str, str], ...]:
    """The columns an ALTER's actions rename, (old, new) each, as MariaDB reads them: every
    name refers to the table before the statement (``CHANGE a b INT, CHANGE b a INT`` swaps
    the two)."""
    renames = []
    for action in actions:
        if isinstance(action, ddl.RenameColumn):
            renames.append((action.old, action.new))
        elif isinstance(action, ddl.ChangeColumn) and \
                action.old.lower() != action.column.name.lower() and \
                (definition is None or definition.has(action.old)):
            renames.append((action.old, action.column.name))
    return tuple(renames)


def _one_at_a_time(actions: list[object]) -> list[object]:
    """The actions, with column renames whose new name is another renamed column's old one
    (a swap) done through a name no column has: applied in order, each then finds the
    column it means."""
    renames = column_renames(actions, None)
    sources = {old.lower() for old, _ in renames}
    if not any(new.lower() in sources for _, new in renames):
        return actions
    out: list[object] = []
    later: list[object] = []
    for number, action in enumerate(actions):
        if isinstance(action, ddl.RenameColumn) and action.new.lower() in sources:
            temporary = f"\x00cdc-rename-{number}"
            out.append(ddl.RenameColumn(action.old, temporary))
            later.append(ddl.RenameColumn(temporary, action.new))
        elif isinstance(action, ddl.ChangeColumn) and action.column.name.lower() in sources \
                and action.old.lower() != action.column.name.lower():
            temporary = f"\x00cdc-rename-{number}"
            out.append(replace(action, column=replace(action.column, name=temporary)))
            later.append(ddl.RenameColumn(temporary, action.column.name))
        else:
            out.append(action)
    return out + later


def _renamed_column(definition: TableDefinition, action: object) -> tuple[str, str] | None:
    """(old, new) when ``action`` renames a column of the table."""
    if isinstance(action, ddl.RenameColumn):
        return action.old, action.new
    if isinstance(action, ddl.ChangeColumn) and action.old.lower() != \
            action.column.name.lower() and definition.has(action.old):
        return action.old, action.column.name
    return None


class IndexesUnknown(Exception):
    """An index statement that does not fit the indexes the history has (a table learned
    from the source after the statement ran, say): the columns are still known, the
    indexes are not. Never a reason to forget the table."""


_INDEX_ACTIONS = (ddl.AddIndex, ddl.DropIndex, ddl.RenameIndex)


def _phase(action: object) -> int:
    """The order MariaDB applies an ALTER TABLE's actions in, whatever order they are
    written in: keys dropped and renamed, then columns changed, then keys added."""
    if isinstance(action, (ddl.DropIndex, ddl.RenameIndex, ddl.DropForeignKey)):
        return 0
    if isinstance(action, ddl.SetPrimaryKey):
        return 0 if not action.columns else 2
    if isinstance(action, (ddl.AddIndex, ddl.AddForeignKey)):
        return 2
    return 1


def _alter(table: TableName, definition: TableDefinition, action: object) -> TableDefinition:
    """The definition after one ALTER TABLE action (KeyError, ValueError: it cannot be
    followed)."""
    if isinstance(action, _INDEX_ACTIONS) and not definition.described:
        return definition  # re-learned from the source as a whole
    renamed = _renamed_column(definition, action)
    if renamed is not None or isinstance(action, ddl.DropColumn):
        definition = _keys_after_column_change(table, definition, action, renamed)
    if renamed is not None:
        definition = definition.with_renamed_column(*renamed)
    step = _ALTER_STEPS.get(type(action))
    if step is None:
        raise ValueError(f"unexpected action {action!r}")
    return step(table, definition, action)


def _add_foreign_key(table: TableName, definition: TableDefinition,
                     action: ddl.AddForeignKey) -> TableDefinition:
    definition = with_foreign_key_index(definition, Index(action.key.name, action.key.columns))
    key = named(action.key, table.table, definition.foreign_keys)
    return replace(definition, foreign_keys=(*definition.foreign_keys, key))


def _drop_foreign_key(table: TableName, definition: TableDefinition,
                      action: ddl.DropForeignKey) -> TableDefinition:
    return replace(definition, foreign_keys=tuple(
        k for k in definition.foreign_keys if k.name.lower() != action.name.lower()))


def _add_period(table: TableName, definition: TableDefinition,
                action: ddl.AddPeriod) -> TableDefinition:
    return replace(definition, period=(action.start, action.end), implicit_period=False)


def _set_versioning(table: TableName, definition: TableDefinition,
                    action: ddl.SetVersioning) -> TableDefinition:
    if not action.on:
        return definition.unversioned()
    if definition.period is not None:  # ADD PERIOD FOR SYSTEM_TIME named the columns
        return definition.versioned(definition.period, implicit=False)
    return definition.versioned((IMPLICIT_ROW_START, IMPLICIT_ROW_END), implicit=True)


def _add_columns(table: TableName, definition: TableDefinition,
                 action: ddl.AddColumns) -> TableDefinition:
    columns = list(definition.columns)
    for column in action.columns:
        if definition.has(column.name):
            if action.if_not_exists:
                continue
            raise ValueError(f"column {column.name} already exists")
        column = _with_table_charset(column, definition)
        _insert(columns, column, action.position, definition)
        definition = replace(definition, columns=tuple(columns))
    return definition


def _drop_column(table: TableName, definition: TableDefinition,
                 action: ddl.DropColumn) -> TableDefinition:
    if not definition.has(action.name):
        if action.if_exists:
            return definition
        raise KeyError(f"no column {action.name}")
    columns = list(definition.columns)
    del columns[definition.index(action.name)]
    pk = [c for c in definition.primary_key if c.lower() != action.name.lower()]
    return replace(definition.without_column(action.name), columns=tuple(columns),
                   primary_key=tuple(pk))


def _change_column(table: TableName, definition: TableDefinition,
                   action: ddl.ChangeColumn) -> TableDefinition:
    if not definition.has(action.old):
        if action.if_exists:
            return definition
        raise KeyError(f"no column {action.old}")
    columns, pk = list(definition.columns), list(definition.primary_key)
    index = definition.index(action.old)
    column = _with_table_charset(action.column, definition)
    if action.old.lower() in (p.lower() for p in pk):
        column = replace(column, nullable=False)
        pk = [column.name if p.lower() == action.old.lower() else p for p in pk]
    del columns[index]
    if action.position is None:
        columns.insert(index, column)
    else:
        _insert(columns, column, action.position, replace(definition, columns=tuple(columns)))
    return replace(definition, columns=tuple(columns), primary_key=tuple(pk))


def _rename_column(table: TableName, definition: TableDefinition,
                   action: ddl.RenameColumn) -> TableDefinition:
    columns = list(definition.columns)
    index = definition.index(action.old)
    columns[index] = replace(columns[index], name=action.new)
    pk = [action.new if p.lower() == action.old.lower() else p for p in definition.primary_key]
    return replace(definition, columns=tuple(columns), primary_key=tuple(pk))


def _set_primary_key(table: TableName, definition: TableDefinition,
                     action: ddl.SetPrimaryKey) -> TableDefinition:
    for name in action.columns:
        definition.index(name)
    columns = [replace(c, nullable=False) if c.name in action.columns else c
               for c in definition.columns]
    primary = action.columns
    end = definition.period[1] if definition.period is not None else None
    if primary and end is not None and end.lower() not in (c.lower() for c in primary):
        primary += (end,)  # a versioned table's unique keys end with its row end
    return replace(definition, columns=tuple(columns), primary_key=primary)


def _convert_charset(table: TableName, definition: TableDefinition,
                     action: ddl.ConvertCharset) -> TableDefinition:
    columns = [replace(c, charset=action.charset, binary=action.charset == "binary")
               if c.type in CHARACTER_TYPES else c for c in definition.columns]
    return replace(definition, columns=tuple(columns), default_charset=action.charset)


def _set_engine(table: TableName, definition: TableDefinition,
                action: ddl.SetEngine) -> TableDefinition:
    return replace(definition, engine=action.engine)


def _unknown_action(table: TableName, definition: TableDefinition,
                    action: ddl.UnknownAction) -> TableDefinition:
    raise ValueError(f"ALTER TABLE action not understood: {action.text[:60]!r}")


def _index_action(table: TableName, definition: TableDefinition,
                  action: ddl.AddIndex | ddl.DropIndex | ddl.RenameIndex) -> TableDefinition:
    return _indexes_altered(definition, action)


# One step per kind of action (each takes the table, the definition and the action)
_ALTER_STEPS: dict[type, Callable[[TableName, TableDefinition, Any], TableDefinition]] = {
    ddl.AddForeignKey: _add_foreign_key, ddl.DropForeignKey: _drop_foreign_key,
    ddl.AddIndex: _index_action, ddl.DropIndex: _index_action, ddl.RenameIndex: _index_action,
    ddl.AddPeriod: _add_period, ddl.SetVersioning: _set_versioning,
    ddl.AddColumns: _add_columns, ddl.DropColumn: _drop_column,
    ddl.ChangeColumn: _change_column, ddl.RenameColumn: _rename_column,
    ddl.SetPrimaryKey: _set_primary_key, ddl.ConvertCharset: _convert_charset,
    ddl.SetEngine: _set_engine, ddl.UnknownAction: _unknown_action,
}


def _indexes_altered(definition: TableDefinition,
                     action: ddl.AddIndex | ddl.DropIndex | ddl.RenameIndex) -> TableDefinition:
    """``definition`` with an index added, dropped or renamed; IndexesUnknown when the
    statement does not fit the indexes known (a table learned from the source as it is
    now meets the statements that made it so: those that already show change nothing)."""
    names = [i.name.lower() for i in definition.indexes]
    if isinstance(action, ddl.AddIndex):
        index = _unique_with_row_end(definition, action.index)
        name = index.name.lower()
        if name and name in names:
            if action.if_not_exists or index in definition.indexes:
                return definition
            if not action.replace:
                raise IndexesUnknown(f"index {index.name} already exists")
            definition = replace(definition, indexes=tuple(
                i for i in definition.indexes if i.name.lower() != name))
        if not index.columns or not all(definition.has(c) for c in index.columns):
            raise IndexesUnknown(f"index {index.name or '?'} on columns not known")
        return with_index(definition, index)
    old = action.name if isinstance(action, ddl.DropIndex) else action.old
    if old.lower() not in names:
        if isinstance(action, ddl.DropIndex) and action.if_exists:
            return definition
        if isinstance(action, ddl.RenameIndex) and action.new.lower() in names:
            return definition
        raise IndexesUnknown(f"no index {old}")
    if isinstance(action, ddl.DropIndex):
        return replace(definition, indexes=tuple(
            i for i in definition.indexes if i.name.lower() != old.lower()))
    return replace(definition, indexes=tuple(
        replace(i, name=action.new) if i.name.lower() == old.lower() else i
        for i in definition.indexes))


def _unique_with_row_end(definition: TableDefinition, index: Index) -> Index:
    """A unique key of a system-versioned table ends with its row end (MariaDB adds it)."""
    if not index.unique or definition.period is None:
        return index
    end = definition.period[1]
    if end.lower() in (c.lower() for c in index.columns):
        return index
    return replace(index, columns=(*index.columns, end))


def _keys_after_column_change(table: TableName, definition: TableDefinition, action: object,
                              renamed: tuple[str, str] | None) -> TableDefinition:
    """The table's own foreign keys after a column is renamed or dropped (a key on a
    dropped column goes with it)."""
    keys = []
    for key in definition.foreign_keys:
        if renamed is not None:
            old, new = renamed
            key = replace(key, columns=tuple(new if c.lower() == old.lower() else c
                                             for c in key.columns))
            if TableName(*key.parent) == table:
                key = replace(key, parent_columns=tuple(
                    new if c.lower() == old.lower() else c for c in key.parent_columns))
        elif isinstance(action, ddl.DropColumn) and action.name.lower() in (
                c.lower() for c in key.columns):
            continue
        keys.append(key)
    return replace(definition, foreign_keys=tuple(keys))


def _insert(columns: list[ColumnSpec], column: ColumnSpec, position: ddl.Position | None,
            definition: TableDefinition) -> None:
    if position is None and definition.implicit_period:
        columns.insert(definition.index(IMPLICIT_ROW_START), column)  # they stay last
    elif position is None:
        columns.append(column)
    elif position[0] == "first":
        columns.insert(0, column)
    else:
        assert position[1] is not None
        columns.insert(definition.index(position[1]) + 1, column)


def _with_table_charset(column: ColumnSpec, definition: TableDefinition) -> ColumnSpec:
    charset = definition.default_charset
    if column.type in CHARACTER_TYPES and column.charset is None and charset is not None:
        return replace(column, charset=charset, binary=charset == "binary")
    return column
