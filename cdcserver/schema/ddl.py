"""Reading the DDL that changes tables' columns, as MariaDB logs it.

``parse(sql, database)`` returns one of the statements of :mod:`cdcserver.schema.statements`
(importable from here too). The grammar covered
is what changes a table's columns or existence (MariaDB 10.11 ``CREATE TABLE``, ``ALTER
TABLE``, ``RENAME TABLE``, ``DROP TABLE``, ``TRUNCATE``, ``DROP DATABASE``); every other
statement is :class:`NoTableChange`. Indexes and AUTO_INCREMENT columns are read too
(``CREATE INDEX`` and ``DROP INDEX`` are the table's ``ALTER``), for consumers that describe
a table as ``SHOW COLUMNS`` and ``SHOW INDEX`` would. A statement about tables that this
reader cannot follow is :class:`Unparsed`, naming the tables it can identify, so the schema
history forgets them instead of guessing
(https://mariadb.com/kb/en/create-table/, .../alter-table/).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cdcserver.core.changes import Index
from cdcserver.core.names import TableName
from cdcserver.schema.columnspec import BINARY_TYPES, CHARACTER_TYPES, ColumnSpec, canonical_type
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
    AddColumns,
    AddForeignKey,
    AddIndex,
    AddPeriod,
    AlterTable,
    ChangeColumn,
    ConvertCharset,
    CreateTable,
    DropColumn,
    DropDatabase,
    DropForeignKey,
    DropIndex,
    DropTables,
    NoTableChange,
    Position,
    RenameColumn,
    RenameIndex,
    RenameTables,
    RenameTo,
    RowsChanged,
    SetEngine,
    SetPrimaryKey,
    SetVersioning,
    Statement,
    TruncateTable,
    UnknownAction,
    Unparsed,
)
from cdcserver.schema.tokens import SqlSyntaxError, Token, TokenStream, tokenize

# ALTER TABLE actions on partitions that keep every row's values (in whichever partition)
_PARTITION_MAINTENANCE = ("ANALYZE", "CHECK", "OPTIMIZE", "REBUILD", "REPAIR", "COALESCE",
                          "REORGANIZE")
# ALTER TABLE actions that change no column: table options and maintenance
_NO_COLUMN_CHANGE = ("ALGORITHM", "LOCK", "FORCE", "COMMENT", "AUTO_INCREMENT", "ROW_FORMAT",
                     "KEY_BLOCK_SIZE", "STATS_PERSISTENT", "PAGE_COMPRESSED", "ENCRYPTED",
                     "ORDER", "ENABLE", "DISABLE", "DISCARD", "ANALYZE", "CHECK", "OPTIMIZE",
                     "REBUILD", "REPAIR", "COALESCE", "REORGANIZE", "REMOVE", "WAIT", "NOWAIT",
                     "DEFAULT", "CHARACTER", "CHARSET", "COLLATE", "PARTITION", "ADD_COLUMN")


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


@dataclass
class _Parser:
    ts: TokenStream
    database: str
    _pk: list[str] = field(default_factory=list)
    _fks: list[ForeignKey] = field(default_factory=list)
    _period: list[str | None] = field(default_factory=lambda: [None, None])  # AS ROW START/END
    _versioned: bool = False  # WITH SYSTEM VERSIONING, on the table or on a column
    _table: TableName | None = None  # the table being created or altered
    _filled: list[str] = field(default_factory=list)  # see AddColumns.filled
    # CREATE TABLE's indexes in the order stated, each with whether a foreign key made it
    # (dropped when another index starts with its columns, as MariaDB does)
    _indexes: list[tuple[Index, bool]] = field(default_factory=list)
    # where the statement names a table without its database (see ``qualified``)
    unqualified: list[int] = field(default_factory=list)

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
                return AlterTable(self.table_name(), (_drop_index(name, if_exists),))
            return NoTableChange()
        if ts.accept_word("TRUNCATE"):
            ts.accept_word("TABLE")
            return TruncateTable(self.table_name())
        return NoTableChange()

    # -- names -----------------------------------------------------------------------

    def table_name(self) -> TableName:
        token = self.ts.peek()
        first = self.ts.identifier()
        if self.ts.accept_symbol("."):
            return TableName(first, self.ts.identifier())
        if token is not None:
            self.unqualified.append(token.start)
        return TableName(self.database, first)

    def if_exists(self) -> bool:
        return self.ts.accept_words("IF", "EXISTS")

    def if_not_exists(self) -> bool:
        return self.ts.accept_words("IF", "NOT", "EXISTS")

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
        return AlterTable(table, (AddIndex(_index(name, columns, kind), if_not_exists,
                                           replace_),))

    def index_definition(self, kind: str, constraint: str = "") -> tuple[Index, bool]:
        """``[INDEX|KEY] [IF NOT EXISTS] [name] [USING type] (columns)`` after UNIQUE,
        FULLTEXT, SPATIAL, INDEX or KEY (without a name the constraint's), and whether it
        said IF NOT EXISTS."""
        ts = self.ts
        ts.accept_word("INDEX", "KEY")
        if_not_exists = self.if_not_exists()
        name = constraint
        token = ts.peek()
        if token is not None and not token.is_symbol("(") and not token.is_word("USING"):
            name = ts.identifier()
        return _index(name, tuple(self.index_columns()), kind), if_not_exists

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

    def foreign_key(self, name: str) -> ForeignKey:
        """``FOREIGN KEY [index name] (columns) REFERENCES parent (columns) [ON ...]``, after
        the words FOREIGN KEY."""
        ts = self.ts
        token = ts.peek()
        if token is not None and not token.is_symbol("("):
            index_name = ts.identifier()
            name = name or index_name
        columns = tuple(self.index_columns())
        ts.expect_word("REFERENCES")
        return self.references(name, columns)

    def references(self, name: str, columns: tuple[str, ...]) -> ForeignKey:
        """``parent (columns) [MATCH ...] [ON DELETE action] [ON UPDATE action]``, after
        REFERENCES. An unqualified parent is in the child's database."""
        ts = self.ts
        token = ts.peek()
        first = ts.identifier()
        if ts.accept_symbol("."):
            parent = (first, ts.identifier())
        else:
            parent = ((self._table or TableName(self.database, "")).database, first)
            if token is not None and parent[0] == self.database:
                self.unqualified.append(token.start)
        parent_columns = tuple(self.index_columns()) if ts.peek() is not None and \
            ts.peek().is_symbol("(") else ()  # type: ignore[union-attr]
        actions = {"delete": "restrict", "update": "restrict"}
        while True:
            if ts.accept_word("MATCH"):
                ts.next()
            elif ts.accept_word("ON"):
                event = ts.next().text.lower()
                if ts.accept_word("CASCADE", "RESTRICT"):
                    action = ts.tokens[ts.pos - 1].text.lower()
                elif ts.accept_words("SET", "NULL"):
                    action = "set null"
                elif ts.accept_words("SET", "DEFAULT"):
                    action = "set default"
                elif ts.accept_words("NO", "ACTION"):
                    action = "no action"
                else:
                    raise SqlSyntaxError(f"unknown referential action after ON {event}")
                actions[event] = action
            else:
                break
        return ForeignKey(name, columns, parent, parent_columns or columns,
                          actions["delete"], actions["update"])

    def create_elements(self) -> tuple[ColumnSpec, ...]:
        columns: list[ColumnSpec] = []
        while True:
            if not self.table_element():
                columns.append(self.column_spec())
            if self.ts.accept_symbol(")"):
                return tuple(columns)
            self.ts.expect_symbol(",")

    def table_element(self) -> bool:
        """An index or constraint in a column list; records a PRIMARY KEY. False if the
        next element is a column."""
        ts = self.ts
        start = ts.pos
        constraint = ""
        if ts.accept_word("CONSTRAINT"):
            token = ts.peek()
            if token is not None and not token.is_word("PRIMARY", "UNIQUE", "FOREIGN",
                                                        "CHECK"):
                constraint = ts.next().text  # the constraint's name
        if ts.accept_words("PRIMARY", "KEY"):
            self._pk = self.index_columns()
            ts.until_top_level(",", ")")
            return True
        if ts.accept_words("FOREIGN", "KEY"):
            key = self.foreign_key(constraint)
            self._fks.append(key)
            self._indexes.append((Index(key.name, key.columns), True))
            ts.until_top_level(",", ")")
            return True
        token = ts.peek()
        if token is not None and token.is_word("UNIQUE", "KEY", "INDEX", "FULLTEXT",
                                               "SPATIAL"):
            kind = ts.next().text if token.is_word("UNIQUE", "FULLTEXT", "SPATIAL") else ""
            self._indexes.append((self.index_definition(kind, constraint)[0], False))
            ts.until_top_level(",", ")")
            return True
        if ts.accept_words("PERIOD", "FOR", "SYSTEM_TIME"):
            ts.expect_symbol("(")
            names = [t.text for t in ts.skip_balanced() if not t.is_symbol(",")]
            self._period = [names[0], names[1]]
            ts.until_top_level(",", ")")
            return True
        # These are reserved words: a column with such a name is backquoted (an "ident"
        # token), so a bare word starts an index or a constraint.
        token = ts.peek()
        period = token is not None and token.is_word("PERIOD") and \
            ts.peek(1) is not None and ts.peek(1).is_word("FOR")  # type: ignore[union-attr]
        if period or (token is not None and token.is_word("FOREIGN", "CHECK")):
            ts.until_top_level(",", ")")
            return True
        ts.pos = start
        return False

    def index_columns(self) -> list[str]:
        ts = self.ts
        while not ts.accept_symbol("("):  # USING BTREE, an index name, ...
            ts.next()
        names = []
        for part in _split_top_level(ts.skip_balanced()):
            if part and part[0].kind in ("word", "ident", "string"):  # "a": ANSI_QUOTES
                names.append(part[0].text)
        return names

    def table_options(self) -> dict[str, str]:
        """The table options this reader needs, when stated: ``charset`` (the default
        character set), ``engine``, ``sequence`` (its value) and ``versioning`` (WITH SYSTEM
        VERSIONING). The partitioning that may follow changes no column."""
        options: dict[str, str] = {}
        tokens = self.ts.until_top_level(";")
        for i, token in enumerate(tokens):
            if token.is_word("PARTITION"):
                break
            if token.is_word("SYSTEM") and i > 0 and tokens[i - 1].is_word("WITH") and \
                    i + 1 < len(tokens) and tokens[i + 1].is_word("VERSIONING"):
                options["versioning"] = "on"
                continue
            is_charset = token.is_word("CHARSET") or (token.is_word("SET") and i > 0 and
                                                       tokens[i - 1].is_word("CHARACTER"))
            option = "charset" if is_charset else "engine" if token.is_word(
                "ENGINE", "TYPE") else "sequence" if token.is_word("SEQUENCE") else None
            if option is None:
                continue
            j = i + 1
            if j < len(tokens) and tokens[j].is_symbol("="):
                j += 1
            if j < len(tokens):
                options[option] = tokens[j].text.lower()
        return options

    # -- column definitions ---------------------------------------------------------------

    def column_spec(self) -> ColumnSpec:
        ts = self.ts
        name = ts.identifier()
        type_name = ts.next().text
        for two in (("DOUBLE", "PRECISION"), ("NATIONAL", "CHAR"), ("NATIONAL", "VARCHAR"),
                    ("CHARACTER", "VARYING"), ("CHAR", "VARYING"), ("LONG", "VARCHAR"),
                    ("LONG", "VARBINARY")):
            if type_name.upper() == two[0] and ts.accept_word(two[1]):
                type_name = f"{two[0]} {two[1]}"
        kind = canonical_type(type_name)
        args: tuple[str, ...] = ()
        if ts.accept_symbol("("):
            args = tuple(t.text for t in ts.skip_balanced() if not t.is_symbol(","))
        spec = ColumnSpec(name, kind, args)
        spec.column_def()  # a type this reader does not know: ValueError, the statement unread
        if kind == "serial":  # BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE
            spec = replace(spec, unsigned=True, nullable=False, auto_increment=True)
            self._indexes.append((Index("", (name,), unique=True), False))
        elif type_name.lower() in ("bool", "boolean"):
            spec = replace(spec, args=("1",))
        return self.column_attributes(spec)

    def column_attributes(self, spec: ColumnSpec) -> ColumnSpec:
        ts = self.ts
        while (token := ts.peek()) is not None and not (
                token.is_symbol(",") or token.is_symbol(")") or token.is_symbol(";")
                or token.is_word("FIRST", "AFTER")):
            if ts.accept_word("UNSIGNED"):
                spec = replace(spec, unsigned=True)
            elif ts.accept_word("ZEROFILL"):
                spec = replace(spec, unsigned=True, zerofill=True)
            elif ts.accept_words("NOT", "NULL"):
                spec = replace(spec, nullable=False)
                self._filled.append(spec.name)
            elif ts.accept_word("AUTO_INCREMENT"):
                spec = replace(spec, auto_increment=True)
                self._filled.append(spec.name)
            elif ts.accept_word("DEFAULT"):
                ts.accept_symbol("=")
                if not ts.accept_word("NULL"):
                    self._filled.append(spec.name)
                    self.skip_expression()
            elif ts.accept_words("CHARACTER", "SET") or ts.accept_word("CHARSET") or \
                    ts.accept_words("CHAR", "SET"):
                ts.accept_symbol("=")
                charset = ts.identifier().lower()
                spec = replace(spec, binary=charset == "binary", charset=charset)
            elif ts.accept_words("PRIMARY", "KEY") or ts.accept_word("KEY"):
                self._pk = [spec.name]
                spec = replace(spec, nullable=False)
            elif ts.accept_word("UNIQUE"):
                ts.accept_word("KEY")
                self._indexes.append((Index("", (spec.name,), unique=True), False))
            elif ts.accept_word("COMMENT", "COLLATE", "COLUMN_FORMAT", "STORAGE",
                                "COMPRESSED"):
                ts.accept_symbol("=")
                self.skip_expression()
            elif ts.accept_word("CHECK"):
                ts.expect_symbol("(")
                spec = self.check(spec, ts.skip_balanced())
            elif ts.accept_words("ON", "UPDATE"):
                self.skip_expression()
            elif ts.accept_word("AS"):
                if ts.accept_word("ROW"):  # GENERATED ALWAYS AS ROW START/END
                    end = ts.expect_word("START", "END").upper() == "END"
                    self._period[end] = spec.name
                    spec = replace(spec, nullable=False)
                else:
                    ts.expect_symbol("(")
                    ts.skip_balanced()
                    self._filled.append(spec.name)
            elif ts.accept_words("WITH", "SYSTEM", "VERSIONING"):
                self._versioned = True  # a column's: the table is versioned
            elif ts.accept_words("WITHOUT", "SYSTEM", "VERSIONING"):
                pass
            elif ts.accept_word("REFERENCES"):
                # InnoDB makes a foreign key of a column's REFERENCES too (MariaDB 10.5+)
                self._fks.append(self.references("", (spec.name,)))
                self._indexes.append((Index("", (spec.name,)), True))
            elif ts.accept_symbol("("):
                ts.skip_balanced()
            else:
                ts.next()  # NULL, AUTO_INCREMENT, UNIQUE, INVISIBLE, GENERATED ALWAYS, ...
        return spec

    def skip_expression(self) -> None:
        ts = self.ts
        ts.accept_symbol("-") or ts.accept_symbol("+")
        token = ts.next()
        if token.is_symbol("(") or ts.accept_symbol("("):
            ts.skip_balanced()

    @staticmethod
    def check(spec: ColumnSpec, tokens: list[Token]) -> ColumnSpec:
        # MariaDB's JSON is LONGTEXT with CHECK (json_valid(`col`)) (SHOW CREATE TABLE).
        if len(tokens) >= 4 and tokens[0].is_word("JSON_VALID") and tokens[1].is_symbol("(") \
                and tokens[2].text.lower() == spec.name.lower() and tokens[3].is_symbol(")"):
            return replace(spec, json_check=True)
        return spec

    # -- ALTER TABLE ----------------------------------------------------------------------

    def alter_table(self) -> Statement:
        if_exists = self.if_exists()
        table = self.table_name()
        self._table = table
        actions: list[object] = []
        while not self.ts.at_end():
            action = self.alter_action()
            actions += action if isinstance(action, tuple) else [action]
            if not self.ts.accept_symbol(",") and not self.ts.at_end():
                # Whatever follows an action without a comma is not understood.
                actions.append(UnknownAction(" ".join(t.text for t in
                                                      self.ts.until_top_level(";"))))
        return AlterTable(table, tuple(a for a in actions if a is not None), if_exists)

    def alter_action(self) -> object:
        """One action of ``ALTER TABLE``: its dataclass, a tuple of them (a column definition
        that states keys too), or None for an action that changes no column."""
        ts = self.ts
        for words, step in self._ALTER_STEPS:
            if ts.accept_words(*words):
                return step(self)
        if any(ts.accept_words(word, "PARTITION") for word in _PARTITION_MAINTENANCE):
            ts.until_top_level(";")  # p0, p1 [INTO (...)]: stands alone, moves no value
            return None
        if ts.accept_word(*_NO_COLUMN_CHANGE):
            ts.until_top_level(",", ";")  # table options and maintenance: no column change
            return None
        return UnknownAction(" ".join(t.text for t in ts.until_top_level(",", ";")))

    def _alter_add(self) -> object:
        ts = self.ts
        if self.at_index_keyword():
            return self.add_index_or_constraint()
        ts.accept_word("COLUMN")
        if_not_exists = self.if_not_exists()
        self._filled = []
        self._start_keys()
        if ts.accept_symbol("("):
            columns = self.create_elements()
            return (AddColumns(columns, None, if_not_exists, tuple(self._filled)),
                    *self.keys_stated())
        column = self.column_spec()
        return (AddColumns((column,), self.position(), if_not_exists, tuple(self._filled)),
                *self.keys_stated())

    def _alter_drop(self) -> object:
        ts = self.ts
        if ts.accept_words("PRIMARY", "KEY"):
            return SetPrimaryKey(())
        if ts.accept_words("FOREIGN", "KEY"):
            self.if_exists()
            name = ts.identifier()
            ts.until_top_level(",", ";")
            return DropForeignKey(name)
        if ts.accept_words("SYSTEM", "VERSIONING"):
            return SetVersioning(False)
        if ts.accept_word("PARTITION"):
            ts.until_top_level(";")  # p1, p2: partition maintenance stands alone
            return RowsChanged("ALTER TABLE ... DROP PARTITION removes the partition's rows")
        if ts.accept_word("CONSTRAINT"):
            # DROP CONSTRAINT names a foreign key, a UNIQUE key or a CHECK; dropping an
            # unknown name changes nothing this history keeps.
            self.if_exists()
            name = ts.identifier()
            ts.until_top_level(",", ";")
            return (DropForeignKey(name), DropIndex(name, if_exists=True))
        if ts.accept_word("INDEX", "KEY"):
            if_exists = self.if_exists()
            name = ts.identifier()
            ts.until_top_level(",", ";")
            return _drop_index(name, if_exists)
        if ts.accept_word("CHECK", "PERIOD"):
            ts.until_top_level(",", ";")
            return None
        ts.accept_word("COLUMN")
        if_exists = self.if_exists()
        name = ts.identifier()
        ts.accept_word("RESTRICT", "CASCADE")
        return DropColumn(name, if_exists)

    def _alter_modify(self) -> object:
        self.ts.accept_word("COLUMN")
        if_exists = self.if_exists()
        self._start_keys()
        column = self.column_spec()
        return (ChangeColumn(column.name, column, self.position(), if_exists),
                *self.keys_stated())

    def _alter_change(self) -> object:
        self.ts.accept_word("COLUMN")
        if_exists = self.if_exists()
        old = self.ts.identifier()
        self._start_keys()
        column = self.column_spec()
        return (ChangeColumn(old, column, self.position(), if_exists), *self.keys_stated())

    def _alter_rename(self) -> object:
        ts = self.ts
        if ts.accept_word("COLUMN"):
            old = ts.identifier()
            ts.expect_word("TO")
            return RenameColumn(old, ts.identifier())
        if ts.accept_word("INDEX", "KEY"):
            old = ts.identifier()
            ts.expect_word("TO")
            return RenameIndex(old, ts.identifier())
        ts.accept_word("TO", "AS")
        return RenameTo(self.table_name())

    def _alter_convert_partition(self) -> object:
        ts = self.ts
        ts.identifier()
        ts.expect_word("TO")
        ts.expect_word("TABLE")
        other = self.table_name()
        ts.until_top_level(";")
        return RowsChanged("ALTER TABLE ... CONVERT PARTITION moves the partition's rows "
                           f"to {other}", other, "created")

    def _alter_convert_table(self) -> object:
        other = self.table_name()
        self.ts.until_top_level(";")
        return RowsChanged(f"ALTER TABLE ... CONVERT TABLE moves the rows of {other} into "
                           "a partition", other, "dropped")

    def _alter_truncate(self) -> object:
        self.ts.expect_word("PARTITION")
        self.ts.until_top_level(";")
        return RowsChanged("ALTER TABLE ... TRUNCATE PARTITION removes rows")

    def _alter_exchange(self) -> object:
        ts = self.ts
        ts.expect_word("PARTITION")
        ts.identifier()
        ts.expect_word("WITH")
        ts.expect_word("TABLE")
        other = self.table_name()
        ts.until_top_level(";")
        return RowsChanged(f"ALTER TABLE ... EXCHANGE PARTITION swaps rows with {other}", other)

    def _alter_import(self) -> object:  # [PARTITION p] TABLESPACE
        self.ts.until_top_level(",", ";")
        return RowsChanged("ALTER TABLE ... IMPORT TABLESPACE replaces the rows")

    def _alter_convert_charset(self) -> object:
        ts = self.ts
        ts.expect_word("TO")
        ts.accept_words("CHARACTER", "SET") or ts.accept_word("CHARSET")
        charset = ts.identifier().lower()
        ts.until_top_level(",", ";")
        return ConvertCharset(charset)

    def _alter_column(self) -> object:
        self.ts.accept_word("COLUMN")
        self.ts.until_top_level(",", ";")  # SET/DROP DEFAULT, visibility: no type change
        return None

    def _alter_engine(self) -> object:
        self.ts.accept_symbol("=")
        engine = self.ts.identifier().lower()
        self.ts.until_top_level(",", ";")
        return SetEngine(engine)

    # The actions by their first words, in the order they are tried (CONVERT PARTITION and
    # CONVERT TABLE before CONVERT TO)
    _ALTER_STEPS: tuple[tuple[tuple[str, ...], Callable[[_Parser], object]], ...] = (
        (("ADD",), _alter_add), (("DROP",), _alter_drop), (("MODIFY",), _alter_modify),
        (("CHANGE",), _alter_change), (("RENAME",), _alter_rename),
        (("CONVERT", "PARTITION"), _alter_convert_partition),
        (("CONVERT", "TABLE"), _alter_convert_table), (("TRUNCATE",), _alter_truncate),
        (("EXCHANGE",), _alter_exchange), (("IMPORT",), _alter_import),
        (("CONVERT",), _alter_convert_charset), (("ALTER",), _alter_column),
        (("ENGINE",), _alter_engine),
    )

    def _start_keys(self) -> None:
        self._pk, self._fks, self._indexes = [], [], []

    def keys_stated(self) -> tuple[object, ...]:
        """The keys a column definition of ALTER TABLE states (``PRIMARY KEY``, ``UNIQUE``,
        ``SERIAL``, ``REFERENCES``, or a key in ``ADD (..., UNIQUE KEY (a))``): actions of
        their own, applied after the columns change, as MariaDB applies them."""
        actions: list[object] = []
        if self._pk:
            actions.append(SetPrimaryKey(tuple(self._pk)))
        actions += [AddForeignKey(key) for key in self._fks]
        actions += [AddIndex(index, False) for index, generated in self._indexes
                    if not generated]
        return tuple(actions)

    def at_index_keyword(self) -> bool:
        token = self.ts.peek()
        return token is not None and token.is_word(
            "PRIMARY", "UNIQUE", "INDEX", "KEY", "FULLTEXT", "SPATIAL", "FOREIGN", "CONSTRAINT",
            "CHECK", "PARTITION", "PERIOD", "SYSTEM")

    def add_index_or_constraint(self) -> object:
        """``ADD PRIMARY KEY``, ``ADD [CONSTRAINT [name]] FOREIGN KEY``, ``ADD PERIOD FOR
        SYSTEM_TIME``, ``ADD SYSTEM VERSIONING``; other indexes, checks and partitions
        change no column."""
        ts = self.ts
        name = ""
        if ts.accept_word("CONSTRAINT"):
            self.if_not_exists()
            token = ts.peek()
            if token is not None and not token.is_word("PRIMARY", "UNIQUE", "FOREIGN",
                                                        "CHECK"):
                name = ts.next().text
        if ts.accept_words("PRIMARY", "KEY"):
            return SetPrimaryKey(tuple(self.index_columns()))
        if ts.accept_words("FOREIGN", "KEY"):
            self.if_not_exists()
            self._fks = [self.foreign_key(name)]
            ts.until_top_level(",", ";")
            return AddForeignKey(self._fks[0])
        if ts.accept_words("PERIOD", "FOR", "SYSTEM_TIME"):
            ts.expect_symbol("(")
            names = [t.text for t in ts.skip_balanced() if not t.is_symbol(",")]
            ts.until_top_level(",", ";")
            return AddPeriod(names[0], names[1])
        if ts.accept_words("SYSTEM", "VERSIONING"):
            return SetVersioning(True)
        token = ts.peek()
        if token is not None and token.is_word("UNIQUE", "KEY", "INDEX", "FULLTEXT",
                                               "SPATIAL"):
            kind = ts.next().text if token.is_word("UNIQUE", "FULLTEXT", "SPATIAL") else ""
            index, if_not_exists = self.index_definition(kind, name)
            ts.until_top_level(",", ";")
            return AddIndex(index, if_not_exists)
        ts.until_top_level(",", ";")
        return None

    def position(self) -> Position | None:
        if self.ts.accept_word("FIRST"):
            return ("first", None)
        if self.ts.accept_word("AFTER"):
            return ("after", self.ts.identifier())
        return None

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


def _drop_index(name: str, if_exists: bool) -> object:
    """``DROP INDEX name``: the primary key's name is PRIMARY."""
    return SetPrimaryKey(()) if name.upper() == "PRIMARY" else DropIndex(name, if_exists)


def _index(name: str, columns: tuple[str, ...], kind: str) -> Index:
    """An index of ``kind`` UNIQUE, FULLTEXT, SPATIAL or "" (an ordinary one)."""
    kind = kind.lower()
    return Index(name, columns, kind == "unique", kind if kind in ("fulltext", "spatial")
                 else "")


def _starts_with(columns: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return [c.lower() for c in columns[:len(prefix)]] == [c.lower() for c in prefix]


def _split_top_level(tokens: list[Token]) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.is_symbol("("):
            depth += 1
        elif token.is_symbol(")"):
            depth -= 1
        elif token.is_symbol(",") and depth == 0:
            parts.append([])
            continue
        parts[-1].append(token)
    return parts


def _apply_default_charset(column: ColumnSpec, charset: str | None) -> ColumnSpec:
    """A character column without its own character set takes the table's."""
    if column.type in BINARY_TYPES:
        return replace(column, binary=True)
    if column.type in CHARACTER_TYPES and column.charset is None and charset is not None:
        return replace(column, charset=charset, binary=charset == "binary")
    return column
