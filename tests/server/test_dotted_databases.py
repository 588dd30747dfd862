"""Names with dots in the database's name too, through renames, cascades and repairs."""

from __future__ import annotations

import pytest

from mariadb_cdc_client.format.names import table_ref
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb


async def _exact(cdc: RunningService, source: Source, *tables: tuple[str, str]) -> None:
    """Each (database, table) rebuilt from its stream (following renames) is as on the
    source."""
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        for database, table in tables:
            await assert_stream_equals_table(cdc.port, conn, database, table, user=USER,
                                             password=PASSWORD, quiet=0.5)
    finally:
        conn.close()


async def test_a_rename_in_a_dotted_database_beside_its_lookalike(cdc: RunningService,
                                                                    source: Source):
    dotted = f"{source.database}.v1"
    a, b = table_ref(dotted, "t"), table_ref(source.database, "v1.t")
    source.execute(f"CREATE DATABASE `{dotted}`",
                   f"CREATE TABLE {a} (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE {b} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {a} VALUES (1, 1), (2, 2)",
                   f"INSERT INTO {b} VALUES (7, 7)",
                   f"RENAME TABLE {a} TO {table_ref(dotted, 'u')}",
                   f"INSERT INTO {table_ref(dotted, 'u')} VALUES (3, 3)",
                   f"UPDATE {table_ref(dotted, 'u')} SET v = v + 10",
                   f"UPDATE {b} SET v = 8")
    await _exact(cdc, source, (dotted, "u"), (source.database, "v1.t"))


async def test_cascades_two_levels_down_in_a_dotted_database_beside_lookalikes(
        cdc: RunningService, source: Source):
    """A delete in ``g`` cascades to ``p`` (repaired) and from there to ``c`` (the repair's
    own cascade, followed by the foreign key's name): both are the dotted database's, not
    the tables of the other database whose names look the same written with dots."""
    dotted = f"{source.database}.v1"

    def ref(table: str) -> str:
        return table_ref(dotted, table)

    lookalikes = [table_ref(source.database, f"v1.{t}") for t in ("g", "p", "c")]
    source.execute(
        f"CREATE DATABASE `{dotted}`",
        f"CREATE TABLE {ref('g')} (id INT PRIMARY KEY)",
        f"CREATE TABLE {ref('p')} (id INT PRIMARY KEY, gid INT, FOREIGN KEY (gid) "
        f"REFERENCES {ref('g')} (id) ON DELETE CASCADE)",
        f"CREATE TABLE {ref('c')} (id INT PRIMARY KEY, pid INT, FOREIGN KEY (pid) "
        f"REFERENCES {ref('p')} (id) ON DELETE CASCADE)",
        *(f"CREATE TABLE {t} (id INT PRIMARY KEY, pid INT)" for t in lookalikes),
        f"INSERT INTO {ref('g')} VALUES (1), (2)",
        f"INSERT INTO {ref('p')} VALUES (10, 1), (11, 1), (20, 2)",
        f"INSERT INTO {ref('c')} VALUES (100, 10), (101, 11), (200, 20)",
        *(f"INSERT INTO {t} VALUES (10, 1), (100, 10), (101, 11)" for t in lookalikes),
        f"DELETE FROM {ref('g')} WHERE id = 1")
    await _exact(cdc, source, (dotted, "g"), (dotted, "p"), (dotted, "c"),
                 *((source.database, f"v1.{t}") for t in ("g", "p", "c")))
    assert [r for r in source.server.query(f"SELECT id FROM {ref('c')}")] == [(200,)]
