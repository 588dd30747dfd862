"""The statements a consistent snapshot sends the source, in their order (``dump/snapshot.py``
and the re-read's ``reread/readview.py``): the session, the isolation level, the snapshot, the
read lock, the position, each table's metadata lock and definition, the commit. A fake source
answers and records them, connection by connection."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import DefinitionChanged, SourceError
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import Snapshot
from cdcserver.replication import source as source_sql
from cdcserver.reread.readview import ReadView, TableLocked

DB = "shop"
ORDERS, NOTES, GONE = TableName(DB, "orders"), TableName(DB, "notes"), TableName(DB, "gone")


def create(name: str, engine: str = "InnoDB", column: str = "v INT") -> str:
    return f"CREATE TABLE `{name}` (\n  `id` int(11) NOT NULL,\n  `{column.split()[0]}` " \
           f"{column.split()[1].lower()}(11) DEFAULT NULL,\n  PRIMARY KEY (`id`)\n) " \
           f"ENGINE={engine} DEFAULT CHARSET=utf8mb4"


class FakeSource:
    """Answers the statements a snapshot sends as a source would; ``fail`` raises the error
    number given for a statement that starts with its key, ``after`` runs a change once a
    statement that starts with its key was answered (another session's ALTER)."""

    def __init__(self, flavor: str = "mariadb", tables: dict[str, str] | None = None,
                 gtids: str = "0-1-7") -> None:
        self.flavor = flavor
        self.tables = dict(tables if tables is not None else {"orders": create("orders")})
        self.gtids = gtids
        self.fail: dict[str, int] = {}
        self.after: dict[str, Callable[[], None]] = {}
        self.log: list[tuple[int, str]] = []
        self.connections: list[FakeConnection] = []

    def connect(self, address: SourceAddress) -> FakeConnection:
        self.connections.append(FakeConnection(self, len(self.connections) + 1))
        return self.connections[-1]

    def answer(self, number: int, sql: str, args: Any) -> list[tuple[Any, ...]]:
        self.log.append((number, sql if args is None else f"{sql} {tuple(args)}"))
        for start, code in self.fail.items():
            if sql.startswith(start):
                raise pymysql.err.OperationalError(code, f"error {code}")
        rows = self._rows(sql)
        for start, change in list(self.after.items()):
            if sql.startswith(start):
                del self.after[start]
                change()
        return rows

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        if sql == "SELECT VERSION()":
            return [("10.11.6-MariaDB" if self.flavor == "mariadb" else "8.0.36",)]
        if sql.startswith("SHOW CREATE TABLE ") or sql.startswith("SELECT 1 FROM "):
            name = sql.split("`.`")[1].split("`")[0]
            if name not in self.tables:
                raise pymysql.err.ProgrammingError(1146, f"Table '{DB}.{name}' doesn't exist")
            return [(name, self.tables[name])] if sql.startswith("SHOW") else []
        if sql.startswith("SHOW STATUS LIKE 'binlog_snapshot_%'"):
            return [("binlog_snapshot_file", "bin.000002"), ("binlog_snapshot_position", 900)]
        if sql.startswith("SELECT BINLOG_GTID_POS"):
            return [(self.gtids,)]
        if sql == "SHOW MASTER STATUS":
            return [("bin.000002", 900)]
        if sql.startswith("SELECT @@GLOBAL."):
            return [(self.gtids,)]
        if sql.startswith("SELECT COUNT(*)"):
            return [(3,)]
        return []

    def statements(self) -> list[str]:
        """The log, each statement after the connection it went to (``2: LOCK TABLES``), the
        first queries of each connection (what the server is) left out."""
        return [f"{n}: {sql}" for n, sql in self.log if not sql.startswith(
            ("SELECT VERSION()", "SHOW GLOBAL VARIABLES"))]


class FakeConnection:
    def __init__(self, source: FakeSource, number: int) -> None:
        self.source, self.number, self.open = source, number, True

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def close(self) -> None:
        assert self.open, "closed twice"
        self.open = False
        self.source.log.append((self.number, "(closed)"))


class FakeCursor:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.rows: list[tuple[Any, ...]] = []

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> None:
        self.rows = self.conn.source.answer(self.conn.number, sql, args)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> FakeSource:
    fake = FakeSource()
    monkeypatch.setattr(source_sql, "connect", fake.connect)
    return fake


SESSION = "1: SET SESSION time_zone = '+00:00', sql_mode = '', net_write_timeout = 3600, " \
          "{limit} = 0{waits}"
LEVEL = "1: SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"
MARIADB_POINT = ["1: START TRANSACTION WITH CONSISTENT SNAPSHOT",
                 "1: SHOW STATUS LIKE 'binlog_snapshot_%'",
                 "1: SELECT BINLOG_GTID_POS(%s, %s) ('bin.000002', 900)"]
MYSQL_POINT = ["1: FLUSH TABLES WITH READ LOCK", "1: START TRANSACTION WITH CONSISTENT SNAPSHOT",
               "1: SHOW MASTER STATUS", "1: SELECT @@GLOBAL.gtid_executed"]


def opened(table: str, connection: int = 1) -> list[str]:
    return [f"{connection}: SELECT 1 FROM `{DB}`.`{table}` LIMIT 0",
            f"{connection}: SHOW CREATE TABLE `{DB}`.`{table}`"]


def test_the_dumps_snapshot_on_mariadb(source: FakeSource):
    snapshot = Snapshot(SourceAddress(), ORDERS)
    assert snapshot.definition()[1] and snapshot.count() == 3
    snapshot.close()
    assert source.statements() == [
        SESSION.format(limit="max_statement_time", waits=""), LEVEL,
        f"1: SHOW CREATE TABLE `{DB}`.`orders`", *MARIADB_POINT, *opened("orders"),
        f"1: SELECT COUNT(*) FROM `{DB}`.`orders`", "1: COMMIT", "1: (closed)"]
    assert str(snapshot.point.gtid) == "0-1-7" and snapshot.point.pos == 900


def test_the_dumps_snapshot_on_mysql(source: FakeSource):
    source.flavor, source.gtids = "mysql", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"
    snapshot = Snapshot(SourceAddress(), ORDERS)
    snapshot.close()
    assert source.statements() == [
        SESSION.format(limit="max_execution_time", waits=""), LEVEL, *MYSQL_POINT,
        *opened("orders"), "1: UNLOCK TABLES", "1: COMMIT", "1: (closed)"]


@pytest.mark.parametrize(("setup", "error", "message"), [
    ({"tables": {}}, SourceError, "no table shop.orders on the source"),
    ({"fail": {"SHOW CREATE": 1142}}, SourceError,
     "cannot read the definition of shop.orders: .1142"),
    ({"fail": {"SELECT 1 FROM": 1412}}, DefinitionChanged,
     "shop.orders changed while the snapshot opened"),
    ({"fail": {"SELECT 1 FROM": 1205}}, SourceError, "cannot read shop.orders: .1205"),
    ({"after": "START", "to": "garbage"}, SourceError,
     "cannot parse the definition of shop.orders: garbage"),
    ({"after": "START", "to": create("orders", column="w INT")}, DefinitionChanged,
     "shop.orders changed while the snapshot opened"),
    ({"gtids": None}, SourceError, "BINLOG_GTID_POS.* is NULL"),
    ({"flavor": "mysql", "fail": {"FLUSH": 1227}}, SourceError,
     "^a MySQL snapshot needs the RELOAD privilege for a brief FLUSH TABLES WITH READ LOCK"),
    ({"flavor": "mysql", "gtids": ""}, SourceError, "dumps of a MySQL source need GTIDs"),
])
def test_the_dumps_snapshot_fails_with_what_it_met(source: FakeSource, setup: dict[str, Any],
                                                   error: type, message: str):
    _arrange(source, setup)
    with pytest.raises(error, match=message):
        Snapshot(SourceAddress(), ORDERS)
    assert source.log[-1] == (1, "(closed)") and "COMMIT" not in str(source.log)
    if source.flavor == "mysql" and "FLUSH" not in source.fail:
        assert (1, "UNLOCK TABLES") in source.log


def _arrange(source: FakeSource, setup: dict[str, Any]) -> None:
    source.flavor = setup.get("flavor", source.flavor)
    source.tables = setup.get("tables", source.tables)
    source.gtids = setup.get("gtids", source.gtids)
    source.fail = setup.get("fail", {})
    if "after" in setup:
        source.after[setup["after"]] = lambda: source.tables.update(orders=setup["to"])


def test_a_read_view_on_mariadb_holds_a_table_without_snapshot_on_a_second_connection(
        source: FakeSource):
    source.tables["notes"] = create("notes", engine="MyISAM")
    view = ReadView(SourceAddress(), [ORDERS, NOTES, GONE, ORDERS])
    assert view.definitions == {ORDERS: source.tables["orders"],
                                NOTES: source.tables["notes"], GONE: None}
    view.close()
    session = SESSION.format(limit="max_statement_time", waits=", lock_wait_timeout = 5")
    assert source.statements() == [
        session, LEVEL, *[f"1: SHOW CREATE TABLE `{DB}`.`{t}`" for t in ("orders", "notes",
                                                                        "gone")],
        session.replace("1:", "2:"), LEVEL.replace("1:", "2:"),
        f"2: LOCK TABLES `{DB}`.`notes` READ", *MARIADB_POINT, *opened("orders"),
        *opened("notes"), f"1: SELECT 1 FROM `{DB}`.`gone` LIMIT 0",
        "2: UNLOCK TABLES", "2: (closed)", "1: COMMIT", "1: (closed)"]


def test_a_read_view_on_mysql(source: FakeSource):
    source.flavor = "mysql"
    view = ReadView(SourceAddress(), [ORDERS])
    view.close()
    assert source.statements() == [
        SESSION.format(limit="max_execution_time", waits=", lock_wait_timeout = 5"), LEVEL,
        *MYSQL_POINT, *opened("orders"), "1: UNLOCK TABLES", "1: COMMIT", "1: (closed)"]


@pytest.mark.parametrize(("setup", "error", "message"), [
    ({"fail": {"SHOW CREATE": 1142}}, pymysql.err.OperationalError, "1142"),
    ({"fail": {"SELECT 1 FROM": 1412}}, pymysql.err.OperationalError, "1412"),
    ({"fail": {"SELECT 1 FROM": 1205}}, TableLocked, "shop.orders is locked by another "
                                                     "session"),
    ({"fail": {"LOCK TABLES": 1205}}, TableLocked, "shop.notes: locked by another session"),
    ({"after": "START", "to": create("orders", column="w INT")}, DefinitionChanged,
     "a table's definition changed while the read view opened"),
    ({"flavor": "mysql", "fail": {"FLUSH": 1227}}, SourceError,
     "^re-reading rows from MySQL needs the RELOAD privilege for a brief FLUSH TABLES"),
])
def test_a_read_view_fails_with_what_it_met(source: FakeSource, setup: dict[str, Any],
                                            error: type, message: str):
    source.tables["notes"] = create("notes", engine="MyISAM")
    _arrange(source, setup)
    with pytest.raises(error, match=message):
        ReadView(SourceAddress(), [ORDERS, NOTES])
    assert "COMMIT" not in str(source.log)
    assert not any(conn.open for conn in source.connections)


def test_a_read_view_without_the_lock_tables_privilege_goes_on_unheld(
        source: FakeSource, caplog: pytest.LogCaptureFixture):
    source.tables["notes"] = create("notes", engine="MyISAM")
    source.fail = {"LOCK TABLES": 1142}
    with caplog.at_level(logging.WARNING):
        view = ReadView(SourceAddress(), [ORDERS, NOTES])
    view.close()
    assert "shop.notes: read without holding their writes off" in caplog.text
    held = source.statements().index(f"2: LOCK TABLES `{DB}`.`notes` READ")
    assert source.statements()[held + 1] == "2: (closed)"
    assert source.statements()[-2:] == ["1: COMMIT", "1: (closed)"]
