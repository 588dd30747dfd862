"""Reading ``ALTER TABLE``'s actions: each one its dataclass of :mod:`.statements`, found by
its first words (https://mariadb.com/kb/en/alter-table/).

:class:`AlterReader` adds them to the column reader (:mod:`.ddlcolumns`); the statement reader
of :mod:`.ddl` is one. A column definition that states keys too gives them as actions of
their own, after the column's; actions that change no column (table options, maintenance,
checks) are None; an action this reader does not know is :class:`UnknownAction`.
"""

from __future__ import annotations

from collections.abc import Callable

from cdcserver.schema.ddlcolumns import ColumnReader
from cdcserver.schema.statements import (
    AddColumns,
    AddForeignKey,
    AddIndex,
    AddPeriod,
    AlterTable,
    ChangeColumn,
    ConvertCharset,
    DropColumn,
    DropForeignKey,
    DropIndex,
    Position,
    RenameColumn,
    RenameIndex,
    RenameTo,
    RowsChanged,
    SetEngine,
    SetPrimaryKey,
    SetVersioning,
    Statement,
    UnknownAction,
)

# ALTER TABLE actions on partitions that keep every row's values (in whichever partition)
_PARTITION_MAINTENANCE = ("ANALYZE", "CHECK", "OPTIMIZE", "REBUILD", "REPAIR", "COALESCE",
                          "REORGANIZE")
# ALTER TABLE actions that change no column: table options and maintenance
_NO_COLUMN_CHANGE = ("ALGORITHM", "LOCK", "FORCE", "COMMENT", "AUTO_INCREMENT", "ROW_FORMAT",
                     "KEY_BLOCK_SIZE", "STATS_PERSISTENT", "PAGE_COMPRESSED", "ENCRYPTED",
                     "ORDER", "ENABLE", "DISABLE", "DISCARD", "ANALYZE", "CHECK", "OPTIMIZE",
                     "REBUILD", "REPAIR", "COALESCE", "REORGANIZE", "REMOVE", "WAIT", "NOWAIT",
                     "DEFAULT", "CHARACTER", "CHARSET", "COLLATE", "PARTITION", "ADD_COLUMN")


class AlterReader(ColumnReader):
    """The column reader, with ``ALTER TABLE``'s actions."""

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
            return drop_index(name, if_exists)
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
    _ALTER_STEPS: tuple[tuple[tuple[str, ...], Callable[[AlterReader], object]], ...] = (
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


def drop_index(name: str, if_exists: bool) -> object:
    """``DROP INDEX name``: the primary key's name is PRIMARY."""
    return SetPrimaryKey(()) if name.upper() == "PRIMARY" else DropIndex(name, if_exists)
