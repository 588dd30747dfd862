"""The plain records the replicator hands to the sinks.

This module is the contract between the writing side's two halves: the replicator turns binlog
events into these dataclasses, and every sink (the Avro store, Kafka) consumes them. Nothing here
knows about python-mysql-replication, Avro or Kafka.

A transaction arrives as ``Begin``, then any number of ``Rows`` and ``Ddl``, then ``Commit``.
``Abort`` ends an open transaction without committing it (the connection dropped mid-way; the
replicator resumes from the previous transaction). Row values are tuples in column order, with
the Python types listed in ``protocol.md`` ("Type mapping").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from cdcserver.core.gtid import BinlogPosition, Gtid
from cdcserver.core.names import TableName


class EventType(StrEnum):
    """MaxScale's ``event_type`` symbols, in MaxScale's order (the Avro enum indexes 0..3)."""

    INSERT = "insert"
    UPDATE_BEFORE = "update_before"
    UPDATE_AFTER = "update_after"
    DELETE = "delete"


class RowsKind(StrEnum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class ColumnDef:
    """One column as the binlog's table map (plus optional metadata) describes it.

    ``binlog_type`` is the real type (ENUM and SET resolved from a STRING column's metadata);
    ``meta`` is the type's table-map metadata as one integer (see ``tablemap.py``).
    ``charset`` is the Python codec of a character column, None for binary data.
    ``extended`` names a MariaDB type the binlog cannot express (``inet4``, ``inet6``, ``uuid``,
    ``json``), learned from the schema history.
    """

    name: str
    binlog_type: int
    meta: int = 0
    unsigned: bool = False
    nullable: bool = True
    charset: str | None = None
    enum_values: tuple[str, ...] = ()
    set_values: tuple[str, ...] = ()
    geometry_type: int = 0
    extended: str | None = None
    # A [capture] column rule the value is stored under (cdcserver/schema/masking.py):
    # "exclude" (in a layout's ``image`` only), "hash", or "mask:N"; None: the clear value.
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Index:
    """An index as ``SHOW INDEX`` lists it: ``kind`` is "fulltext" or "spatial", or "" for
    an ordinary (B-tree or hash) index."""

    name: str
    columns: tuple[str, ...]
    unique: bool = False
    kind: str = ""
    # made by a foreign key for itself, not stated: it goes when a stated index that
    # starts with its columns comes (not shown by SHOW INDEX, so not compared)
    generated: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class TableDescription:
    """What a table's DDL says and its table map cannot: each column's type as ``SHOW
    COLUMNS`` shows it (``int(11)``, ``varchar(255)``, ``enum('a','b')``), the AUTO_INCREMENT
    column, and every index, PRIMARY first, in ``SHOW INDEX`` order."""

    column_types: tuple[str, ...]
    auto_increment: str | None
    indexes: tuple[Index, ...]


@dataclass(frozen=True, slots=True)
class TableLayout:
    """A table's columns at one point in the binlog."""

    database: str
    table: str
    columns: tuple[ColumnDef, ...]
    primary_key: tuple[int, ...] = ()
    # What the table map's optional metadata carried (binlog_row_metadata): "full" (names,
    # ENUM/SET labels, primary key), "minimal" (signedness, character sets) or "none". The
    # schema history supplies the rest.
    metadata: str = "full"
    # A SEQUENCE: one row, which each write replaces (logged as an insert).
    sequence: bool = False
    # The schema history's description of the table, when it knows the table.
    description: TableDescription | None = field(default=None, compare=False)
    # For a layout the [capture] column rules changed (cdcserver/schema/masking.py): the
    # columns of the binlog's row image, each with its rule, which ``columns`` (what is
    # stored) leaves out or replaces. None: ``columns`` are the image's.
    image: tuple[ColumnDef, ...] | None = field(default=None, compare=False)
    salt: bytes | None = field(default=None, compare=False, repr=False)  # of a "hash" rule

    @property
    def qualified_name(self) -> str:
        """The table as the protocol names it (a name quoted when it holds a dot...)."""
        return TableName(self.database, self.table).ref()

    @property
    def image_columns(self) -> tuple[ColumnDef, ...]:
        """The columns of the binlog's row image, each with its rule if it has one."""
        return self.columns if self.image is None else self.image

    def signature(self) -> tuple[Any, ...]:
        """What identifies a table version: a change here means a new version file."""
        return tuple(
            (c.name, c.binlog_type, c.meta, c.unsigned, c.charset is None, c.enum_values,
             c.set_values, c.extended, c.rule)
            for c in self.columns
        )


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts. ``server_id`` is the originating server (the GTID's)."""

    gtid: Gtid
    timestamp: int
    standalone: bool = False  # MariaDB FL_STANDALONE: a DDL or non-transactional statement
    commit_id: int | None = None  # MariaDB group commit id, when the primary recorded one
    file: str = ""  # where the transaction starts: its GTID event's binlog file and offset
    pos: int = 0


class RowImages(NamedTuple):
    """A row event's row images as the binlog has them (uncompressed): ``data[start:stop]``."""

    data: bytes
    start: int
    stop: int


@dataclass(slots=True)
class Rows:
    """The rows of one binlog row event. For UPDATE, ``rows`` alternates before and after
    images: ``[before1, after1, before2, after2, ...]``.

    ``images``, when set, are the event's row images undecoded, for a sink that writes them
    without Python values in between (the Avro store's compiled path); ``rows`` then decodes
    them the first time something reads it."""

    layout: TableLayout
    kind: RowsKind
    timestamp: int
    rows: Sequence[tuple[Any, ...]] = field(default_factory=list)
    file: str = ""  # the binlog file and the event's end position (its header's log_pos)
    pos: int = 0
    images: RowImages | None = None
    # Why these rows are here when the binlog did not carry them (a repair: see Rowless);
    # empty for the rows of a row event.
    repair: str = ""
    start: int = 0  # where the row event starts in ``file`` (0: not from a row event)
    # A change of a table whose repair beside the stream holds its changes back, by that
    # repair's cause: ``withheld`` here, in its own transaction, ``released`` where the repair
    # lets it go. A sink that holds that repair from before a restart (it is being read again)
    # gets it here, the others where it is released (the pipeline's replay filter).
    withheld: str = ""
    released: str = ""
    # A row event told against the rows a consumer holds while repairs of its table wait
    # (:mod:`cdcserver.reread.asheld`), by those repairs' causes: ``as_held_for`` the change
    # told so, for a sink that does not hold them all; ``as_logged_for`` the binlog's own,
    # for a sink that holds them all from before a restart (its rows are the source's).
    as_held_for: tuple[str, ...] = ()
    as_logged_for: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TableChange:
    """What a schema statement did to one table, as the schema history understood it.

    ``kind`` is ``create``, ``alter``, ``truncate`` or ``drop`` (a rename drops the old name
    and creates the new one, with ``note`` saying so). ``layout`` is the table's new columns
    when the history knows them (create/alter), else None.
    """

    kind: str
    database: str
    table: str
    layout: TableLayout | None = None
    note: str = ""
    changed: bool = True  # the table's definition changed (False for index-only ALTERs)
    renamed: TableName | None = None  # for a rename: the table's other name
    # Why the statement changed stored rows without row events (partition maintenance, a
    # value-rewriting ALTER...), for people; empty when it changed no stored value.
    rewrites: str = ""
    # The columns an ALTER renamed, (old, new) each: their values are kept under the new name
    renamed_columns: tuple[tuple[str, str], ...] = ()
    # An ALTER's: the table's columns before it, when the history knew them
    previous: TableLayout | None = None


@dataclass(frozen=True, slots=True)
class Ddl:
    """A schema statement, as executed on the primary. ``kind`` classifies the statement
    (``create``, ``alter``, ``rename``, ``drop``, ``truncate``, or ``query`` for anything
    that changes no table) and ``changes`` lists its effect on each table."""

    database: str
    sql: str
    timestamp: int
    kind: str = "query"
    changes: tuple[TableChange, ...] = ()
    file: str = ""  # the binlog file and the event's end position (its header's log_pos)
    pos: int = 0
    start: int = 0  # where the statement's event starts in ``file``
    # An ALTER held for its table's repair beside the stream, by the repair's cause (as
    # :attr:`Rows.withheld`): withheld in its own transaction (every sink's replay filter
    # then sees the cause), released where it goes out.
    withheld: str = ""
    released: str = ""


@dataclass(frozen=True, slots=True)
class ForeignKeyEdge:
    """A foreign key along which a change to ``parent``'s rows reaches ``child``'s: the
    child's ``columns`` reference the parent's ``parent_columns``; ``on_delete`` and
    ``on_update`` are the referential actions (``cascade``, ``set null``, ``set default``,
    ``restrict``, ``no action``). ``layout`` is the child's columns when known."""

    parent: TableName
    child: TableName
    columns: tuple[str, ...]
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str
    layout: TableLayout | None = None


@dataclass(frozen=True, slots=True)
class Rowless:
    """Rows of a table changed in this transaction without row events, recognised where it
    happened: a foreign key's cascade, or a statement that rewrote or removed stored rows.

    ``reason`` says what did it, for people. ``columns``/``values`` say which rows: those
    whose ``columns`` held one of ``values`` before (a foreign key's columns and the parent
    keys the transaction deleted or changed); no ``columns``: any row of the table.
    ``layout`` is the table's columns as they are after the change, when known; ``edges`` the
    cascading foreign keys a repair of these rows may in turn follow."""

    database: str
    table: str
    reason: str
    columns: tuple[str, ...] = ()
    values: tuple[tuple[Any, ...], ...] = ()
    layout: TableLayout | None = None
    edges: tuple[ForeignKeyEdge, ...] = ()

    @property
    def qualified_name(self) -> str:
        """The table as the protocol names it (a name quoted when it holds a dot...)."""
        return TableName(self.database, self.table).ref()


@dataclass(frozen=True, slots=True)
class Commit:
    """The transaction is complete; ``position`` is where the replica stands after it."""

    position: BinlogPosition
    timestamp: int


@dataclass(frozen=True, slots=True)
class Abort:
    """Discard the open transaction: it will be read again after a reconnect. ``again``:
    the binlog itself says so (a rollback the service cannot follow row by row), and the
    stream opens the same transaction again right away; so does every replay of it."""

    reason: str
    again: bool = False


@dataclass(frozen=True, slots=True)
class Quarantine:
    """From here on, one table's changes cannot be stored exactly (a change without row events
    that could not be re-read, rows that do not decode): its stream stops at this transaction
    until a resync (:class:`Release`) brings it back. Every other table goes on."""

    database: str
    table: str
    cause: str


@dataclass(frozen=True, slots=True)
class Release:
    """A quarantined table's resync: the table was read again at a watermark, and this
    transaction's next changes (a ``resync`` version, then the records that bring the stream
    to the table's rows there) make its stream exact again; its changes are stored again."""

    database: str
    table: str
    note: str


Change = Begin | Rows | Ddl | Rowless | Commit | Abort | Quarantine | Release
