"""The schema history describes a table as the server itself does.

Consumers of the databus format read a table's columns as ``SHOW FULL COLUMNS`` gives them
(``int(11)``, ``decimal(8,2)``, ``enum('a','b')``, ``auto_increment``) and its indexes as
``SHOW INDEX`` lists them. Each statement of a script runs on a real MariaDB and is replayed
into a :class:`SchemaHistory`; after every statement the history's description of each table
must equal what the server shows, name for name and in the server's order. The oracle is the
server: nothing here shares code with the description.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cdcserver.core.changes import Index, TableDescription
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.layouts import layout_of
from cdcserver.schema.statements import (
    AddForeignKey,
    AddIndex,
    AlterTable,
    CreateTable,
    DropForeignKey,
    DropIndex,
    RenameIndex,
    SetPrimaryKey,
)
from tests.conftest import Source

pytestmark = pytest.mark.mariadb

SCRIPT = [
    # every type's SHOW COLUMNS text, unnamed keys named after their first column
    "CREATE TABLE a (id INT AUTO_INCREMENT PRIMARY KEY, b TINYINT, c TINYINT UNSIGNED,"
    " d SMALLINT, e MEDIUMINT UNSIGNED, f BIGINT, g DECIMAL, h DECIMAL(5), i FLOAT,"
    " j FLOAT(10), k FLOAT(30), l DOUBLE(10,2), m VARCHAR(20), n CHAR, o BINARY, p BIT,"
    " q YEAR, r DATETIME, s DATETIME(3), t TIME(6), u TIMESTAMP NULL, v ENUM('a','b''c'),"
    " w SET('x','y'), x JSON, y UUID, z INET6, aa BOOL, bb INT ZEROFILL, cc POINT,"
    " ee TEXT, ff BLOB, gg INET4, hh INT(3) NOT NULL, ii BIGINT UNSIGNED,"
    " jj NUMERIC(8,2), kk INTEGER UNSIGNED, ll REAL, mm DATETIME(0),"
    " UNIQUE (m), KEY (m, n), FULLTEXT (ee), CONSTRAINT cx UNIQUE (b), UNIQUE KEY (f),"
    " UNIQUE (hh), KEY (hh), INDEX named USING BTREE (q, r))",
    "CREATE TABLE s (id SERIAL, v INT UNIQUE KEY, w INT UNIQUE)",
    # foreign keys make an index unless another one starts with their columns
    "CREATE TABLE p (id INT PRIMARY KEY)",
    "CREATE TABLE c (x INT, y INT, z INT REFERENCES p (id), FOREIGN KEY (x) REFERENCES p (id),"
    " CONSTRAINT fk2 FOREIGN KEY (y) REFERENCES p (id), UNIQUE (y), KEY (x, z))",
    "ALTER TABLE c ADD COLUMN w INT, ADD CONSTRAINT fkw FOREIGN KEY (w) REFERENCES p (id)",
    "ALTER TABLE c ADD COLUMN v INT, ADD FOREIGN KEY (v) REFERENCES p (id)",
    # indexes added, dropped, renamed; columns dropped and renamed out of them
    "CREATE UNIQUE INDEX ux ON a (l, m)",
    "CREATE INDEX IF NOT EXISTS ux ON a (l)",
    "CREATE FULLTEXT INDEX ft2 ON a (ee)",
    "ALTER TABLE a ADD UNIQUE KEY IF NOT EXISTS u1 (d), DROP KEY m_2, RENAME INDEX hh TO hh9",
    "ALTER TABLE a ADD INDEX (n), ADD INDEX (n), ADD CONSTRAINT cy UNIQUE (c)",
    "DROP INDEX IF EXISTS nothing ON a",
    "DROP INDEX ft2 ON a",
    "ALTER TABLE a DROP INDEX ux, ADD INDEX lm (l, m)",  # a unique key's column cannot go
    "ALTER TABLE a DROP COLUMN l",
    "ALTER TABLE a DROP COLUMN n",
    "ALTER TABLE a CHANGE COLUMN m mm2 VARCHAR(30) NOT NULL",
    "ALTER TABLE a RENAME COLUMN q TO qq",
    "ALTER TABLE s MODIFY id BIGINT UNSIGNED NOT NULL",
    "ALTER TABLE s MODIFY id INT NOT NULL AUTO_INCREMENT",
    "ALTER TABLE a DROP PRIMARY KEY, ADD PRIMARY KEY (id, b)",
    "CREATE TABLE b LIKE a",
    "ALTER TABLE b DROP INDEX cx, ADD INDEX cx (b) USING HASH",
    "CREATE OR REPLACE INDEX cx ON b (c)",
    # a versioned table's unique keys end with its row end
    "CREATE TABLE v (id INT PRIMARY KEY, u INT, UNIQUE (u), KEY (id, u)) WITH SYSTEM VERSIONING",
    "CREATE TABLE w (id INT PRIMARY KEY, u INT, s TIMESTAMP(6) AS ROW START,"
    " e TIMESTAMP(6) AS ROW END, PERIOD FOR SYSTEM_TIME (s, e), UNIQUE (u), KEY (id, u))"
    " WITH SYSTEM VERSIONING",
    "ALTER TABLE v DROP SYSTEM VERSIONING",
]


def test_history_describes_tables_as_show_columns_and_show_index(source: Source) -> None:
    database = source.database
    history = SchemaHistory(None)
    source.execute(f"USE `{database}`")
    for sql in SCRIPT:
        source.execute(f"USE `{database}`", sql)
        history.apply(sql, database, None)
        for name in ("a", "b", "c", "p", "s", "v", "w"):
            table = TableName(database, name)
            definition = history.tables.get(table)
            shown = _shown(source, table)
            if shown is None:
                assert definition is None, (sql, name)
                continue
            assert definition is not None, (sql, name)
            assert definition.describe() == _with_hidden_period(shown, definition), (sql, name)


# Index statements that once made the history forget a table or describe it wrongly: keys
# stated in a column definition of ALTER TABLE, the primary key dropped by its index name, the
# order MariaDB applies an ALTER's actions in (whatever order they are written), a foreign
# key's own index giving way to a stated one, DROP CONSTRAINT of a unique key, ANSI_QUOTES.
ALTER_SCRIPT = [
    "CREATE TABLE p (id INT PRIMARY KEY)",
    "CREATE TABLE r (id INT PRIMARY KEY, a INT, b INT)",
    "ALTER TABLE r DROP INDEX `PRIMARY`",
    "ALTER TABLE r ADD PRIMARY KEY (id)",
    "DROP INDEX `PRIMARY` ON r",
    "ALTER TABLE r ADD COLUMN u INT UNIQUE, ADD PRIMARY KEY (id)",
    "ALTER TABLE r ADD COLUMN sr SERIAL",
    "ALTER TABLE r MODIFY a INT UNIQUE KEY",
    "ALTER TABLE r CHANGE b bb INT UNIQUE",
    "ALTER TABLE r ADD (x INT, y INT, UNIQUE KEY uxy (x, y))",
    "ALTER TABLE r ADD COLUMN pid INT REFERENCES p (id)",
    "ALTER TABLE r ADD INDEX ic (c), ADD COLUMN c INT",
    "ALTER TABLE r ADD INDEX ia2 (a2), RENAME COLUMN x TO a2",
    "CREATE INDEX ia ON r (a)",
    "ALTER TABLE r ADD INDEX ia (y), DROP INDEX ia",
    "ALTER TABLE r DROP CONSTRAINT uxy",
    "ALTER TABLE r DROP KEY `PRIMARY`, ADD UNIQUE KEY uid (id)",
    "CREATE TABLE f (a INT, b INT, c INT, FOREIGN KEY (a) REFERENCES p (id))",
    "ALTER TABLE f ADD INDEX ab (a, b)",
    "ALTER TABLE f ADD CONSTRAINT fc FOREIGN KEY (c) REFERENCES p (id)",
    "ALTER TABLE f ADD UNIQUE KEY (c, b)",
    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES');"
    " CREATE TABLE \"q\" (\"a\" INT, \"b\" INT, KEY (\"a\"))",
    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES');"
    " ALTER TABLE \"q\" ADD INDEX (\"b\"), ADD UNIQUE \"ub\" (\"b\", \"a\")",
    "CREATE TABLE w (id INT PRIMARY KEY, u INT, s TIMESTAMP(6) AS ROW START,"
    " e TIMESTAMP(6) AS ROW END, PERIOD FOR SYSTEM_TIME (s, e)) WITH SYSTEM VERSIONING",
    "SET SESSION system_versioning_alter_history = KEEP; CREATE UNIQUE INDEX uu ON w (u)",
    # types whose SHOW COLUMNS text is not what the statement wrote
    "CREATE TABLE m (e ENUM('x\\\\y', 'a''b'), t TEXT(100), b BLOB(70000), tt TEXT(70000),"
    " vb VARCHAR(5) CHARACTER SET binary, cb CHAR(3) CHARACTER SET binary,"
    " ua INT NOT NULL, ub INT, UNIQUE KEY kb (ub), UNIQUE KEY ka (ua))",
    "ALTER TABLE m MODIFY ub INT NOT NULL",
    "ALTER TABLE m MODIFY ua INT NULL",
]


def test_index_statements_keep_the_table_and_describe_it_as_shown(source: Source) -> None:
    database = source.database
    history = SchemaHistory(None)
    for sql in ALTER_SCRIPT:
        source.execute(f"USE `{database}`", *sql.split("; "))
        history.apply(sql.split("; ")[-1], database, None)
        for name in ("p", "r", "f", "q", "w", "m"):
            table = TableName(database, name)
            definition = history.tables.get(table)
            shown = _shown(source, table)
            if shown is None:
                continue
            assert definition is not None and definition.described, (sql, name)
            assert definition.describe() == _with_hidden_period(shown, definition), (sql, name)


def test_a_table_learned_as_it_is_now_meets_the_statements_that_made_it(
        source: Source) -> None:
    """A table older than the binlog is learned from SHOW CREATE TABLE, as it is now; the
    index statements that follow in the binlog already show. None of them may make the
    history forget the table; its columns stay exact."""
    database = source.database
    for sql in ALTER_SCRIPT:
        source.execute(f"USE `{database}`", *sql.split("; "))
    history = SchemaHistory(None)
    for name in ("p", "r", "f", "q", "w", "m"):
        text = source.query(f"SHOW CREATE TABLE `{database}`.`{name}`")[0][1]
        history.apply(str(text), database, None)
    index_only = (AddIndex, DropIndex, RenameIndex, SetPrimaryKey,
                  AddForeignKey, DropForeignKey)
    for sql in ALTER_SCRIPT:
        statement = sql.split("; ")[-1]
        parsed = ddl.parse(statement, database)
        if isinstance(parsed, AlterTable) and all(isinstance(a, index_only)
                                                      for a in parsed.actions):
            history.apply(statement, database, None)
    for name in ("p", "r", "f", "q", "w", "m"):
        definition = history.tables.get(TableName(database, name))
        assert definition is not None, name
        shown = _shown(source, TableName(database, name))
        assert shown is not None
        assert definition.describe().column_types == _with_hidden_period(
            shown, definition).column_types, name


def test_a_table_learned_from_the_source_is_described_as_shown(source: Source) -> None:
    """The other way into the history: SHOW CREATE TABLE, for tables older than the binlog."""
    database = source.database
    for sql in SCRIPT:
        source.execute(f"USE `{database}`", sql)
    for name in ("a", "b", "c", "p", "s", "v", "w"):
        text = source.query(f"SHOW CREATE TABLE `{database}`.`{name}`")[0][1]
        statement = ddl.parse(str(text), database)
        assert isinstance(statement, CreateTable) and statement.definition is not None
        shown = _shown(source, TableName(database, name))
        assert shown is not None
        assert statement.definition.describe() == _with_hidden_period(shown,
                                                                      statement.definition)


def _with_hidden_period(shown: TableDescription, definition: TableDefinition
                        ) -> TableDescription:
    """What SHOW COLUMNS shows, with the implicit period's two columns, which SHOW COLUMNS
    hides but every row image carries (the description lists them, deliberately)."""
    if not definition.implicit_period:
        return shown
    return replace(shown, column_types=(*shown.column_types, "timestamp(6)", "timestamp(6)"))


def _shown(source: Source, table: TableName) -> TableDescription | None:
    exists = source.query("SELECT COUNT(*) FROM information_schema.tables WHERE "
                          "table_schema = %s AND table_name = %s",
                          (table.database, table.table))[0][0]
    if not exists:
        return None
    quoted = f"`{table.database}`.`{table.table}`"
    columns = source.query(f"SHOW FULL COLUMNS FROM {quoted}")
    auto = [str(c[0]) for c in columns if "auto_increment" in str(c[6])]
    indexes: list[tuple[str, list[str], bool, str]] = []
    for row in source.query(f"SHOW INDEX FROM {quoted}"):
        name, column, non_unique, kind = str(row[2]), str(row[4]), int(row[1]), str(row[10])
        if not indexes or indexes[-1][0] != name:
            indexes.append((name, [], not non_unique, kind.lower()))
        indexes[-1][1].append(column)
    return TableDescription(
        tuple(str(c[1]) for c in columns), auto[0] if auto else None,
        tuple(Index(name, tuple(cols), unique,
                    kind if kind in ("fulltext", "spatial") else "")
              for name, cols, unique, kind in indexes))


def test_a_definition_recorded_without_indexes_learns_them_from_the_source(
        source: Source, tmp_path) -> None:
    """A history written before it kept indexes and AUTO_INCREMENT: its tables learn them
    from the source, when the source's definition agrees, and keep them from then on."""
    database = source.database
    source.execute(f"USE `{database}`",
                   "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, a VARCHAR(10),"
                   " UNIQUE KEY ua (a))")
    table = TableName(database, "t")

    def show_create(name: TableName) -> str:
        return str(source.query(f"SHOW CREATE TABLE `{name.database}`.`{name.table}`")[0][1])

    current = ddl.parse(show_create(table), database)
    assert isinstance(current, CreateTable) and current.definition is not None
    old = current.definition.to_json()
    del old["indexes"]  # as the history recorded it before
    for column in old["columns"]:
        column.pop("auto_increment", None)
    path = tmp_path / "schema_history.jsonl"
    path.write_text(json.dumps({"gtid": "", "table": [database, "t"], "definition": old}) + "\n")

    history = SchemaHistory(str(path), lookup=show_create)
    history.load(GtidState.parse(""))
    before = history.tables[table].describe()
    assert [i.name for i in before.indexes] == ["PRIMARY"] and before.auto_increment is None
    history.reconcile(layout_of(table, current.definition), None)
    assert history.tables[table].describe() == _shown(source, table)

    again = SchemaHistory(str(path))  # recorded: known without asking the source
    again.load(GtidState.parse(""))
    assert again.tables[table].describe() == _shown(source, table)
