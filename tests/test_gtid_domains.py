"""GTID domains with ``gtid_strict_mode=OFF`` (MariaDB's default): sequence numbers that go back
(``SET gtid_seq_no``), interleaved server_ids and several domains, across restarts.

MariaDB numbers transactions per domain but, without strict mode, does not require the numbers
to grow: a session may set a lower ``gtid_seq_no``, and servers that share a domain each count
on their own. Every transaction is still a transaction of the table, so each must reach the
stream exactly once, whatever its number, and a restart must resume exactly where the service
stopped. Checked by rebuilding each table from its JSON stream (``tests/oracle.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb


@pytest.fixture
def lax_source(source: Source) -> Iterator[Source]:
    """The test's source with gtid_strict_mode=OFF, as MariaDB ships it."""
    source.execute("SET GLOBAL gtid_strict_mode = OFF")
    try:
        yield source
    finally:
        source.execute("SET GLOBAL gtid_strict_mode = ON")


RECORDS = {"INSERT": 1, "UPDATE": 2, "DELETE": 1}  # each statement here changes one row
written: list[int] = []  # the records the test's statements make, in all


def _write(source: Source, *statements: str, seq_no: int | None = None,
           server_id: int | None = None, domain: int | None = None) -> None:
    """One transaction per statement, numbered as asked (a number may repeat one the
    binlog already has: MariaDB allows that too without strict mode)."""
    conn = source.server.connect(source.database)
    try:
        with conn.cursor() as cur:
            if server_id is not None:
                cur.execute(f"SET SESSION server_id = {server_id}")
            if domain is not None:
                cur.execute(f"SET SESSION gtid_domain_id = {domain}")
            for statement in statements:
                if seq_no is not None:
                    cur.execute(f"SET SESSION gtid_seq_no = {seq_no}")
                    seq_no += 1
                cur.execute(statement)
                written.append(RECORDS[statement.split()[0]])
    finally:
        conn.close()


async def _assert_equal(running: RunningService, source: Source, table: str) -> None:
    await running.caught_up(source)
    conn = source.server.connect()
    try:
        rebuilt = await assert_stream_equals_table(running.port, conn, source.database, table,
                                                   user=USER, password=PASSWORD)
    finally:
        conn.close()
    assert len(rebuilt.records) == sum(written), "records lost or stored twice"


async def test_lower_and_interleaved_sequence_numbers_survive_restarts(
        tmp_path: os.PathLike[str], lax_source: Source, users_file: str):
    source = lax_source
    written.clear()
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    _write(source, *(f"INSERT INTO t VALUES ({i}, 'first')" for i in range(1, 21)))
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file)
    running = await start_service(config)
    await _assert_equal(running, source, "t")
    await running.stop()

    # While the service is down: a number lower than the last, another server_id in the
    # same domain counting on its own, and a second domain.
    _write(source, "INSERT INTO t VALUES (101, 'low')", "UPDATE t SET v = 'low' WHERE id = 1",
           seq_no=3)
    _write(source, "INSERT INTO t VALUES (102, 'other server')", server_id=2, seq_no=5)
    _write(source, "INSERT INTO t VALUES (103, 'domain 1')", domain=1)
    running = await start_service(config)
    await _assert_equal(running, source, "t")

    # While it runs, after the restart: the same, numbers below the checkpoint's.
    _write(source, "DELETE FROM t WHERE id = 2", "INSERT INTO t VALUES (104, 'low again')",
           seq_no=7)
    _write(source, "UPDATE t SET v = 'interleaved' WHERE id = 3", server_id=2, seq_no=9)
    _write(source, "INSERT INTO t VALUES (105, 'back to 1')")
    _write(source, "INSERT INTO t VALUES (106, 'server 3')", server_id=3, seq_no=2)
    await _assert_equal(running, source, "t")
    await running.stop()

    # And once more from the checkpoint those left: nothing lost, nothing twice.
    _write(source, "INSERT INTO t VALUES (107, 'after all that')", seq_no=4)
    running = await start_service(config)
    try:
        await _assert_equal(running, source, "t")
    finally:
        await running.stop()
