"""Reading the parts of DDL that state columns, keys and table options: the ground the
statement reader of :mod:`.ddl` (through :mod:`.ddlalter`) stands on.

:class:`ColumnReader` holds what a statement states as it is read (its primary key, foreign
keys, indexes, system-versioning period, the columns an ``ADD`` fills) and reads table names,
column definitions with their attributes, the elements of ``CREATE TABLE``'s column list,
index and foreign-key definitions and the table options
(https://mariadb.com/kb/en/create-table/).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cdcserver.core.changes import Index
from cdcserver.core.names import TableName
from cdcserver.schema.columnspec import ColumnSpec, canonical_type
from cdcserver.schema.definition import ForeignKey
from cdcserver.schema.tokens import SqlSyntaxError, Token, TokenStream


@dataclass
class ColumnReader:
    """What a statement states, read so far, and the readers of its column definitions."""

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
    # where the statement names a table without its database (see :func:`.ddl.qualified`)
    unqualified: list[int] = field(default_factory=list)

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
        return new_index(name, tuple(self.index_columns()), kind), if_not_exists
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


def new_index(name: str, columns: tuple[str, ...], kind: str) -> Index:
    """An index of ``kind`` UNIQUE, FULLTEXT, SPATIAL or "" (an ordinary one)."""
    kind = kind.lower()
    return Index(name, columns, kind == "unique", kind if kind in ("fulltext", "spatial")
                 else "")


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
