"""Golden DDL sequences against a real MariaDB, in both formats.

A script of schema changes mixed with row changes runs on the source; for each table the test
collects its versions (the schema's columns and the ``ddl`` key that says why the version
exists) and its records, and compares them with ``tests/golden/ddl.json`` (regenerate with
``UPDATE_GOLDEN=1`` and review the diff). Both formats must give the same versions and values,
the surviving tables must verify against the source, and the schema history must agree with
the source's own definitions at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from cdcserver.schema import ddl
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.layouts import agrees
from mariadb_cdc_client import ChangeRecord, SchemaChange, SyncCdcClient
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER

pytestmark = pytest.mark.mariadb

GOLDEN = Path(__file__).parent.parent / "golden" / "ddl.json"

SCRIPT = [
    "CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10))",
    "INSERT INTO t VALUES (1, 'x')",
    "ALTER TABLE t ADD COLUMN b INT FIRST",                         # v2: b, id, a
    "INSERT INTO t VALUES (20, 2, 'y')",
    "ALTER TABLE t DROP COLUMN b",                                  # v3
    "ALTER TABLE t MODIFY a VARCHAR(20) NOT NULL",                  # v4: same Avro type
    "ALTER TABLE t CHANGE a c VARCHAR(20) NOT NULL AFTER id",       # v5: renamed column
    "ALTER TABLE t ADD INDEX ic (c)",                               # no version
    "UPDATE t SET c = 'z' WHERE id = 1",
    "ALTER TABLE t ADD COLUMN (d DECIMAL(8,3), e ENUM('p','q'))",   # v6
    "INSERT INTO t VALUES (3, 'w', 1.5, 'q')",
    "RENAME TABLE t TO t2",                                         # t v7 (dropped), t2 v1
    "INSERT INTO t2 VALUES (4, 'v', NULL, 'p')",
    "CREATE TABLE t3 LIKE t2",
    "INSERT INTO t3 SELECT * FROM t2",
    "CREATE TABLE t4 AS SELECT id, c FROM t2",
    "TRUNCATE TABLE t2",                                            # t2 v2
    "INSERT INTO t2 VALUES (5, 'u', 2.25, NULL)",
    "DROP TABLE t3",                                                # t3 v2 (dropped)
    "CREATE TABLE t3 (x INT PRIMARY KEY, y TEXT)",                  # t3 v3
    "INSERT INTO t3 VALUES (1, 'again')",
    "ALTER TABLE t4 ENGINE=InnoDB",                                 # no version
    "ALTER TABLE t4 ADD COLUMN ip INET6, ADD COLUMN u UUID, ADD PRIMARY KEY (id)",
    "INSERT INTO t4 VALUES (9, 'i', '2001:db8::9', 'e2af8e16-55b0-11ee-9ddd-0242ac120002')",
    "ALTER TABLE t4 RENAME TO t5, ADD COLUMN n INT",                # t4 v3 (dropped), t5 v1
    "INSERT INTO t5 VALUES (10, 'j', NULL, NULL, 7)",
    "DELETE FROM t5 WHERE id = 9",
]
TABLES = ["t", "t2", "t3", "t4", "t5"]
SURVIVORS = ["t2", "t3", "t5"]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal | uuid.UUID | dt.date | dt.datetime | dt.timedelta):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def _history(port: int, name: str, fmt: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, format=fmt) as client:
        for event in client.stream(name, idle_timeout=1):
            if isinstance(event, SchemaChange):
                about = event.schema.get("ddl") or {}
                out.append({"version": event.version, "ddl": about.get("kind"),
                            "note": about.get("note"),
                            "columns": [f"{c.column} {c.real_type}" for c in event.columns],
                            "primary_key": event.schema.get("primary_key"), "records": []})
            elif isinstance(event, ChangeRecord):
                out[-1]["records"].append(
                    [event.event_type, {k: _plain(v) for k, v in event.values.items()}])
    return out


async def test_ddl_sequence_versions_and_records(cdc: RunningService, source: Source):
    conn = source.server.connect(source.database)
    with conn.cursor() as cur:
        for statement in SCRIPT:
            cur.execute(statement)
    conn.close()
    await cdc.caught_up(source)

    actual = {}
    for table in TABLES:
        name = f"{source.database}.{table}"
        json_mode = await asyncio.to_thread(_history, cdc.port, name, "JSON")
        avro_mode = await asyncio.to_thread(_history, cdc.port, name, "AVRO")
        assert json_mode == avro_mode, table
        actual[table] = json_mode
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(actual, indent=1, ensure_ascii=False) + "\n")
    assert actual == json.loads(GOLDEN.read_text())

    for table in SURVIVORS:
        report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                         cdc.service.config.store.data_dir,
                                         TableName(source.database, table))
        assert report.ok, "\n".join(report.lines())

    history = SchemaHistory(os.path.join(cdc.service.config.store.data_dir, "state",
                                         "schema_history.jsonl"))
    from cdcserver.core.gtid import GtidState

    history.load(GtidState.parse(str(source.gtid_state())))
    for table in SURVIVORS:
        create = source.query(f"SHOW CREATE TABLE `{source.database}`.`{table}`")[0][1]
        statement = ddl.parse(str(create), source.database)
        assert isinstance(statement, ddl.CreateTable) and statement.definition is not None
        ours = history.tables[TableName(source.database, table)]
        from cdcserver.schema.layouts import layout_of

        assert agrees(layout_of(statement.table, statement.definition), ours), table
        assert [c.name for c in ours.columns] == [c.name for c in statement.definition.columns]
    assert TableName(source.database, "t") not in history.tables


@pytest.mark.parametrize("statement", [
    "ALTER TABLE pt REORGANIZE PARTITION p0, p1 INTO (PARTITION p0 VALUES LESS THAN (1000),"
    " PARTITION p1 VALUES LESS THAN (2000))",
    "ALTER TABLE pt ANALYZE PARTITION p0, p1",
    "ALTER TABLE pt CHECK PARTITION p1, p2",
    "ALTER TABLE pt OPTIMIZE PARTITION ALL",
    "ALTER TABLE pt REBUILD PARTITION p0, p1",
    "ALTER TABLE pt REPAIR PARTITION p0, p1",
    "ALTER TABLE pt COALESCE PARTITION 2",
])
def test_partition_maintenance_is_understood(statement: str):
    """Partition lists have commas: they are not further actions the history cannot read
    (which would forget the table's columns until it is read again)."""
    parsed = ddl.parse(statement, "db")
    assert isinstance(parsed, ddl.AlterTable)
    assert parsed.actions == ()
