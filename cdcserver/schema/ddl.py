"""Reading the DDL that changes tables' columns, as MariaDB logs it.

``parse(sql, database)`` returns one of the statements of :mod:`cdcserver.schema.statements`.
The grammar covered is what changes a table's columns or existence (MariaDB 10.11 ``CREATE
TABLE``, ``ALTER TABLE``, ``RENAME TABLE``, ``DROP TABLE``, ``TRUNCATE``, ``DROP DATABASE``);
every other statement is :class:`NoTableChange`. Indexes and AUTO_INCREMENT columns are read
too (``CREATE INDEX`` and ``DROP INDEX`` are the table's ``ALTER``), for consumers that
describe a table as ``SHOW COLUMNS`` and ``SHOW INDEX`` would. A statement about tables that
this reader cannot follow is :class:`Unparsed`, naming the tables it can identify, so the
schema history forgets them instead of guessing
(https://mariadb.com/kb/en/create-table/, .../alter-table/). The reader of column definitions,
keys and table options is :mod:`.ddlcolumns`, that of ``ALTER TABLE``'s actions
:mod:`.ddlalter`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from cdcserver.core.names import TableName
from cdcserver.schema.columnspec import BINARY_TYPES, CHARACTER_TYPES, ColumnSpec
from cdcserver.schema.ddlalter import AlterReader, drop_index
from cdcserver.schema.ddlcolumns import new_index
from cdcserver.schema.definition import (
    IMPLICIT_ROW_END,
    IMPLICIT_ROW_START,
    SEQUENCE_COLUMNS,
    ForeignKey,
    TableDefinition,
    named,
    with_foreign_key_index,
    with_index,
)
from cdcserver.schema.statements import (
    AddIndex,
    AlterTable,
    CreateTable,
    DropDatabase,
    DropTables,
    NoTableChange,
    RenameTables,
    RowsChanged,
    Statement,
    TruncateTable,
    Unparsed,
)
from cdcserver.schema.tokens import SqlSyntaxError, TokenStream, tokenize

# -- entry point -------------------------------------------------------------------------

def parse(sql: str, database: str) -> Statement:
    try:
        ts = TokenStream(tokenize(sql))
        return _Parser(ts, database).statement()
    except (SqlSyntaxError, IndexError, ValueError) as exc:
        return Unparsed(f"cannot read {sql[:80]!r}: {exc}", _mentioned_tables(sql, database))


def qualified(sql: str, database: str) -> str:
    """The statement with every table it creates, alters, renames, drops or truncates named
    with its database, so that it runs the same wherever it is run (mysql-databus's
    QueryEvent, "the schema already wrapped in"). A statement this reader cannot follow, or
    one naming no table, is returned as it is."""
    if not database:
        return sql
    try:
        parser = _Parser(TokenStream(tokenize(sql)), database)
        parser.statement()
    except (SqlSyntaxError, IndexError, ValueError):
        return sql
    prefix = "`" + database.replace("`", "``") + "`."
    for start in sorted(set(parser.unqualified), reverse=True):
        if start >= 0:
            sql = sql[:start] + prefix + sql[start:]
    return sql


_TABLE_MENTION = re.compile(r"\b(?:TABLE|INTO|TO)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?"
                            r"(`(?:[^`]|``)+`|\w+)(?:\.(`(?:[^`]|``)+`|\w+))?", re.I)


def _mentioned_tables(sql: str, database: str) -> tuple[TableName, ...]:
    names = []
    for m in _TABLE_MENTION.finditer(sql):
        first, second = (p.strip("`").replace("``", "`") if p else p for p in m.groups())
        names.append(TableName(first, second) if second else TableName(database, first))
    return tuple(names)


class _Parser(AlterReader):
    """A statement's reader: which statement it is, ``CREATE``, ``RENAME`` and ``DROP``."""

    def statement(self) -> Statement:
        ts = self.ts
        if ts.accept_word("CREATE"):
            replace_ = ts.accept_words("OR", "REPLACE")
            if ts.accept_word("TEMPORARY"):
                return NoTableChange()  # not logged in row format; never replicated
            if ts.accept_word("TABLE"):
                return self.create_table(replace_)
            if ts.accept_word("SEQUENCE"):
                return self.create_sequence(replace_)
            if ts.accept_word("DATABASE", "SCHEMA"):
                return NoTableChange()
            token = ts.peek()
            kind = ts.next().text if token is not None and token.is_word(
                "UNIQUE", "FULLTEXT", "SPATIAL") else ""
            if ts.accept_word("INDEX"):
                return self.create_index(kind, replace_)
            return NoTableChange()  # VIEW, TRIGGER, PROCEDURE, USER, ...
        if ts.accept_word("ALTER"):
            ts.accept_word("ONLINE")
            ts.accept_word("IGNORE")
            if ts.accept_word("TABLE"):
                return self.alter_table()
            if ts.accept_word("SEQUENCE"):
                if_exists = self.if_exists()
                table = self.table_name()
                return AlterTable(table, (RowsChanged("ALTER SEQUENCE sets its row"),),
                                  if_exists)
            return NoTableChange()
        if ts.accept_word("RENAME"):
            if ts.accept_word("TABLE", "TABLES"):
                return self.rename_tables()
            return NoTableChange()  # RENAME USER
        if ts.accept_word("DROP"):
            ts.accept_word("TEMPORARY")
            if ts.accept_word("TABLE", "TABLES", "SEQUENCE"):
                return self.drop_tables()
            if ts.accept_word("DATABASE", "SCHEMA"):
                self.if_exists()
                return DropDatabase(ts.identifier())
            if ts.accept_word("INDEX"):
                if_exists = self.if_exists()
                name = ts.identifier()
                ts.expect_word("ON")
                return AlterTable(self.table_name(), (drop_index(name, if_exists),))
            return NoTableChange()
        if ts.accept_word("TRUNCATE"):
            ts.accept_word("TABLE")
            return TruncateTable(self.table_name())
        return NoTableChange()
    # -- CREATE TABLE ----------------------------------------------------------------

    def create_table(self, replace_: bool) -> Statement:
        ts = self.ts
        if_not_exists = self.if_not_exists()
        table = self.table_name()
        self._table = table
        if ts.accept_word("LIKE"):
            return CreateTable(table, None, self.table_name(), replace_, if_not_exists)
        if ts.accept_symbol("("):
            if ts.accept_word("LIKE"):
                like = self.table_name()
                ts.expect_symbol(")")
                return CreateTable(table, None, like, replace_, if_not_exists)
            columns = self.create_elements()
        else:
            return Unparsed("CREATE TABLE without a column list", (table,))
        options = self.table_options()
        charset = options.get("charset")
        columns = tuple(_apply_default_charset(c, charset) for c in columns)
        pk = tuple(self._pk)
        columns = tuple(replace(c, nullable=False) if c.name in pk else c for c in columns)
        definition = TableDefinition(columns, pk, charset, options.get("engine"),
                                     foreign_keys=self.named_keys(table),
                                     sequence=options.get("sequence") not in (None, "0"))
        definition = self.with_indexes(definition)
        start, end = self._period
        if start is not None and end is not None:
            definition = definition.versioned((start, end), implicit=False)
        elif self._versioned or "versioning" in options:
            definition = definition.versioned((IMPLICIT_ROW_START, IMPLICIT_ROW_END),
                                              implicit=True)
        return CreateTable(table, definition, None, replace_, if_not_exists)

    def with_indexes(self, definition: TableDefinition) -> TableDefinition:
        """The indexes read, named as MariaDB names them; a foreign key's own index only
        when no other index starts with its columns."""
        stated = tuple(index for index, generated in self._indexes if not generated)
        for index, generated in self._indexes:
            if not generated:
                definition = with_index(definition, index)
            elif not any(_starts_with(other.columns, index.columns) for other in stated):
                definition = with_foreign_key_index(definition, index)
        return definition.with_keys_sorted()

    def create_index(self, kind: str, replace_: bool) -> Statement:
        """``CREATE [UNIQUE|FULLTEXT|SPATIAL] INDEX [IF NOT EXISTS] name [USING type] ON
        table (columns)``, after the word INDEX: the table's ALTER ... ADD INDEX."""
        ts = self.ts
        if_not_exists = self.if_not_exists()
        name = ts.identifier()
        while not ts.accept_word("ON"):
            ts.next()  # USING BTREE
        table = self.table_name()
        columns = tuple(self.index_columns())
        return AlterTable(table, (AddIndex(new_index(name, columns, kind), if_not_exists,
                                           replace_),))
    def named_keys(self, table: TableName) -> tuple[ForeignKey, ...]:
        """The foreign keys read, each unnamed one named as InnoDB names it."""
        keys: tuple[ForeignKey, ...] = ()
        for key in self._fks:
            keys = (*keys, named(key, table.table, keys))
        return keys

    def create_sequence(self, replace_: bool) -> Statement:
        """``CREATE SEQUENCE``: a table of one row, SEQUENCE_COLUMNS. A value type (``AS
        INT``, MariaDB 11.5) changes the columns: such a sequence is learned from the
        source instead."""
        if_not_exists = self.if_not_exists()
        table = self.table_name()
        if any(t.is_word("AS") for t in self.ts.until_top_level(";")):
            return Unparsed("CREATE SEQUENCE ... AS type", (table,))
        return CreateTable(table, TableDefinition(SEQUENCE_COLUMNS, engine=None, sequence=True),
                           None, replace_, if_not_exists)
    # -- RENAME / DROP ----------------------------------------------------------------

    def rename_tables(self) -> Statement:
        self.if_exists()
        pairs = []
        while True:
            old = self.table_name()
            self.ts.accept_word("WAIT", "NOWAIT")
            self.ts.expect_word("TO")
            pairs.append((old, self.table_name()))
            if not self.ts.accept_symbol(","):
                return RenameTables(tuple(pairs))

    def drop_tables(self) -> Statement:
        self.if_exists()
        tables = [self.table_name()]
        while self.ts.accept_symbol(","):
            tables.append(self.table_name())
        return DropTables(tuple(tables))


def _starts_with(columns: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return [c.lower() for c in columns[:len(prefix)]] == [c.lower() for c in prefix]


def _apply_default_charset(column: ColumnSpec, charset: str | None) -> ColumnSpec:
    """A character column without its own character set takes the table's."""
    if column.type in BINARY_TYPES:
        return replace(column, binary=True)
    if column.type in CHARACTER_TYPES and column.charset is None and charset is not None:
        return replace(column, charset=charset, binary=charset == "binary")
    return column

