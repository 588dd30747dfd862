"""What a DDL statement does to tables, as :func:`cdcserver.schema.ddl.parse` reads it: one
dataclass per statement, and one per ``ALTER TABLE`` action, which the schema history applies
(:mod:`cdcserver.schema.history`)."""

from __future__ import annotations

from dataclasses import dataclass

from cdcserver.core.changes import Index
from cdcserver.core.names import TableName
from cdcserver.schema.columnspec import ColumnSpec
from cdcserver.schema.definition import ForeignKey, TableDefinition

Position = tuple[str, str | None]  # ("first", None) or ("after", column)


@dataclass(frozen=True)
class CreateTable:
    table: TableName
    definition: TableDefinition | None  # None with ``like``
    like: TableName | None = None
    replace: bool = False
    if_not_exists: bool = False


@dataclass(frozen=True)
class AlterTable:
    table: TableName
    actions: tuple[object, ...]
    if_exists: bool = False


@dataclass(frozen=True)
class RenameTables:
    pairs: tuple[tuple[TableName, TableName], ...]


@dataclass(frozen=True)
class DropTables:
    tables: tuple[TableName, ...]


@dataclass(frozen=True)
class TruncateTable:
    table: TableName


@dataclass(frozen=True)
class DropDatabase:
    database: str


@dataclass(frozen=True)
class NoTableChange:
    """A statement that changes no table (GRANT, CREATE VIEW, ...)."""


@dataclass(frozen=True)
class Unparsed:
    reason: str
    tables: tuple[TableName, ...] = ()


Statement = (CreateTable | AlterTable | RenameTables | DropTables | TruncateTable |
             DropDatabase | NoTableChange | Unparsed)


# ALTER TABLE actions
@dataclass(frozen=True)
class AddColumns:
    columns: tuple[ColumnSpec, ...]
    position: Position | None = None
    if_not_exists: bool = False
    # the columns that give the rows already there a value other than NULL: a DEFAULT other
    # than NULL, NOT NULL (the type's zero), AUTO_INCREMENT, a generated column (AS (...))
    filled: tuple[str, ...] = ()


@dataclass(frozen=True)
class DropColumn:
    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class ChangeColumn:
    """MODIFY (old == new name) or CHANGE."""

    old: str
    column: ColumnSpec
    position: Position | None = None
    if_exists: bool = False


@dataclass(frozen=True)
class RenameColumn:
    old: str
    new: str


@dataclass(frozen=True)
class RenameTo:
    table: TableName


@dataclass(frozen=True)
class SetPrimaryKey:
    columns: tuple[str, ...]  # () drops it


@dataclass(frozen=True)
class AddIndex:
    """ADD INDEX/KEY/UNIQUE/FULLTEXT/SPATIAL, CREATE INDEX; an unnamed index has name ""."""

    index: Index
    if_not_exists: bool = False
    replace: bool = False  # CREATE OR REPLACE INDEX


@dataclass(frozen=True)
class DropIndex:
    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class RenameIndex:
    old: str
    new: str


@dataclass(frozen=True)
class ConvertCharset:
    charset: str


@dataclass(frozen=True)
class SetEngine:
    engine: str


@dataclass(frozen=True)
class AddForeignKey:
    key: ForeignKey  # name "" when the statement gave none: MariaDB names it table_ibfk_N


@dataclass(frozen=True)
class DropForeignKey:
    name: str


@dataclass(frozen=True)
class AddPeriod:
    """``ADD PERIOD FOR SYSTEM_TIME (start, end)``."""

    start: str
    end: str


@dataclass(frozen=True)
class SetVersioning:
    """``ADD SYSTEM VERSIONING`` (on) or ``DROP SYSTEM VERSIONING``."""

    on: bool


@dataclass(frozen=True)
class RowsChanged:
    """An action that changes stored rows without row events: partition maintenance
    (``TRUNCATE``, ``DROP``, ``EXCHANGE``, ``CONVERT PARTITION``), ``IMPORT TABLESPACE``,
    ``ALTER SEQUENCE``. ``other`` is the second table it moves rows to or from, and
    ``other_fate`` what becomes of it: ``changed``, ``created`` (with this table's columns)
    or ``dropped``."""

    reason: str
    other: TableName | None = None
    other_fate: str = "changed"


@dataclass(frozen=True)
class UnknownAction:
    text: str
