"""GTID domains with ``gtid_strict_mode=OFF`` (MariaDB's default): sequence numbers that go back
(``SET gtid_seq_no``), interleaved server_ids and several domains, across restarts.

MariaDB numbers transactions per domain but, without strict mode, does not require the numbers
to grow: a session may set a lower ``gtid_seq_no``, and servers that share a domain each count
on their own. Every transaction is still a transaction of the table, so each must reach the
stream exactly once, whatever its number, and a restart must resume exactly where the service
stopped. Checked by rebuilding each table from its JSON stream (``tests/oracle.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import pytest

from mariadb_cdc_client.resume import Resume
from mariadb_cdc_client.stream import ChangeRecord
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table, auth_message, read_stream

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


def _txn(record: dict) -> tuple[int, int, int]:
    return record["domain"], record["server_id"], record["sequence"]


async def _ask(port: int, line: str) -> list[dict]:
    lines = await read_stream(port, "", user=USER, password=PASSWORD, request=line, quiet=2.0)
    return [r for r in lines if "event_type" in r or "end" in r]


async def test_positions_in_a_domain_whose_numbers_went_down(tmp_path: os.PathLike[str],
                                                             lax_source: Source,
                                                             users_file: str):
    """AFTER, the inclusive seek and UNTIL name transactions by GTID; where the numbers did
    not grow they must still mean "after this transaction in the stream", and QUERY-
    TRANSACTION must find every transaction, also after a restart."""
    source = lax_source
    written.clear()
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    _write(source, *(f"INSERT INTO t VALUES ({i}, 'a')" for i in range(1, 6)))
    _write(source, "INSERT INTO t VALUES (10, 'low')", "UPDATE t SET v = 'b' WHERE id = 1",
           seq_no=40)
    _write(source, "INSERT INTO t VALUES (11, 'lower')", seq_no=30)
    _write(source, "INSERT INTO t VALUES (12, 'server 2')", server_id=2, seq_no=35)
    _write(source, "INSERT INTO t VALUES (13, 'domain 1')", domain=1)
    _write(source, "DELETE FROM t WHERE id = 2", "INSERT INTO t VALUES (14, 'next')")
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file)
    for restart in (False, True):
        running = await start_service(config)
        try:
            await _assert_equal(running, source, "t")
            stream = [r for r in (await _ask(running.port, f"REQUEST-DATA {db}.t"))
                      if "event_type" in r]
            transactions = list(dict.fromkeys(_txn(r) for r in stream))
            end = source.gtid_state()
            for n, txn in enumerate(transactions):
                state: dict[int, tuple[int, int, int]] = {}
                for earlier in transactions[: n + 1]:
                    state[earlier[0]] = earlier
                after = ",".join(f"{d}-{s}-{q}" for d, s, q in state.values())
                expected = [r for r in stream if _txn(r) in transactions[n + 1:]]
                got = await _ask(running.port, f"REQUEST-DATA {db}.t AFTER {after} UNTIL {end}")
                assert got[-1]["end"] == str(end)
                assert got[:-1] == expected, f"AFTER {after} (restart: {restart})"
                seek = "-".join(map(str, txn))
                got = await _ask(running.port, f"REQUEST-DATA {db}.t {seek} UNTIL {end}")
                first = next(i for i, r in enumerate(stream) if _txn(r) == txn)
                assert got[:-1] == stream[first:], f"seek {seek} (restart: {restart})"
                got = await _ask(running.port, f"REQUEST-DATA {db}.t UNTIL {after}")
                assert got[:-1] == [r for r in stream if _txn(r) in transactions[: n + 1]], \
                    f"UNTIL {after} (restart: {restart})"
                reply = await _ask_line(running.port, f"QUERY-TRANSACTION {seek}")
                assert reply["GTID"] == seek and f"{db}.t" in reply["tables"]
        finally:
            await running.stop()


async def _ask_line(port: int, line: str) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(auth_message(USER, PASSWORD))
        assert await reader.readline() == b"OK\n"
        writer.write(b"REGISTER UUID=oracle, TYPE=JSON\n")
        assert await reader.readline() == b"OK\n"
        writer.write(line.encode() + b"\n")
        reply = await asyncio.wait_for(reader.readline(), 10)
        return json.loads(reply)
    finally:
        writer.close()


def _record(domain: int, server_id: int, sequence: int, event: int) -> ChangeRecord:
    return ChangeRecord("d", "t", 1, domain, server_id, sequence, event, 0, "insert", {})


def test_a_client_resumes_after_a_dump_by_transaction_not_by_number():
    resume = Resume(after="0-1-40")
    for record in ((0, 1, 41, 1), (0, 1, 30, 1), (0, 1, 30, 2)):
        assert resume.accept(_record(*record))
    # The connection dropped inside 0-1-30: ask for what follows 0-1-41 (0-1-29 would name
    # nothing, or the wrong transaction).
    assert resume.request() == (None, None, "0-1-41")
    assert [resume.accept(_record(*r)) for r in
            ((0, 1, 30, 1), (0, 1, 30, 2), (0, 1, 30, 3), (0, 2, 12, 1), (0, 1, 5, 1))] == \
        [False, False, True, True, True]
    assert resume.request() == (None, None, "0-2-12")  # 0-1-5 in delivery


def test_a_client_resuming_a_seek_drops_only_what_it_delivered():
    resume = Resume()
    for record in ((0, 1, 41, 1), (0, 1, 30, 1)):
        assert resume.accept(_record(*record))
    assert resume.request() == (None, "0-1-30", None)
    assert [resume.accept(_record(*r)) for r in
            ((0, 1, 30, 1), (0, 1, 30, 2), (0, 1, 29, 1), (0, 2, 30, 1))] == \
        [False, True, True, True]
