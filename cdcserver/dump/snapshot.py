"""A consistent read view of the source, and the binlog position it corresponds to.

MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` opens an InnoDB read view, and the
server reports the binlog position that view corresponds to in the session status variables
``binlog_snapshot_file`` / ``binlog_snapshot_position`` (both taken under the binlog's commit
lock, so no transaction is half in the view; https://mariadb.com/kb/en/enhancements-for-start-
transaction-with-consistent-snapshot/). ``BINLOG_GTID_POS()`` turns that position into the GTID
state. No lock is held: writers carry on while the dump reads.

MySQL has no such status variables, so the view is opened under a brief ``FLUSH TABLES WITH
READ LOCK`` (held only while ``SHOW MASTER STATUS`` reads the position and GTID set and the
table's definition is read, as ``mysqldump --single-transaction --source-data`` does), then
released before any row is read.

The session reads TIMESTAMPs in UTC, and lifts the statement time limit: a dump's queries run
as long as the table is large.

:class:`ConsistentSnapshot` opens such a snapshot of some tables, checks their definitions and
ends it, for both its readers: the dump's :class:`Snapshot` of one table and a re-read's
``ReadView`` (``reread/readview.py``), which differ only in what they make of a table.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import ER_TABLE_DEF_CHANGED, DefinitionChanged, SourceError
from cdcserver.core.gtid import BinlogPosition, GtidState, binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.replication import source as source_sql
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.history import TRANSACTIONAL_ENGINES

log = logging.getLogger(__name__)

ER_NO_SUCH_TABLE = 1146


@dataclass(frozen=True)
class SnapshotPoint:
    gtid: GtidState
    file: str
    pos: int
    taken: dt.datetime

    @functools.cached_property
    def ordinal(self) -> tuple[int, int]:
        """Its binlog position as something that orders (:func:`binlog_ordinal`)."""
        return binlog_ordinal(self.file, self.pos)

    @functools.cached_property
    def sequences(self) -> frozenset[tuple[int | str, int]]:
        """Its GTID state's :meth:`GtidState.sequences`."""
        return self.gtid.sequences()

    def to_json(self) -> dict[str, object]:
        return {"gtid": str(self.gtid), "file": self.file, "pos": self.pos,
                "taken": self.taken.isoformat()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotPoint:
        return cls(GtidState.parse(data["gtid"]), data["file"], int(data["pos"]),
                   dt.datetime.fromisoformat(data["taken"]))


def prepare_session(conn: Any, mariadb: bool, lock_wait: int | None = None) -> None:
    """A session for long consistent reads: UTC TIMESTAMPs, no statement time limit (in
    two statements: a round trip each, for every reader of a chunked dump). ``lock_wait``:
    the seconds a statement waits for a table's metadata lock (``lock_wait_timeout``; the
    server's default is a year), then fails with error 1205."""
    limit = "max_statement_time" if mariadb else "max_execution_time"
    waits = f", lock_wait_timeout = {int(lock_wait)}" if lock_wait is not None else ""
    for statement in ("SET SESSION time_zone = '+00:00', "
                      "sql_mode = '', "  # e.g. no PAD_CHAR_TO_FULL_LENGTH
                      f"net_write_timeout = 3600, {limit} = 0{waits}",
                      "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"):
        source_sql.query(conn, statement)


def open_snapshot_position(conn: Any) -> tuple[str, int, dt.datetime]:
    """Open a consistent snapshot and say where in the binlog it is, without its GTID state
    (MariaDB; BINLOG_GTID_POS reads the binlog file up to the position, milliseconds per
    hundred megabytes, which a chunked dump does not pay per chunk)."""
    source_sql.query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
    taken = dt.datetime.now(dt.UTC)
    status = {str(k).lower(): v for k, v in
              source_sql.query(conn, "SHOW STATUS LIKE 'binlog_snapshot_%'")}
    file = str(status.get("binlog_snapshot_file") or "")
    if not file:
        raise SourceError("the source reports no binlog snapshot position (is log_bin on?)")
    return file, int(status["binlog_snapshot_position"]), taken


def open_mariadb_point(conn: Any) -> SnapshotPoint:
    """Open a consistent snapshot and say where in the binlog it is (MariaDB)."""
    file, pos, taken = open_snapshot_position(conn)
    gtid = source_sql.query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))[0][0]
    if gtid is None:
        raise SourceError(f"BINLOG_GTID_POS({file!r}, {pos}) is NULL: the snapshot's "
                          "binlog position is not valid on the source")
    return SnapshotPoint(GtidState.parse(str(gtid)), file, pos, taken)


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def qualified(table: TableName) -> str:
    return f"{quote(table.database)}.{quote(table.table)}"


def show_create(conn: Any, table: TableName) -> str:
    """The table's ``SHOW CREATE TABLE`` text."""
    return str(source_sql.query(conn, f"SHOW CREATE TABLE {qualified(table)}")[0][1])


def open_table(conn: Any, table: TableName) -> None:
    """Open the table: in a transaction its metadata lock is then held to the end, so its
    definition cannot change under the read."""
    source_sql.query(conn, f"SELECT 1 FROM {qualified(table)} LIMIT 0")


D = TypeVar("D")


class Held(Protocol):
    """What a snapshot holds on another connection until it closes."""

    def close(self) -> None: ...


class ConsistentSnapshot(Generic[D]):
    """An open consistent snapshot of ``tables``, on its own connection; close() ends it.
    The dump's :class:`Snapshot` and a re-read's ``ReadView`` (``reread/readview.py``) are
    its two readers.

    InnoDB does not refuse to read a table through an older read view after an *instant*
    ALTER (ADD/DROP COLUMN, widening a VARCHAR): the rows come back in the new layout. So a
    schema change committed after the snapshot opened but before this connection took the
    tables' metadata locks must be detected: each definition is read before the snapshot and
    again under the lock, and a difference means a new snapshot. (A second connection
    holding the lock across the snapshot would deadlock: the snapshot's own lock request
    queues behind an ALTER that waits for that connection.) MySQL: the brief global read
    lock around the snapshot keeps schema changes out instead.

    What a reader makes of a table is its own: ``D`` is a definition as it keeps it, read
    by :meth:`_definition_before` and (under the lock) :meth:`_open_table`, each with the
    errors the reader's callers expect. A reader may hold tables on another connection
    from before the snapshot (:meth:`_hold_writes`) and refuse a MySQL position
    (:meth:`_check_mysql_position`).
    """

    lock_wait: int | None = None  # the session's lock_wait_timeout (prepare_session)
    mysql_purpose = "a MySQL snapshot"  # what needs the read lock, as its error says
    changed = "{table} changed while the snapshot opened"  # DefinitionChanged's message
    point: SnapshotPoint
    definitions: dict[TableName, D]  # each table's, under its metadata lock

    def __init__(self, address: SourceAddress, tables: Iterable[TableName]) -> None:
        self.tables = tuple(dict.fromkeys(tables))
        self.conn = source_sql.connect(address)
        self._held: Held | None = None
        try:
            self.info = source_sql.describe(self.conn)
            mariadb = self.info.flavor == "mariadb"
            prepare_session(self.conn, mariadb, lock_wait=self.lock_wait)
            if mariadb:
                before = {table: self._definition_before(table) for table in self.tables}
                self._held = self._hold_writes(address, before)
                self.point = self._open_mariadb()
                self.definitions = self._open_tables()
                for table in self.tables:
                    if before[table] != self.definitions[table]:
                        raise DefinitionChanged(self.changed.format(table=table))
            else:
                self.point = self._open_mysql()
        except BaseException:
            self.conn.close()
            if self._held is not None:
                self._held.close()
            raise

    def _open_mariadb(self) -> SnapshotPoint:
        return open_mariadb_point(self.conn)

    def _open_mysql(self) -> SnapshotPoint:
        try:
            source_sql.query(self.conn, "FLUSH TABLES WITH READ LOCK")
        except pymysql.err.OperationalError as exc:
            raise SourceError(f"{self.mysql_purpose} needs the RELOAD privilege for a brief "
                              f"FLUSH TABLES WITH READ LOCK: {exc}") from exc
        try:
            source_sql.query(self.conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
            taken = dt.datetime.now(dt.UTC)
            position = source_sql.newest_position(self.conn, self.info)
            # Under the read lock no schema change can commit: take the tables' metadata
            # locks now (see the class comment).
            self.definitions = self._open_tables()
        finally:
            source_sql.query(self.conn, "UNLOCK TABLES")
        self._check_mysql_position(position)
        return SnapshotPoint(position.gtid_state, position.file, position.pos, taken)

    def _open_tables(self) -> dict[TableName, D]:
        return {table: self._open_table(table) for table in self.tables}

    def _definition_before(self, table: TableName) -> D | None:
        """The table's definition before the snapshot opens (MariaDB)."""
        raise NotImplementedError

    def _open_table(self, table: TableName) -> D:
        """Take the table's metadata lock (:func:`open_table`), then read its definition."""
        raise NotImplementedError

    def _hold_writes(self, address: SourceAddress, before: dict[TableName, D | None]
                     ) -> Held | None:
        """Hold tables on another connection from before the snapshot to its close (by
        their definitions before it); none by default."""
        return None

    def _check_mysql_position(self, position: BinlogPosition) -> None:
        """Refuse a MySQL position the reader cannot use; any by default."""

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
        if not self.conn.open:
            return
        try:
            source_sql.query(self.conn, "COMMIT")
        except pymysql.err.MySQLError:
            pass
        finally:
            if self.conn.open:
                self.conn.close()


class Snapshot(ConsistentSnapshot[TableDefinition]):
    """The dump's snapshot: of one table, which must exist and whose definition must parse
    (a :class:`SourceError` that says which otherwise); on MySQL its position must carry
    GTIDs."""

    def __init__(self, address: SourceAddress, table: TableName) -> None:
        self.table = table
        super().__init__(address, [table])

    def definition(self) -> tuple[TableDefinition, bool]:
        """The table's definition in this snapshot, and whether its engine is transactional
        (only then are its rows exactly those of the snapshot)."""
        definition = self.definitions[self.table]
        return definition, (definition.engine or "innodb") in TRANSACTIONAL_ENGINES

    def _definition_before(self, table: TableName) -> TableDefinition | None:
        statement = ddl.parse(self._show_create(table), table.database)
        return statement.definition if isinstance(statement, ddl.CreateTable) else None

    def _open_table(self, table: TableName) -> TableDefinition:
        try:
            open_table(self.conn, table)
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == ER_TABLE_DEF_CHANGED:
                raise DefinitionChanged(self.changed.format(table=table)) from exc
            raise SourceError(f"cannot read {table}: {exc}") from exc
        text = self._show_create(table)
        statement = ddl.parse(text, table.database)
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            raise SourceError(f"cannot parse the definition of {table}: {text[:200]}")
        return statement.definition

    def _show_create(self, table: TableName) -> str:
        try:
            return show_create(self.conn, table)
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == ER_NO_SUCH_TABLE:
                raise SourceError(f"no table {table} on the source") from exc
            raise SourceError(f"cannot read the definition of {table}: {exc}") from exc

    def _check_mysql_position(self, position: BinlogPosition) -> None:
        if not position.gtid_state and position.pos > 4:
            raise SourceError("dumps of a MySQL source need GTIDs (gtid_mode=ON): without "
                              "them the changes after a dump cannot be told apart")

    def count(self) -> int:
        return int(source_sql.query(self.conn, f"SELECT COUNT(*) FROM {qualified(self.table)}"
                                    )[0][0])
