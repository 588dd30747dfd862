"""One consistent read of the source at a watermark, with rows in the replication's values.

A :class:`ReadView` is a transaction on its own connection, opened and ended as the dump's
snapshot is (``dump/snapshot.py``, :class:`ConsistentSnapshot`): on MariaDB ``START TRANSACTION
WITH CONSISTENT SNAPSHOT``, whose binlog position and GTID state the server reports; on MySQL
the same under a brief ``FLUSH TABLES WITH READ LOCK``. That position is the watermark: the
rows read are exactly the table's rows after every transaction before it and none after. The
tables to be read are opened (their metadata lock taken) right after the view opens, and
their definitions are read before and after: InnoDB would otherwise let an *instant* ALTER
committed in between show rows in a layout the view does not know (:class:`DefinitionChanged`:
open a new view).

A consistent snapshot holds InnoDB's rows, not those of a table without one (MyISAM, Aria,
MEMORY): a read of it sees every write up to the moment it reads, after the watermark too,
and the stream then carries those writes again. So on MariaDB another session holds such
tables with ``LOCK TABLES ... READ`` from before the watermark until the view closes
(:class:`_WritesHeld`); the applications' writes to them wait meanwhile, as under
``mariadb-dump --lock-tables``. It needs the ``LOCK TABLES`` privilege; without it the read
goes on unheld, with a warning.

Values are selected in the dump's text forms (``dump/scan.py``) and converted to the types the
binlog decoder gives (:mod:`.values`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pymysql

from cdcserver.core.capture import EXCLUDE, NO_COLUMN_RULES, ColumnRules
from cdcserver.core.changes import TableLayout
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import ER_TABLE_DEF_CHANGED, SourceError, SourceUnavailable
from cdcserver.core.names import TableName
from cdcserver.dump import rawrows
from cdcserver.dump.scan import select_expression
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    ConsistentSnapshot,
    open_table,
    prepare_session,
    qualified,
    quote,
    show_create,
)
from cdcserver.replication import source as source_sql
from cdcserver.reread.values import adapter, from_text, same_value
from cdcserver.schema import ddl
from cdcserver.schema.layouts import layout_of
from cdcserver.schema.masking import RowFunction, project_layout, rule_functions
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format import dump as dump_format
from mariadb_cdc_client.format.schema import Field

log = logging.getLogger(__name__)

_ACCESS_DENIED = frozenset({1044, 1142, 1227})
# Engines whose rows a consistent snapshot holds; any other table's writes are held off
_SNAPSHOT_ENGINES = frozenset({"innodb", "rocksdb", "tokudb"})
_ENGINE = re.compile(r"\)\s*ENGINE=(\w+)", re.IGNORECASE)
ER_LOCK_WAIT_TIMEOUT = 1205
# Seconds a read waits for a table's metadata lock. Replication waits with it: a session that
# holds the table (LOCK TABLES, a long ALTER) would otherwise stop every table's stream for as
# long as it likes (the server's lock_wait_timeout is a year). Past it the table is
# quarantined alone and resynced by itself (app/resyncs.py) once the lock is gone.
LOCK_WAIT = 5


# A read that failed for every table, not for the tables read (the source's state: replication
# restarts and the read is tried again), by MariaDB's error numbers: can't connect, gone away,
# lost, too many connections, shutting down, connection killed, the account refused. Any
# other (a table's privilege, a lock wait, its definition) concerns the tables read.
_UNREACHABLE_ERRNOS = frozenset({2002, 2003, 2006, 2013, 2055, 1040, 1045, 1053, 1927})


def unreachable(exc: BaseException) -> bool:
    if isinstance(exc, (SourceUnavailable, pymysql.err.InterfaceError)):
        return True
    return bool(exc.args) and exc.args[0] in _UNREACHABLE_ERRNOS


def definition_changed(exc: BaseException) -> bool:
    """A read that met a schema statement newer than its snapshot (error 1412): read again."""
    return isinstance(exc, pymysql.err.MySQLError) and bool(exc.args) and \
        exc.args[0] == ER_TABLE_DEF_CHANGED

class TableLocked(SourceError):
    """Another session held a table the read needs for longer than :data:`LOCK_WAIT`."""


class DefinitionUnreadable(SourceError):
    """The source's definition of a table could not be parsed (SHOW CREATE TABLE)."""
KEYS_PER_QUERY = 500

Row = tuple[Any, ...]


def check_readable(address: SourceAddress, table: TableName) -> None:
    """Raise what a read of ``table`` would meet first (its privilege, another session's
    lock held past :data:`LOCK_WAIT`), in a second: a read that folds the stream's view of a
    big table first learns it before minutes of work, not after."""
    conn = source_sql.connect(address)
    try:
        info = source_sql.describe(conn)
        prepare_session(conn, info.flavor == "mariadb", lock_wait=LOCK_WAIT)
        _lock_table(conn, table)
    finally:
        conn.close()


def _lock_table(conn: Any, table: TableName) -> bool:
    """Take ``table``'s metadata lock (held to the end of the session's transaction); False
    when the table does not exist. Another session holding it past :data:`LOCK_WAIT` raises
    :class:`TableLocked`."""
    try:
        open_table(conn, table)
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] == ER_NO_SUCH_TABLE:
            return False
        if exc.args and exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
            raise TableLocked(
                f"{table} is locked by another session (LOCK TABLES, or a schema statement "
                f"that holds it) for longer than {LOCK_WAIT} s; it is read again when the "
                "lock is gone") from exc
        raise
    return True


class ReadView(ConsistentSnapshot[str | None]):
    """A consistent read of ``tables`` on the source; ``close()`` ends it. A table's
    definition is its ``SHOW CREATE TABLE`` text, None where the table does not exist; the
    source's errors reach the caller as they are, but for a lock held past
    :data:`LOCK_WAIT` (:class:`TableLocked`)."""

    lock_wait = LOCK_WAIT
    mysql_purpose = "re-reading rows from MySQL"
    changed = "a table's definition changed while the read view opened"

    def __init__(self, address: SourceAddress, tables: Iterable[TableName],
                 columns: ColumnRules = NO_COLUMN_RULES) -> None:
        self.columns = columns  # the [capture] column rules: rows are read as stored
        super().__init__(address, tables)

    def _definition_before(self, table: TableName) -> str | None:
        return self._show_create(table)

    def _hold_writes(self, address: SourceAddress, before: dict[TableName, str | None]
                     ) -> _WritesHeld | None:
        unheld = without_snapshot(before)
        return _WritesHeld(address, unheld) if unheld else None

    def _open_table(self, table: TableName) -> str | None:
        return self._show_create(table) if _lock_table(self.conn, table) else None

    def _show_create(self, table: TableName) -> str | None:
        try:
            return show_create(self.conn, table)
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == ER_NO_SUCH_TABLE:
                return None
            raise

    def source_layout(self, table: TableName) -> TableLayout | None:
        """The table's columns as the source defines them at the watermark (None: the table
        does not exist there). A read of a whole table uses them, not the stream's: where
        the source has moved on, the stream's columns may no longer be the table's (a
        renamed, dropped or retyped column), and its values would not read."""
        text = self.definitions.get(table)
        if text is None:
            return None
        statement = ddl.parse(text, table.database)
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            raise DefinitionUnreadable(f"{table}: cannot read its definition on the source: "
                                       f"{text[:200]!r}")
        layout = layout_of(table, statement.definition)
        projection = project_layout(layout, self.columns)
        return layout if projection is None else projection.layout

    def rows(self, layout: TableLayout, key: Sequence[int] = (),
             keys: Sequence[Row] | None = None) -> list[Row]:
        """The table's rows, or (``keys``) those whose columns ``key`` (indexes into the
        layout) hold one of the given values, in ``layout``'s column order, each value as
        ``layout`` stores it (a hashed column's hash: the rules are applied here, before
        anything compares or keeps a clear value)."""
        table = TableName(layout.database, layout.table)
        if self.definitions.get(table) is None:
            return []
        fields = TableSchema.from_layout(clear_layout(layout), 0, "").columns
        select = f"SELECT {', '.join(select_expression(f) for f in fields)} FROM " \
                 f"{qualified(table)}"
        if "WITH SYSTEM VERSIONING" in (self.definitions.get(table) or ""):
            select += " FOR SYSTEM_TIME ALL"  # its history rows are rows of its stream
        stored = rule_functions(layout, self.columns.salt)
        if keys is None:
            return self._query(select, fields, stored)
        rows: list[Row] = []
        names = ", ".join(quote(layout.columns[i].name) for i in key)
        for start in range(0, len(keys), KEYS_PER_QUERY):
            chunk = keys[start:start + KEYS_PER_QUERY]
            values = ", ".join("(" + ", ".join(self._literal(v) for v in k) + ")"
                               for k in chunk)
            rows += self._query(f"{select} WHERE ({names}) IN ({values})", fields, stored)
        return rows

    def row_batches(self, layout: TableLayout) -> Iterator[list[Row]]:
        """The whole table's rows as :meth:`rows` reads them, a batch at a time as the server
        sends them (a table of any size in bounded memory)."""
        table = TableName(layout.database, layout.table)
        if self.definitions.get(table) is None:
            return
        fields = TableSchema.from_layout(clear_layout(layout), 0, "").columns
        select = f"SELECT {', '.join(select_expression(f) for f in fields)} FROM " \
                 f"{qualified(table)}"
        stored = rule_functions(layout, self.columns.salt)
        parse = TextRows(fields)
        for batch in rawrows.query_rows(self.conn, select):
            rows = parse(batch)
            yield rows if stored is None else [stored(row) for row in rows]

    def versioned(self, table: TableName) -> bool:
        """Whether the table keeps history rows (system versioning) at the watermark."""
        return "WITH SYSTEM VERSIONING" in (self.definitions.get(table) or "")

    def _query(self, sql: str, fields: tuple[Field, ...],
               stored: RowFunction | None = None) -> list[Row]:
        parse = TextRows(fields)
        rows = []
        for batch in rawrows.query_rows(self.conn, sql):
            rows += parse(batch)
        return rows if stored is None else [stored(row) for row in rows]

    def _literal(self, value: Any) -> str:
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)  # the session is in UTC
        literal: str = self.conn.escape(value)
        return literal


def without_snapshot(definitions: dict[TableName, str | None]) -> list[TableName]:
    """The tables whose engine a consistent snapshot does not hold still (MyISAM, Aria...),
    by their definitions."""
    found = []
    for table, text in definitions.items():
        engine = _ENGINE.search(text or "")
        if engine is not None and engine.group(1).lower() not in _SNAPSHOT_ENGINES:
            found.append(table)
    return found


class _WritesHeld:
    """Another session's ``LOCK TABLES ... READ`` of ``tables`` (see the module's
    description): taken before the watermark, let go when the view closes."""

    def __init__(self, address: SourceAddress, tables: list[TableName]) -> None:
        self.conn = source_sql.connect(address)
        try:
            prepare_session(self.conn, True, lock_wait=LOCK_WAIT)
            source_sql.query(self.conn, "LOCK TABLES " +
                             ", ".join(f"{qualified(t)} READ" for t in tables))
        except pymysql.err.MySQLError as exc:
            self.conn.close()
            names = ", ".join(map(str, tables))
            if exc.args and exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
                raise TableLocked(f"{names}: locked by another session for longer than "
                                  f"{LOCK_WAIT} s; read again when the lock is gone") from exc
            if not (exc.args and exc.args[0] in _ACCESS_DENIED):
                raise
            log.warning("%s: read without holding their writes off (no snapshot holds them): "
                        "%s; grant the replication user LOCK TABLES for exact repairs of "
                        "such tables", names, exc.args[-1])

    def close(self) -> None:
        if self.conn.open:
            with contextlib.suppress(pymysql.err.MySQLError):
                source_sql.query(self.conn, "UNLOCK TABLES")
            self.conn.close()


def clear_layout(layout: TableLayout) -> TableLayout:
    """The columns a stored layout keeps, typed as the source types them: a hashed BLOB is
    read as its bytes (then hashed), not as the text its stored field holds."""
    if layout.image is None:
        return layout
    kept = tuple(replace(c, rule=None) for c in layout.image if c.rule != EXCLUDE)
    return replace(layout, columns=kept, image=None, description=None)


class TextRows:
    """Rows in the dump's row form (``["<base64>",null,...]``) to tuples of the binlog
    decoder's values: a batch at a time by the client's compiled dump decoder where it is
    built (``mariadb_cdc_client.format.dump``: the same values as ``value_decoder``, several
    times faster; a re-read of a whole table is most of a repair), each value then adapted
    (:func:`values.from_text`); row by row in Python for what it hands back."""

    def __init__(self, fields: tuple[Field, ...]) -> None:
        self.converters = [from_text(f) for f in fields]
        self.names = [str(i) for i in range(len(fields))]
        adapters = [adapter(f) for f in fields]
        self.adapters = [(i, adapt) for i, adapt in enumerate(adapters) if adapt is not same_value]
        self.compiled = dump_format.compiled_rows_parser(fields, self.names)

    def __call__(self, batch: list[bytes]) -> list[Row]:
        if self.compiled is not None and batch:
            parsed = self.compiled.parse(b'{"action":"insert","rows":[' + b",".join(batch) +
                                         b"]}")
            if parsed is not None:
                return [self._adapted([row[n] for n in self.names]) for row in parsed.rows]
        return [self._python(raw) for raw in batch]

    def _adapted(self, values: list[Any]) -> Row:
        for i, adapt in self.adapters:
            if values[i] is not None:
                values[i] = adapt(values[i])
        return tuple(values)

    def _python(self, raw: bytes) -> Row:
        values = json.loads(raw)
        return tuple(convert(None if v is None else base64.b64decode(v))
                     for convert, v in zip(self.converters, values, strict=True))
