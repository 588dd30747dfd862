"""``cdcserver verify`` agrees with an independent rebuild of the table from its stream
(``tests/oracle.py``) where it used to cry wolf: after a DECIMAL widening, a primary-key
change, repeated RENAME swaps, column-name swaps, duplicate rows in a table without a key,
and on an idle source whose binlog rotated. It still reports a real difference."""

from __future__ import annotations

import asyncio
import time

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from tests.conftest import RunningService, Source
from tests.server.test_rowless import _equal, _run, _verified

pytestmark = pytest.mark.mariadb

CASES = (
    ("wide", ("CREATE TABLE wide (id INT PRIMARY KEY, d DECIMAL(5,2))",
              "INSERT INTO wide VALUES (1, 1.25), (2, -999.99), (3, NULL)",
              "ALTER TABLE wide MODIFY d DECIMAL(10,4)",
              "INSERT INTO wide VALUES (4, 123456.7891)", "UPDATE wide SET d = 0.5 WHERE id = 2")),
    ("rekey", ("CREATE TABLE rekey (id INT PRIMARY KEY, code VARCHAR(10) NOT NULL, v INT)",
               "INSERT INTO rekey VALUES (1, 'a', 1), (2, 'b', 2)",
               "ALTER TABLE rekey DROP PRIMARY KEY, ADD PRIMARY KEY (code)",
               "UPDATE rekey SET v = 20 WHERE code = 'b'", "INSERT INTO rekey VALUES (1, 'c', 3)")),
    ("swap_a", ("CREATE TABLE swap_a (id INT PRIMARY KEY, v VARCHAR(10))",
                "CREATE TABLE swap_b (id INT PRIMARY KEY, w INT)",
                "INSERT INTO swap_a VALUES (1, 'a')", "INSERT INTO swap_b VALUES (1, 100)",
                *(s for i in range(3) for s in (
                    "RENAME TABLE swap_a TO swap_tmp, swap_b TO swap_a, swap_tmp TO swap_b",
                    f"INSERT INTO swap_a VALUES ({10 + i}, " + (
                        f"{i})" if i % 2 == 0 else f"'x{i}')"),
                    f"INSERT INTO swap_b VALUES ({20 + i}, " + (
                        f"'y{i}')" if i % 2 == 0 else f"{i})"))))),
    ("cols", ("CREATE TABLE cols (id INT PRIMARY KEY, x INT, y VARCHAR(10))",
              "INSERT INTO cols VALUES (1, 1, 'one'), (2, 2, 'two')",
              "ALTER TABLE cols CHANGE x tmp INT", "ALTER TABLE cols CHANGE y x VARCHAR(10)",
              "ALTER TABLE cols CHANGE tmp y INT",  # x and y swapped names
              "UPDATE cols SET y = 20 WHERE id = 2", "INSERT INTO cols VALUES (3, 3, 'three')",
              "ALTER TABLE cols RENAME COLUMN x TO z, RENAME COLUMN y TO x",
              # every row written again: the stream holds each under the new names
              "UPDATE cols SET z = CONCAT(z, '!')")),
    ("nokey", ("CREATE TABLE nokey (a INT, b VARCHAR(5))",
               "INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, 'y'), (2, 'y')",
               "DELETE FROM nokey WHERE a = 1 LIMIT 1",
               "UPDATE nokey SET b = 'z' WHERE a = 2 LIMIT 1")),
)


async def test_verify_agrees_with_the_oracle(cdc: RunningService, source: Source):
    for _, statements in CASES:
        _run(source, *statements)
    for table in ("wide", "rekey", "swap_a", "swap_b", "cols", "nokey"):
        await _equal(cdc, source, table)
        await _verified(cdc, source, table)

    # an idle source whose binlog rotated: verify finishes at once, not at its timeout (a
    # long one, so that a loaded machine's "at once" stays far from it)
    source.execute("FLUSH BINARY LOGS")
    started = time.monotonic()
    report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                     cdc.service.config.store.data_dir,
                                     TableName(source.database, "wide"), 120.0)
    assert report.ok and time.monotonic() - started < 60, "\n".join(report.lines())

    # and a real difference is still one: rows changed where the binlog does not see them
    _run(source, "UPDATE wide SET d = 7 WHERE id = 1", "DELETE FROM nokey WHERE a = 2 LIMIT 1",
         session=("SET SESSION sql_log_bin = 0",))
    _run(source, "INSERT INTO rekey VALUES (9, 'z', 9)")  # something to catch up to
    await cdc.caught_up(source)
    for table in ("wide", "nokey"):
        report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                         cdc.service.config.store.data_dir,
                                         TableName(source.database, table))
        assert not report.ok and (report.different or report.missing or report.extra), \
            "\n".join(report.lines())
