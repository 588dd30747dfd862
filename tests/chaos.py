"""A seeded random generator of schema migrations and row changes, and a differential check.

:class:`Migrations` writes what applications and their migration tools (Flyway, Liquibase,
Rails) do to a database: ``ADD``/``DROP``/``RENAME``/``MODIFY``/``CHANGE`` of columns
(narrowing types, defaults, ``NOT NULL``, ``FIRST``/``AFTER``, ``ALGORITHM=INSTANT``), two
columns swapping names in one statement, ``RENAME TABLE`` (swaps too), ``TRUNCATE``, partition
maintenance, foreign keys with cascades, system versioning on and off, in quick succession
and interleaved with inserts, updates and deletes, single and in multi-table transactions.
It learns each table's columns from ``information_schema`` after every schema statement, so
what it writes is mostly valid; what the source refuses (a narrowing that would cut data in
strict mode, a duplicate key) is recorded and skipped, as an application would see it fail.

:func:`run` executes the statements against a real MariaDB while ``cdcserver run`` replicates
them in a process of its own, killed with ``kill -9`` at random points and started again;
then every table is rebuilt from its raw JSON stream (``tests/oracle.py``, no code of the
service) and compared with ``SELECT`` on the source, value by value. A failure names the seed
and the statements, so it can be replayed (``python -m bench.bench_chaos --seed N``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdcserver.core.lifetime import die_with_parent
from tests.helpers import memory_mib
from tests.oracle import (
    Comparison,
    column_types,
    compare,
    null_by_default,
    primary_key,
    read_renamed,
    rebuild,
    source_rows,
)

GENERIC = ("t1", "t2", "t3", "t4")
SESSION = ("SET SESSION system_versioning_alter_history = KEEP",
           "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION'",
           "SET SESSION time_zone = '+00:00'")
IMPLICIT = {"row_start": "timestamp", "row_end": "timestamp"}
XAER_NOTA = 1397  # MariaDB's "Unknown XID"
PRUNE_EVERY, KEEP_ROWS = 50, 200  # a table's old rows are deleted now and then

# (a column type, an expression for one of its values given a random integer)
TYPES: list[tuple[str, Callable[[int], str]]] = [
    ("INT", lambda n: str(n % 100000 - 50000)),
    ("BIGINT", lambda n: str(n * 7919)),
    ("TINYINT", lambda n: str(n % 200 - 100)),
    ("VARCHAR(20)", lambda n: f"'v{n % 997}é'"),
    ("VARCHAR(4)", lambda n: f"'{n % 9999}'"),
    ("DECIMAL(10,3)", lambda n: f"{n % 100000}.{n % 1000:03d}"),
    ("DATETIME(3)", lambda n: f"'2024-0{1 + n % 9}-1{n % 9} 1{n % 9}:0{n % 6}:00.{n % 1000:03d}'"),
    ("DATE", lambda n: f"'2023-1{n % 3}-0{1 + n % 9}'"),
    ("TEXT", lambda n: f"'text {n}'"),
    ("DOUBLE", lambda n: f"{n / 7:.4f}"),
]
WIDER = {"TINYINT": "INT", "INT": "BIGINT", "VARCHAR(4)": "VARCHAR(20)",
         "VARCHAR(20)": "VARCHAR(40)", "DATE": "DATETIME(3)", "DECIMAL(10,3)": "DECIMAL(12,4)"}
NARROWER = {"BIGINT": "INT", "INT": "SMALLINT", "VARCHAR(20)": "VARCHAR(6)",
            "VARCHAR(40)": "VARCHAR(10)", "DECIMAL(10,3)": "DECIMAL(10,1)",
            "DATETIME(3)": "DATETIME", "DOUBLE": "FLOAT", "TEXT": "VARCHAR(30)"}


@dataclass
class Table:
    name: str
    columns: dict[str, str]  # name -> column type as information_schema gives it
    versioned: bool = False
    kind: str = "generic"  # generic, parent, child, partitioned


@dataclass
class Executed:
    sql: str
    error: str = ""  # what the source said when it refused it


class Migrations:
    """The statement generator (see the module's description)."""

    def __init__(self, conn: Any, database: str, seed: int,
                 connect: Callable[[], Any] | None = None) -> None:
        self.conn = conn
        # With ``connect``: application sessions too (see :meth:`_session`), on connections
        # of their own: XA transactions left prepared, statement logging, savepoints.
        self.connect = connect
        self.prepared: list[str] = []  # xids of XA transactions prepared, not completed
        self.database = database
        self.rng = random.Random(seed)
        self.tables: dict[str, Table] = {}
        self.next_id: dict[str, int] = {}
        self.counter = 0
        self.log: list[Executed] = []

    # -- running --------------------------------------------------------------------------

    def execute(self, *statements: str) -> bool:
        """Run statements (several: one transaction); False if the source refused one."""
        with self.conn.cursor() as cur:
            try:
                for sql in statements:
                    cur.execute(sql)
            except pymysql.err.MySQLError as exc:
                if len(statements) > 1:
                    cur.execute("ROLLBACK")
                self.log.append(Executed(" ; ".join(statements), str(exc.args[:2])))
                return False
        self.log.append(Executed(" ; ".join(statements)))
        return True

    def setup(self) -> None:
        for sql in SESSION:
            with self.conn.cursor() as cur:
                cur.execute(sql)
        for name in GENERIC:
            self.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, a INT, b VARCHAR(20), "
                         "d DECIMAL(10,3), ts DATETIME(3))")
        self.execute("CREATE TABLE p (id INT PRIMARY KEY, name VARCHAR(20))")
        self.execute("CREATE TABLE c (id INT PRIMARY KEY, pid INT, v VARCHAR(20), KEY (pid), "
                     "FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE)")
        self.execute("CREATE TABLE c2 (id INT PRIMARY KEY, pid INT, KEY (pid), FOREIGN KEY "
                     "(pid) REFERENCES p (id) ON DELETE SET NULL ON UPDATE SET NULL)")
        self.execute("CREATE TABLE _tick (id INT AUTO_INCREMENT PRIMARY KEY)")  # not drawn
        if self.connect is not None:
            with self.conn.cursor() as cur:  # a prepared XA's row locks fail a statement fast
                cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            self.execute("CREATE TABLE m (id INT PRIMARY KEY, a INT, b VARCHAR(20)) "
                         "ENGINE=MyISAM")
            self.next_id["m"] = 1
            self.refresh("m")
            self.tables["m"].kind = "myisam"
        self.execute("CREATE TABLE pt (id INT PRIMARY KEY, v INT) PARTITION BY RANGE (id) ("
                     "PARTITION p0 VALUES LESS THAN (1000), PARTITION p1 VALUES LESS THAN "
                     "(2000), PARTITION p2 VALUES LESS THAN MAXVALUE)")
        for name in (*GENERIC, "p", "c", "c2", "pt"):
            self.next_id[name] = 1
            self.refresh(name)
        self.tables["p"].kind = "parent"
        self.tables["c"].kind = self.tables["c2"].kind = "child"
        self.tables["pt"].kind = "partitioned"
        for _ in range(6):
            self._insert(self.tables["p"], rows=4)
        for table in list(self.tables.values()):
            if table.kind != "parent":
                self._insert(table, rows=5)

    def refresh(self, name: str) -> None:
        """Learn a table's columns from the source (after a schema statement)."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                        (self.database, name))
            columns = {str(n): str(t).upper() for n, t in cur.fetchall()}
            cur.execute("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE "
                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s", (self.database, name))
            found = cur.fetchone()
        if not columns or found is None:
            self.tables.pop(name, None)
            return
        table = self.tables.setdefault(name, Table(name, columns))
        table.columns = columns
        table.versioned = str(found[0]) == "SYSTEM VERSIONED"

    def step(self) -> None:
        """One random statement (or transaction)."""
        self.counter += 1
        if self.counter % PRUNE_EVERY == 0:  # a long run's tables stay small
            table = self._random_table("generic")
            self.complete_prepared()
            if table is not None:
                keep = self.next_id.get(table.name, 0) - KEEP_ROWS
                self.execute(f"DELETE FROM `{table.name}` WHERE id < {keep}")
            return
        if self.prepared and (self.rng.random() < 0.3 or len(self.prepared) > 2):
            self.complete_prepared(1)
        choice = self.rng.random()
        if self.connect is not None and choice < 0.1:
            self._session()
        elif choice < 0.55:
            self._dml()
        elif choice < 0.62:
            self._transaction()
        elif choice < 0.70:
            self._parent_change()
        else:
            self._schema_change()

    # -- row changes ------------------------------------------------------------------------

    def _value(self, column_type: str) -> str:
        n = self.rng.randrange(1, 10**9)
        for name, make in TYPES:
            if column_type.startswith(name.split("(")[0]):
                return make(n)
        if column_type.startswith(("SMALLINT", "MEDIUMINT")):
            return str(n % 30000)
        if column_type.startswith("FLOAT"):
            return f"{n % 1000 / 8}"
        if column_type.startswith(("CHAR", "VARCHAR")):
            width = int(re.findall(r"\d+", column_type)[0])
            return f"'{str(n)[:width]}'"
        return "NULL"

    def _writable(self, table: Table) -> list[str]:
        return [c for c in table.columns if c not in ("id", "pid", "row_start", "row_end")]

    def _insert(self, table: Table, rows: int | None = None) -> list[str]:
        columns = self._writable(table)
        values = []
        for _ in range(rows or self.rng.randint(1, 4)):
            key = self.next_id[table.name]
            self.next_id[table.name] += 1
            if table.kind == "partitioned":
                key = self.rng.choice((key % 1000, 1000 + key % 1000, 2000 + key))
            row = [str(key)]
            if table.kind == "child":
                row.append(str(self.rng.randint(1, self.next_id["p"])))
            row += [self._value(table.columns[c]) for c in columns]
            values.append(f"({', '.join(row)})")
        names = ["id", *(["pid"] if table.kind == "child" else []), *columns]
        return [f"INSERT INTO `{table.name}` ({', '.join(f'`{n}`' for n in names)}) VALUES "
                f"{', '.join(values)}"]

    def _update(self, table: Table) -> list[str]:
        columns = self._writable(table)
        if not columns:
            return self._delete(table)
        chosen = self.rng.sample(columns, self.rng.randint(1, min(2, len(columns))))
        sets = ", ".join(f"`{c}` = {self._value(table.columns[c])}" for c in chosen)
        return [f"UPDATE `{table.name}` SET {sets} WHERE {self._where(table)}"]

    def _delete(self, table: Table) -> list[str]:
        return [f"DELETE FROM `{table.name}` WHERE {self._where(table)}"]

    def _where(self, table: Table) -> str:
        top = max(self.next_id.get(table.name, 2), 2)
        if self.rng.random() < 0.5:
            return f"id = {self.rng.randrange(1, top)}"
        low = self.rng.randrange(1, top)
        return f"id BETWEEN {low} AND {low + self.rng.randint(0, 5)}"

    def _random_table(self, *kinds: str) -> Table | None:
        tables = [t for t in self.tables.values() if not kinds or t.kind in kinds]
        return self.rng.choice(tables) if tables else None

    def _dml(self) -> None:
        table = self._random_table()
        if table is None:
            return
        action = self.rng.choice((self._insert, self._insert, self._update, self._delete))
        self.execute(*action(table))

    def _transaction(self) -> None:
        statements = ["BEGIN"]
        for _ in range(self.rng.randint(2, 5)):
            table = self._random_table()
            if table is not None:
                statements += self.rng.choice((self._insert, self._update, self._delete))(table)
        self.execute(*statements, "COMMIT")

    def _parent_change(self) -> None:
        """A parent's rows deleted or re-keyed: its children follow by cascade or SET NULL."""
        parent = self._random_table("parent")
        if parent is None:
            return
        if self.rng.random() < 0.5:
            self.execute(*self._delete(parent))
        else:
            old = self.rng.randrange(1, max(self.next_id["p"], 2))
            new = self.next_id["p"] + 1000
            self.next_id["p"] += 1
            self.execute(f"UPDATE `{parent.name}` SET id = {new} WHERE id = {old}")
        self.execute(*self._insert(parent, rows=1))

    # -- schema changes ---------------------------------------------------------------------

    # -- what one application's session does ---------------------------------------------

    def _session(self) -> None:
        self.rng.choice((self._xa, self._xa, self._statement_logged, self._savepoint))()

    def _xa(self) -> None:
        """An XA transaction prepared on a connection that then goes away: it stays
        prepared (across kills of the service) until a later step commits or rolls it back."""
        table = self._random_table("generic", "parent", "child", "partitioned")
        assert self.connect is not None
        if table is None:
            return
        xid = f"'chaos{self.counter}', X'00ff', {self.counter % 7}"
        statements = [f"XA START {xid}", *self._insert(table), f"XA END {xid}",
                      f"XA PREPARE {xid}"]
        conn = self.connect()  # closed: an XA not prepared yet is rolled back with it
        try:
            with conn.cursor() as cur:
                for sql in statements:
                    cur.execute(sql)
        except pymysql.err.MySQLError as exc:
            self.log.append(Executed(" ; ".join(statements), str(exc.args[:2])))
            return
        finally:
            conn.close()
        self.log.append(Executed(" ; ".join(statements)))
        self.prepared.append(xid)

    def complete_prepared(self, count: int | None = None) -> None:
        """XA COMMIT (mostly) or XA ROLLBACK of the oldest prepared transactions."""
        while self.prepared and (count is None or count > 0):
            xid = self.prepared.pop(0)
            verb = "COMMIT" if self.rng.random() < 0.8 else "ROLLBACK"
            self._complete(f"XA {verb} {xid}")
            count = None if count is None else count - 1

    def _complete(self, sql: str) -> None:
        """The server detaches a prepared XA from its closed connection a moment after the
        close: until then the xid is unknown to other sessions (XAER_NOTA), so ask again."""
        for _ in range(100):
            try:
                with self.conn.cursor() as cur:
                    cur.execute(sql)
            except pymysql.err.MySQLError as exc:
                if exc.args[0] == XAER_NOTA:
                    time.sleep(0.05)
                    continue
                raise
            self.log.append(Executed(sql))
            return
        raise AssertionError(f"{sql}: the prepared transaction never became known")

    def _statement_logged(self) -> None:
        """A change a session logs as SQL text (binlog_format STATEMENT or MIXED)."""
        table = self._random_table()
        if table is None:
            return
        action = self.rng.choice((self._insert, self._update, self._delete))
        self.execute(f"SET SESSION binlog_format = '{self.rng.choice(('STATEMENT', 'MIXED'))}'")
        try:
            self.execute(*action(table))
        finally:
            self.execute("SET SESSION binlog_format = 'ROW'")

    def _savepoint(self) -> None:
        """A transaction rolled back to a savepoint after changing the MyISAM table."""
        table, myisam = self._random_table("generic", "parent"), self.tables.get("m")
        if table is None or myisam is None:
            return
        self.execute("BEGIN", *self._insert(table), "SAVEPOINT s", *self._update(table),
                     *self._insert(myisam), "ROLLBACK TO SAVEPOINT s", *self._insert(table),
                     "COMMIT")

    def _schema_change(self) -> None:
        self.complete_prepared()  # a prepared XA's metadata locks would hold the statement
        changes: list[Callable[[], list[tuple[str, ...]]]] = [
            self._add_column, self._add_column, self._drop_column, self._rename_column,
            self._change_column, self._modify_column, self._modify_column,
            self._swap_columns, self._rename_table, self._swap_tables, self._truncate,
            self._partitions, self._versioning]
        for statement in self.rng.choice(changes)():
            self.execute(*statement)
        self._renamed_names()  # tables a rename made: into the model
        for name in list(self.tables):
            self.refresh(name)

    def _renamed_names(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA "
                        "= %s", (self.database,))
            names = [str(r[0]) for r in cur.fetchall()]
        for name in names:
            if name not in self.tables and not name.startswith("_"):
                self.next_id.setdefault(name, 10000)
                base = name.split("_")[0]
                kind = self.tables[base].kind if base in self.tables else "generic"
                self.tables[name] = Table(name, {}, kind=kind)

    def _generic(self) -> Table | None:
        return self._random_table("generic")

    def _column(self, table: Table) -> str | None:
        columns = self._writable(table)
        return self.rng.choice(columns) if columns else None

    def _add_column(self) -> list[tuple[str, ...]]:
        table = self._generic()
        if table is None:
            return []
        type_name, make = self.rng.choice(TYPES)
        name = f"c{self.counter}"
        spec = f"`{name}` {type_name}"
        roll = self.rng.random()
        if roll < 0.35:
            spec += f" NOT NULL DEFAULT {make(self.counter)}" if type_name != "TEXT" else \
                " NULL"
        elif roll < 0.5 and type_name != "TEXT":
            spec += " NOT NULL"
        elif roll < 0.7 and type_name != "TEXT":
            spec += f" DEFAULT {make(self.counter)}"
        place = self.rng.random()
        other = self._column(table)
        if place < 0.15:
            spec += " FIRST"
        elif place < 0.35 and other is not None:
            spec += f" AFTER `{other}`"
        instant = ", ALGORITHM=INSTANT" if self.rng.random() < 0.3 else ""
        return [(f"ALTER TABLE `{table.name}` ADD COLUMN {spec}{instant}",)]

    def _drop_column(self) -> list[tuple[str, ...]]:
        table = self._generic()
        column = self._column(table) if table else None
        if table is None or column is None or len(self._writable(table)) < 2:
            return []
        instant = ", ALGORITHM=INSTANT" if self.rng.random() < 0.3 else ""
        return [(f"ALTER TABLE `{table.name}` DROP COLUMN `{column}`{instant}",)]

    def _rename_column(self) -> list[tuple[str, ...]]:
        table = self._generic()
        column = self._column(table) if table else None
        if table is None or column is None:
            return []
        return [(f"ALTER TABLE `{table.name}` RENAME COLUMN `{column}` TO "
                 f"`{column.split('_')[0]}_{self.counter}`",)]

    def _change_column(self) -> list[tuple[str, ...]]:
        table = self._generic()
        column = self._column(table) if table else None
        if table is None or column is None:
            return []
        current = table.columns[column]
        new_type = WIDER.get(current, NARROWER.get(current, current))
        return [(f"ALTER TABLE `{table.name}` CHANGE `{column}` `{column.split('_')[0]}_"
                 f"{self.counter}` {new_type}",)]

    def _modify_column(self) -> list[tuple[str, ...]]:
        table = self._generic()
        column = self._column(table) if table else None
        if table is None or column is None:
            return []
        current = table.columns[column]
        table_of = NARROWER if self.rng.random() < 0.6 else WIDER
        new_type = table_of.get(current) or WIDER.get(current) or NARROWER.get(current)
        if new_type is None:
            return []
        null = " NOT NULL" if self.rng.random() < 0.15 else ""
        return [(f"ALTER TABLE `{table.name}` MODIFY `{column}` {new_type}{null}",)]

    def _swap_columns(self) -> list[tuple[str, ...]]:
        table = self._generic()
        if table is None or len(self._writable(table)) < 2:
            return []
        x, y = self.rng.sample(self._writable(table), 2)
        return [(f"ALTER TABLE `{table.name}` CHANGE `{x}` `{y}` {table.columns[x]}, "
                 f"CHANGE `{y}` `{x}` {table.columns[y]}",)]

    def _rename_table(self) -> list[tuple[str, ...]]:
        table = self._generic()
        if table is None:
            return []
        base = table.name.split("_")[0]
        new = f"{base}_{self.counter}" if self.rng.random() < 0.7 else base
        if new == table.name or new in self.tables:
            return []
        self.next_id[new] = self.next_id[table.name]
        return [(f"RENAME TABLE `{table.name}` TO `{new}`",)]

    def _swap_tables(self) -> list[tuple[str, ...]]:
        generic = [t for t in self.tables.values() if t.kind == "generic"]
        if len(generic) < 2:
            return []
        x, y = self.rng.sample(generic, 2)
        tmp = f"tmp_{self.counter}"
        ids = max(self.next_id[x.name], self.next_id[y.name])
        self.next_id[x.name] = self.next_id[y.name] = ids
        return [(f"RENAME TABLE `{x.name}` TO `{tmp}`, `{y.name}` TO `{x.name}`, "
                 f"`{tmp}` TO `{y.name}`",)]

    def _truncate(self) -> list[tuple[str, ...]]:
        table = self._random_table("generic", "partitioned")
        return [(f"TRUNCATE TABLE `{table.name}`",)] if table else []

    def _partitions(self) -> list[tuple[str, ...]]:
        table = self._random_table("partitioned")
        if table is None:
            return []
        choice = self.rng.random()
        if choice < 0.5:
            return [(f"ALTER TABLE `{table.name}` TRUNCATE PARTITION "
                     f"p{self.rng.randint(0, 1)}",)]
        return [(f"ALTER TABLE `{table.name}` REORGANIZE PARTITION p0, p1 INTO (PARTITION p0 "
                 "VALUES LESS THAN (1000), PARTITION p1 VALUES LESS THAN (2000))",)]

    def _versioning(self) -> list[tuple[str, ...]]:
        table = self._generic()
        if table is None:
            return []
        action = "DROP" if table.versioned else "ADD"
        return [(f"ALTER TABLE `{table.name}` {action} SYSTEM VERSIONING",)]


# -- the differential check -----------------------------------------------------------------

@dataclass
class Outcome:
    seed: int
    statements: int = 0
    refused: int = 0  # statements the source refused (as an application would see)
    kills: int = 0
    exits: list[str] = field(default_factory=list)  # the service ended by itself
    quarantines: int = 0
    resyncs: list[float] = field(default_factory=list)  # seconds each took
    differences: dict[str, str] = field(default_factory=dict)  # table -> what differs
    log: list[Executed] = field(default_factory=list)
    # records a consumer auditing before-images finds untrue (tests/oracle.py, Rebuilt):
    # issue 50, item 3: a stream is exact only with none
    inconsistencies: Counter[str] = field(default_factory=Counter)
    inconsistency_examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.exits and not self.differences and not self.inconsistencies

    def report(self) -> str:
        lines = [f"seed {self.seed}: {self.statements} statements ({self.refused} refused by "
                 f"the source), {self.kills} kills, {len(self.exits)} exits, "
                 f"{self.quarantines} quarantines, {len(self.differences)} tables differ"]
        lines += [f"  stream inconsistencies: {dict(self.inconsistencies)}"] \
            if self.inconsistencies else []
        lines += [f"    e.g. {e}" for e in self.inconsistency_examples[:5]]
        lines += [f"  exit: {e}" for e in self.exits]
        lines += [f"  {t}: {d}" for t, d in self.differences.items()]
        return "\n".join(lines)

    def statement_list(self) -> str:
        return "\n".join(f"{e.sql};" + (f"  -- refused: {e.error}" if e.error else "")
                         for e in self.log)


class Service:
    """``cdcserver run`` as a process of its own: killed with -9, started again."""

    LISTENING = re.compile(r"cdcserver\.protocol\.server: listening on [\d.]+:(\d+)")
    MONITORING = re.compile(r"metrics and health on http://[\d.]+:(\d+)/metrics")

    def __init__(self, args: list[str], log_path: str, env: dict[str, str] | None = None
                 ) -> None:
        self.args = args
        self.log_path = log_path
        self.env = env  # (None: this process's)
        self.process: subprocess.Popen[bytes] | None = None
        self.port = self.metrics_port = 0
        self._offset = 0  # where the log of the latest start begins
        self._first: int | None = None  # where this run's log begins (the file is shared)

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self._offset = log.tell()
            if self._first is None:
                self._first = self._offset
            # (killed with this process, however it ends: a test killed at its timeout
            # leaves no service behind; start it from a thread that lasts, as run() does)
            self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log,
                                            preexec_fn=die_with_parent, env=self.env)

    def text(self, since_start: bool = True) -> str:
        """The log since the latest start, or (``since_start`` False) since the first."""
        with open(self.log_path, "rb") as f:
            f.seek(self._offset if since_start else self._first or 0)
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            listening, monitoring = self.LISTENING.search(text), self.MONITORING.search(text)
            if listening and monitoring:
                self.port, self.metrics_port = int(listening[1]), int(monitoring[1])
                return
            if self.exited() is not None:
                return
            time.sleep(0.05)
        raise TimeoutError("the service did not start listening")

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def peak_rss_mib(self) -> float:
        """The running process's peak resident memory (VmHWM) so far, in MiB (0: none)."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        return memory_mib(self.process.pid, "VmHWM")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health",
                                        timeout=10) as answer:
                data: dict[str, Any] = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            data = json.loads(error.read())
        return data


def service_args(source_url: str, data_dir: str, users_file: str, server_id: int) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    return [exe, "run", "--source", source_url, "--data-dir", data_dir, "--listen",
            "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--users-file", users_file,
            "--server-id", str(server_id), "--flush-interval", "0.05", "--start-gtid",
            "oldest", "--log-level", "info"]


def settled(service: Service, conn: Any, timeout: float) -> bool:
    """Until the service has applied everything the source logged, quarantines no table and
    has no repair out: a resync, and a repair read beside the stream, complete with
    transactions after their watermark, so the source gets one (on a table the generator
    does not touch) every half second meanwhile. False after ``timeout`` seconds in which
    the service, behind the source, applied nothing new, or caught up but did not settle: a
    service that is slow (a long backlog after the last kill, on a machine other soaks
    load) but moving is waited for."""
    deadline = time.monotonic() + timeout
    applied = None
    while time.monotonic() < deadline:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO _tick VALUES ()")
        if caught_up(service, conn, 0.5):
            health = service.health()
            if not health.get("quarantined") and \
                    not health.get("replication", {}).get("repair_pending"):
                return caught_up(service, conn, 30)
            continue  # caught up: what is left (a repair, a resync) has the time left
        now = _applied(service)
        if now != applied:  # behind, but moving
            applied, deadline = now, time.monotonic() + timeout
    return False


def _applied(service: Service) -> str:
    """The GTID state the service's /health says it applied ('' while it cannot say)."""
    try:
        return str(service.health().get("replication", {}).get("applied", ""))
    except (OSError, ValueError):
        return ""


def caught_up(service: Service, conn: Any, timeout: float) -> bool:
    """Until the service's /health says it applied everything the source logged."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        target = str(cur.fetchone()[0] or "")
    wanted = {item.rsplit("-", 1)[0]: int(item.rsplit("-", 1)[1])
              for item in target.split(",") if item}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.exited() is not None:
            return False
        state = _applied(service)
        have = {item.rsplit("-", 1)[0]: int(item.rsplit("-", 1)[1])
                for item in state.split(",") if item}
        if all(have.get(k, -1) >= v for k, v in wanted.items()):
            return True
        time.sleep(0.1)
    return False


async def differences(port: int, conn: Any, database: str, user: str, password: str,
                      audit: Outcome | None = None) -> dict[str, str]:
    """Each table of ``database`` rebuilt from its raw JSON stream against ``SELECT``;
    with ``audit``, the stream's inconsistencies counted into it too."""
    if audit is not None:  # filled here, once: a run's own figure, not added to others'
        audit.inconsistencies.clear()
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE "
                    "TABLE_SCHEMA = %s", (database,))
        tables = [(str(n), str(t)) for n, t in cur.fetchall()]
        cur.execute("SELECT @@gtid_binlog_pos")  # every read bounded by what it has logged
        (logged,) = cur.fetchone()
    found = {}
    streams: dict[str, list[dict[str, Any]]] = {}  # every table's, once
    for table, kind in sorted(tables):
        versioned = kind == "SYSTEM VERSIONED"
        types = column_types(conn, database, table)
        key = primary_key(conn, database, table)
        if versioned:
            types.update(IMPLICIT)
            key = (*key, "row_end")
        try:
            lines, others = await read_renamed(port, database, table, user=user,
                                               password=password, cache=streams,
                                               until=str(logged) or None)
        except AssertionError as exc:
            found[table] = f"no stream: {exc}"
            continue
        rebuilt = rebuild(lines, key, others)
        if audit is not None:
            audit.inconsistencies.update(rebuilt.inconsistencies)
            audit.inconsistency_examples += [f"{table}: {e}" for e in rebuilt.examples]
        source = f"`{database}`.`{table}`" + (" FOR SYSTEM_TIME ALL" if versioned else "")
        rows = await asyncio.to_thread(source_rows, conn, database, table, types,
                                       from_clause=source)
        comparison: Comparison = compare(rebuilt, rows, types,
                                         null_by_default(conn, database, table))
        if not comparison.equal:
            found[table] = str(comparison)
    return found


async def run(source_url: str, connect: Callable[[], Any], database: str, data_dir: str,
              users_file: str, user: str, password: str, *, seed: int, statements: int,
              kill_every: int = 60, server_id: int = 6501,
              log_path: str | None = None, sessions: bool = False) -> Outcome:
    """The whole check: setup, ``statements`` random statements with a kill -9 about every
    ``kill_every`` (0: none), then every table against ``SELECT``."""
    outcome = Outcome(seed)
    service = Service(service_args(source_url, data_dir, users_file, server_id),
                      log_path or os.path.join(data_dir + ".log"))
    conn = connect()
    chance = random.Random(seed ^ 0x5EED)
    try:
        migrations = Migrations(conn, database, seed, connect if sessions else None)
        await asyncio.to_thread(migrations.setup)
        service.start()
        await asyncio.to_thread(service.wait_ready)
        next_kill = chance.randint(kill_every // 2, kill_every * 3 // 2) if kill_every else -1
        for n in range(statements):
            await asyncio.to_thread(migrations.step)
            if n == next_kill:
                if service.exited() is None:
                    service.kill()
                    outcome.kills += 1
                else:
                    outcome.exits.append(service.text()[-2000:])
                service.start()
                await asyncio.to_thread(service.wait_ready)
                next_kill = n + chance.randint(kill_every // 2, kill_every * 3 // 2)
            elif service.exited() is not None:
                outcome.exits.append(service.text()[-2000:])
                service.start()
                await asyncio.to_thread(service.wait_ready)
        await asyncio.to_thread(migrations.complete_prepared)
        outcome.statements = statements
        outcome.log = migrations.log
        outcome.refused = sum(1 for e in migrations.log if e.error)
        if not await asyncio.to_thread(settled, service, conn, 180):
            outcome.exits.append("did not catch up and resync every table: " +
                                 json.dumps(service.health().get("problems")) +
                                 service.text()[-2000:])
        else:
            outcome.differences = await differences(service.port, conn, database, user,
                                                    password, outcome)
        text = service.text(since_start=False)
        outcome.quarantines = text.count(" quarantined: ")
        outcome.resyncs = [float(s) for s in re.findall(r"resynced in ([\d.]+) s", text)]
        code = service.stop()
        if code != 0:
            outcome.exits.append(f"exit code {code} at the end: {service.text()[-2000:]}")
    finally:
        if service.exited() is None:
            service.kill()
        conn.close()
    return outcome
