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
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import ER_TABLE_DEF_CHANGED, DefinitionChanged, SourceError
from cdcserver.core.gtid import GtidState
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


class Snapshot:
    """An open consistent snapshot of one table, on its own connection; close() ends it.

    InnoDB does not refuse to read a table through an older read view after an *instant*
    ALTER (ADD/DROP COLUMN, widening a VARCHAR): the rows come back in the new layout. So a
    schema change committed after the snapshot opened but before this connection took the
    table's metadata lock must be detected: the definition is read before the snapshot and
    again under the lock, and a difference means a new snapshot. (A second connection
    holding the lock across the snapshot would deadlock: the snapshot's own lock request
    queues behind an ALTER that waits for that connection.) MySQL: the brief global read
    lock around the snapshot keeps schema changes out instead.
    """

    def __init__(self, address: SourceAddress, table: TableName) -> None:
        self.table = table
        self.conn = source_sql.connect(address)
        try:
            self.info = source_sql.describe(self.conn)
            self._session()
            if self.info.flavor == "mariadb":
                before = ddl.parse(self._show_create(), table.database)
                self.point = self._open_mariadb()
                self.definition_read = self._read_definition()
                if not isinstance(before, ddl.CreateTable) or \
                        before.definition != self.definition_read[0]:
                    raise DefinitionChanged(f"{table} changed while the snapshot opened")
            else:
                self.point = self._open_mysql()
        except BaseException:
            self.conn.close()
            raise

    def _session(self) -> None:
        prepare_session(self.conn, self.info.flavor == "mariadb")

    def _open_mariadb(self) -> SnapshotPoint:
        return open_mariadb_point(self.conn)

    def _open_mysql(self) -> SnapshotPoint:
        try:
            source_sql.query(self.conn, "FLUSH TABLES WITH READ LOCK")
        except pymysql.err.OperationalError as exc:
            raise SourceError(f"a MySQL snapshot needs the RELOAD privilege for a brief "
                              f"FLUSH TABLES WITH READ LOCK: {exc}") from exc
        try:
            source_sql.query(self.conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
            taken = dt.datetime.now(dt.UTC)
            position = source_sql.newest_position(self.conn, self.info)
            # Under the read lock no schema change can commit: take the table's metadata
            # lock now (see the class comment).
            self.definition_read = self._read_definition()
        finally:
            source_sql.query(self.conn, "UNLOCK TABLES")
        if not position.gtid_state and position.pos > 4:
            raise SourceError("dumps of a MySQL source need GTIDs (gtid_mode=ON): without "
                              "them the changes after a dump cannot be told apart")
        return SnapshotPoint(position.gtid_state, position.file, position.pos, taken)

    def definition(self) -> tuple[TableDefinition, bool]:
        """The table's definition in this snapshot, and whether its engine is transactional
        (only then are its rows exactly those of the snapshot)."""
        return self.definition_read

    def _read_definition(self) -> tuple[TableDefinition, bool]:
        """Open the table (its metadata lock is then held to the end of the snapshot, so the
        definition cannot change under the dump) and read its definition."""
        table = self.table
        try:
            source_sql.query(self.conn, f"SELECT 1 FROM {qualified(table)} LIMIT 0")
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == ER_TABLE_DEF_CHANGED:
                raise DefinitionChanged(f"{table} changed while the snapshot opened") from exc
            raise SourceError(f"cannot read {table}: {exc}") from exc
        text = self._show_create()
        statement = ddl.parse(text, table.database)
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            raise SourceError(f"cannot parse the definition of {table}: {text[:200]}")
        definition = statement.definition
        return definition, (definition.engine or "innodb") in TRANSACTIONAL_ENGINES

    def _show_create(self) -> str:
        try:
            return str(source_sql.query(self.conn, f"SHOW CREATE TABLE {qualified(self.table)}"
                                        )[0][1])
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == ER_NO_SUCH_TABLE:
                raise SourceError(f"no table {self.table} on the source") from exc
            raise SourceError(f"cannot read the definition of {self.table}: {exc}") from exc

    def count(self) -> int:
        return int(source_sql.query(self.conn, f"SELECT COUNT(*) FROM {qualified(self.table)}"
                                    )[0][0])

    def close(self) -> None:
        if not self.conn.open:
            return
        try:
            source_sql.query(self.conn, "COMMIT")
        except pymysql.err.MySQLError:
            pass
        finally:
            if self.conn.open:
                self.conn.close()
