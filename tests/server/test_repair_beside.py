"""Whole-table repairs read beside the stream (``reread/beside.py``, issue 49 item 2): while one
table's repair reads, every other table streams, and so does the table itself; the rows the
stream changes meanwhile leave the repair, and the table rebuilt from its raw JSON stream
equals ``SELECT`` on the source, value by value.

The repair's process is held at a gate (after it has read the source, before it compares) so
the test knows what the stream carries while it waits; ``MIN_BYTES`` is 0 so that a table of a
few hundred rows takes the path a big one takes, and ``ATTACH_ROWS`` small so that the
records span several transactions."""

from __future__ import annotations

import asyncio
import json

import pytest

from cdcserver.reread import beside
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, until
from tests.oracle import assert_stream_equals_table, read_stream

pytestmark = pytest.mark.mariadb

ROWS = 300


class Gate:
    """A file the repair's process waits for before it compares."""

    def __init__(self, path: str) -> None:
        self.path = path

    def set(self) -> None:
        with open(self.path, "w"):
            pass


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Gate:
    """Repairs beside the stream for every keyed table, held before they compare until set."""
    held = Gate(str(tmp_path / "open"))
    monkeypatch.setattr(beside, "MIN_BYTES", 0)
    monkeypatch.setattr(beside, "ATTACH_ROWS", 40)
    monkeypatch.setattr(beside, "HOLD_BEFORE_COMPARE", held.path)
    return held


def _fill(source: Source) -> tuple[str, str]:
    db = source.database
    source.execute(f"USE `{db}`",
                   f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY, a VARCHAR(40), b INT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.m SELECT seq, CONCAT('row ', seq), seq "
                   f"FROM seq_1_to_{ROWS}")
    return f"`{db}`.m", f"`{db}`.other"


def _repairing(cdc: RunningService) -> dict:
    pipeline = cdc.service.replication.pipeline
    assert pipeline is not None and pipeline.repairer is not None
    return pipeline.repairer._beside


async def _until_repaired(cdc: RunningService, source: Source, other: str) -> None:
    """Commits to another table until the repair is out (its records ride on them)."""
    for i in range(1000, 1200):
        source.execute(f"INSERT INTO {other} VALUES ({i}, {i})")
        await cdc.caught_up(source)
        if not _repairing(cdc):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the repair never finished")


async def test_other_tables_and_the_table_itself_stream_while_it_is_repaired(
        cdc: RunningService, source: Source, gate: Gate):
    m, other = _fill(source)
    await cdc.caught_up(source)
    source.execute(f"ALTER TABLE {m} ADD COLUMN k INT NOT NULL DEFAULT 7")  # every row
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    # the repair waits at its gate: the other table streams, and so does this one
    source.execute(f"INSERT INTO {other} VALUES (1, 1), (2, 2)",
                   f"UPDATE {m} SET a = 'changed after' WHERE id IN (5, 6)",
                   f"DELETE FROM {m} WHERE id = 7",
                   f"INSERT INTO {m} VALUES (1001, 'new', 1, 8)",
                   f"UPDATE {m} SET k = 9 WHERE id = 8")
    await cdc.caught_up(source)  # not held by the repair
    others = await read_stream(cdc.port, other, user=USER, password=PASSWORD, quiet=0.5)
    assert [r["id"] for r in others if "event_type" in r] == [1, 2]
    assert _repairing(cdc), "the repair finished before the test opened its gate"
    gate.set()
    await _until_repaired(cdc, source, other)

    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, source.database, "m", user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()
    lines = await read_stream(cdc.port, m, user=USER, password=PASSWORD, quiet=0.5)
    repairs = [r for r in lines if r.get("cdc:repair")]
    repaired = {r["id"] for r in repairs}
    # every row the stream did not change after the ALTER, and none that it did
    assert repaired == set(range(1, ROWS + 1)) - {5, 6, 7, 8}
    assert all(r["event_type"] in ("update_before", "update_after") for r in repairs)
    assert {r["k"] for r in repairs if r["event_type"] == "update_after"} == {7}
    assert len({r["sequence"] for r in repairs}) > 1  # spread over several transactions
    assert json.loads(json.dumps(repairs[0]["cdc:repair"]))["cause"]


async def test_a_schema_statement_during_the_repair_reads_it_again(
        cdc: RunningService, source: Source, gate: Gate):
    m, other = _fill(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''",
                   f"ALTER TABLE {m} MODIFY a VARCHAR(5)")  # truncates: a rewrite
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    first = next(iter(_repairing(cdc).values()))
    source.execute(f"ALTER TABLE {m} ADD COLUMN z INT DEFAULT 3")  # calls it off
    await until(lambda: first.done.is_set(), timeout=30)
    assert isinstance(first.error, beside.Cancelled)
    gate.set()
    await _until_repaired(cdc, source, other)
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, source.database, "m", user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()


async def test_a_restart_during_the_repair_repairs_it_again(
        tmp_path, source: Source, users_file: str, gate: Gate):
    m, other = _fill(source)
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    try:
        await running.caught_up(source)
        source.execute(f"ALTER TABLE {m} ADD COLUMN k INT NOT NULL DEFAULT 7",
                       f"UPDATE {m} SET b = -b WHERE id < 10")
        await until(lambda: bool(_repairing(running)), timeout=30)
        await running.caught_up(source)
    finally:
        await running.stop()  # the repair's thread is called off; no checkpoint passed it
    gate.set()
    running = await start_service(config)
    try:
        await running.caught_up(source)
        await _until_repaired(running, source, other)
        conn = source.server.connect()
        try:
            await assert_stream_equals_table(running.port, conn, source.database, "m",
                                             user=USER, password=PASSWORD)
        finally:
            conn.close()
    finally:
        await running.stop()
