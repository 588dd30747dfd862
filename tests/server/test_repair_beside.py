"""Whole-table repairs read beside the stream (``reread/beside.py``, issue 49 item 2): while one
table's repair reads, every other table streams; the table's own changes wait for the repair
(``reread/held.py``) and follow it, each before-image the row a consumer holds, and the table
rebuilt from its raw JSON stream equals ``SELECT`` on the source, value by value.

The repair's process is held at a gate (after it has read the source, before it compares) so
the test knows what the stream carries while it waits; ``MIN_BYTES`` is 0 so that a table of a
few hundred rows takes the path a big one takes, and ``ATTACH_ROWS`` small so that the
records span several transactions."""

from __future__ import annotations

import asyncio
import os
import re
from decimal import Decimal
from typing import Any

import pytest

from cdcserver.app import resyncs
from cdcserver.core.names import TableName
from cdcserver.reread import beside
from cdcserver.reread.besideprocess import Cancelled
from cdcserver.store.checkpoint import covered_state
from cdcserver.store.layout import DataDir
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, until
from tests.oracle import assert_stream_equals_table, read_stream
from tests.server.test_crash import ServiceProcess, _service_args

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


async def _equals_select(port: int, source: Source, table: str) -> None:
    """The oracle: the table rebuilt from its raw JSON stream equals SELECT on the source."""
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(port, conn, source.database, table, user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()


async def _resync_beside(running: RunningService, source: Source, data_dir: str,
                         table: TableName, other: str) -> None:
    """Ask for the table's resync, and give the source transactions (on ``other``) until
    its read beside the stream is under way: a resync starts with the next transaction."""
    resyncs.ask(data_dir, table)
    for i in range(2000, 2300):
        if table in _repairing(running):
            return
        source.execute(f"INSERT INTO {other} VALUES ({i}, {i})")
        await asyncio.sleep(0.1)


def _repairing(cdc: RunningService) -> dict:
    pipeline = cdc.service.replication.runner.pipeline
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


def _check_before_images(records: list[dict]) -> None:
    """Each record applied as a careful consumer would: an ``update_before`` or a ``delete``
    must be the row it holds for the key, an ``insert`` a key it does not hold."""
    held: dict[int, dict] = {}
    for record in records:
        row = {c: record[c] for c in ("id", "a", "b")}
        kind, key = record["event_type"], record["id"]
        if kind in ("update_before", "delete"):
            assert held.pop(key, None) == row, f"untrue before-image: {record}"
        elif kind == "insert":
            assert key not in held, f"an insert of a key held already: {record}"
            held[key] = row
        else:
            held[key] = row


def _stream_always_busy(cdc: RunningService) -> None:
    """The pipeline is told the stream always has more: no transaction is held for a repair
    (``reread/lastcommit.py``), so its records spread over the transactions that follow, a
    share each, as under steady traffic (which a test cannot make steady enough)."""
    pipeline = cdc.service.replication.runner.pipeline
    assert pipeline is not None and pipeline.repairer is not None
    pipeline.repairer.input_waiting = lambda: True


async def test_other_tables_stream_while_a_table_is_repaired_and_its_own_changes_wait(
        cdc: RunningService, source: Source, gate: Gate):
    m, other = _fill(source)
    await cdc.caught_up(source)
    _stream_always_busy(cdc)
    stored = await read_stream(cdc.port, m, user=USER, password=PASSWORD, quiet=0.5)
    # truncates 'row 10' .. 'row 300' to five characters without row events: a rewrite
    source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {m} MODIFY a VARCHAR(5)")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    # the repair waits at its gate: the other table streams; this one's changes wait
    source.execute(f"INSERT INTO {other} VALUES (1, 1), (2, 2)",
                   f"UPDATE {m} SET b = -b WHERE id IN (20, 21)",  # before-image 'row 2'
                   f"DELETE FROM {m} WHERE id = 30",
                   f"INSERT INTO {m} VALUES (1001, 'new', 1)",
                   f"UPDATE {m} SET a = 'x' WHERE id = 5")
    await cdc.caught_up(source)  # not held by the repair
    others = await read_stream(cdc.port, other, user=USER, password=PASSWORD, quiet=0.5)
    assert [r["id"] for r in others if "event_type" in r] == [1, 2]
    waiting = await read_stream(cdc.port, m, user=USER, password=PASSWORD, quiet=0.5)
    assert [r for r in waiting if "event_type" in r] == \
        [r for r in stored if "event_type" in r], "the table's changes went out before its repair"
    assert _repairing(cdc), "the repair finished before the test opened its gate"
    gate.set()
    await _until_repaired(cdc, source, other)

    await _equals_select(cdc.port, source, "m")
    lines = await read_stream(cdc.port, m, user=USER, password=PASSWORD, quiet=0.5)
    records = [r for r in lines if "event_type" in r]
    _check_before_images(records)
    repairs = [r for r in records if r.get("cdc:repair")]
    first = records.index(repairs[0])
    # after the ALTER: the repair first, then the table's own changes, in their order
    assert all(r.get("cdc:repair") for r in records[first:first + len(repairs)])
    assert {r["id"] for r in repairs} >= set(range(10, ROWS + 1)) - {20, 21, 30}
    assert all(len(r["a"]) <= 5 for r in repairs if r["event_type"] == "update_after")
    # held changes ride on transactions after the repair's records, with their GTIDs
    assert all(r["sequence"] >= repairs[-1]["sequence"]
               for r in records[first + len(repairs):])
    assert len({r["sequence"] for r in repairs}) > 1  # spread over several transactions
    assert repairs[0]["cdc:repair"]["cause"]


async def test_after_the_sources_last_write_one_transaction_takes_the_whole_repair(
        cdc: RunningService, source: Source, gate: Gate):
    """The source writes nothing after the ALTER but one transaction: the repair's records
    and the changes held for it all ride on that one (its commit waits for them), and the
    checkpoint then covers the source; not one share per transaction still to come."""
    m, other = _fill(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {m} MODIFY a VARCHAR(5)")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    source.execute(f"UPDATE {m} SET b = -b WHERE id IN (20, 21)",  # held for the repair
                   f"INSERT INTO {m} VALUES (1001, 'new', 1)")
    await cdc.caught_up(source)
    gate.set()
    repair = next(iter(_repairing(cdc).values()))
    await until(repair.done.is_set, timeout=60)
    assert _repairing(cdc) and cdc.service.replication.runner.repair_pending(), \
        "the repair went out with no transaction to ride on"
    assert beside.ATTACH_ROWS * 3 < ROWS  # several shares: one transaction takes them all
    source.execute(f"INSERT INTO {other} VALUES (1, 1)")
    await cdc.caught_up(source)
    assert not _repairing(cdc) and not cdc.service.replication.runner.repair_pending()
    data_dir = cdc.service.config.store.data_dir
    await until(lambda: _stored(data_dir, source), timeout=30)

    lines = await _exact_and_true(cdc, source, "m")
    records = [r for r in lines if "event_type" in r]
    last = source.gtid_state()
    first = next(i for i, r in enumerate(records) if r.get("cdc:repair"))
    # the repair, then the changes held for it (20, 21, 1001: their own records, or in the
    # repair's where its read came after them)
    rode = records[first:]
    assert len(rode) > ROWS and {20, 21, 1001} <= {r["id"] for r in rode}
    assert {r["sequence"] for r in rode} == \
        {g.sequence for g in last if g.domain == rode[0]["domain"]}


def _decimals(source: Source) -> tuple[str, str]:
    """A table whose odd rows hold a value ``DECIMAL(10,1)`` renders otherwise (``1.345``),
    and whose even rows one it renders alike (``2.500``)."""
    db = source.database
    source.execute(f"USE `{db}`",
                   f"CREATE TABLE `{db}`.n (id INT PRIMARY KEY, d DECIMAL(10,3), b INT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.n SELECT seq, seq + IF(seq % 2, 0.345, 0.5), seq "
                   f"FROM seq_1_to_{ROWS}")
    return f"`{db}`.n", f"`{db}`.other"


async def _exact_and_true(cdc: RunningService, source: Source, table: str) -> list[dict]:
    """The table rebuilt from its raw JSON stream equals SELECT, and no before-image or
    insert in it contradicts what a consumer holds; its lines."""
    conn = source.server.connect()
    try:
        rebuilt = await assert_stream_equals_table(cdc.port, conn, source.database, table,
                                                   user=USER, password=PASSWORD)
    finally:
        conn.close()
    assert not rebuilt.inconsistencies, rebuilt.examples
    return await read_stream(cdc.port, f"`{source.database}`.{table}", user=USER,
                             password=PASSWORD, quiet=0.5)


def _retyped_out(lines: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records before the table's second version (the retyping ALTER's) and after."""
    second = next(i for i, line in enumerate(lines) if i and "event_type" not in line)
    return ([r for r in lines[:second] if "event_type" in r],
            [r for r in lines[second:] if "event_type" in r])


async def test_a_retyping_alter_waits_for_its_repair_and_the_rows_it_retypes_go_first(
        cdc: RunningService, source: Source, gate: Gate):
    """Issue 50, items 3 and 4, for a table repaired beside the stream: after ``MODIFY d
    DECIMAL(10,1), CHANGE b c INT`` the repair's ``update_before`` of a row held as
    ``1.345`` showed ``1.3`` (the new scale), and ``c``, renamed by the statement, was NULL
    in every before-image. The statement now waits with the table's changes while the
    repair reads; the rows whose values the new types render otherwise go out first,
    deleted in the old version exactly as held, then the new version, then the repair,
    which inserts them as the table has them."""
    n, other = _decimals(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''",
                   f"ALTER TABLE {n} MODIFY d DECIMAL(10,1), CHANGE b c INT")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    source.execute(f"UPDATE {n} SET c = -c WHERE id IN (1, 2)",  # held, in the new version
                   f"INSERT INTO {other} VALUES (1, 1)")
    await cdc.caught_up(source)  # the other table streams
    waiting = await read_stream(cdc.port, n, user=USER, password=PASSWORD, quiet=0.5)
    assert [line for line in waiting if "event_type" not in line] == waiting[:1], \
        "the new version went out before the rows it retypes"
    assert _repairing(cdc), "the repair finished before the test opened its gate"
    gate.set()
    await _until_repaired(cdc, source, other)

    lines = await _exact_and_true(cdc, source, "n")
    before, after = _retyped_out(lines)
    deleted = [r for r in before if r["event_type"] == "delete"]
    assert sorted(r["id"] for r in deleted) == list(range(1, ROWS + 1, 2))
    assert all(r.get("cdc:repair") for r in deleted)
    first = next(r for r in deleted if r["id"] == 1)
    assert (Decimal(str(first["d"])), first["b"]) == (Decimal("1.345"), 1)  # exactly as held
    repaired = [r for r in after if r.get("cdc:repair")]
    assert {r["id"] for r in repaired if r["event_type"] == "insert"} == \
        set(range(1, ROWS + 1, 2))
    # rows the new types render alike, renamed, are the rows held: nothing to repair (but
    # the two updated meanwhile, where the repair's read holds their update already)
    assert not [r for r in repaired if r["event_type"] != "insert" and r["id"] not in (1, 2)]


async def test_a_retyping_alter_whose_repair_is_called_off_goes_out_after_the_rows_it_retypes(
        cdc: RunningService, source: Source, gate: Gate):
    """A schema statement on the table while the retyping ALTER waits for its repair calls
    the repair off: the ALTER goes out then, after the rows it retypes (read by the
    pipeline), and the repair read again after the second statement inserts them."""
    n, other = _decimals(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {n} MODIFY d DECIMAL(10,1)")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    first = next(iter(_repairing(cdc).values()))
    waiting = await read_stream(cdc.port, n, user=USER, password=PASSWORD, quiet=0.5)
    assert [line for line in waiting if "event_type" not in line] == waiting[:1], \
        "the ALTER was not held for its repair"
    source.execute(f"UPDATE {n} SET b = -b WHERE id IN (3, 4)",  # held, then dropped
                   f"ALTER TABLE {n} ADD COLUMN z INT DEFAULT 3")  # calls it off
    await until(lambda: first.done.is_set(), timeout=30)
    assert isinstance(first.error, Cancelled)
    gate.set()
    await _until_repaired(cdc, source, other)

    lines = await _exact_and_true(cdc, source, "n")
    before, after = _retyped_out(lines)
    assert sorted(r["id"] for r in before if r["event_type"] == "delete") == \
        list(range(1, ROWS + 1, 2))
    assert {r["id"] for r in after if r["event_type"] == "insert"} >= \
        set(range(1, ROWS + 1, 2))


async def test_replication_started_again_in_the_process_while_a_repair_waits_doubles_nothing(
        cdc: RunningService, source: Source, gate: Gate):
    """Replication starts over in the same process (a sink added or removed, a full disk, a
    repair that could not reach the source) from the sinks' checkpoints, and no checkpoint
    is written while a repair waits. The store used to apply again every transaction it had
    applied since (each insert twice in the stream); it skips them now. The retyping ALTER
    the repair held is read again and held again: it goes out once, after the rows it
    retypes."""
    n, other = _decimals(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {n} MODIFY d DECIMAL(10,1)")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    source.execute(*(f"INSERT INTO {other} VALUES ({i}, {i})" for i in range(1, 20)))
    await cdc.caught_up(source)
    await cdc.service.replication.runner.restart()
    source.execute(*(f"INSERT INTO {other} VALUES ({i}, {i})" for i in range(20, 30)),
                   f"UPDATE {n} SET b = -b WHERE id = 3")
    await cdc.caught_up(source)
    gate.set()
    await _until_repaired(cdc, source, other)
    await _exact_and_true(cdc, source, "other")
    lines = await _exact_and_true(cdc, source, "n")
    assert len([line for line in lines if "event_type" not in line]) == 2  # two versions
    before, _ = _retyped_out(lines)
    assert sorted(r["id"] for r in before if r["event_type"] == "delete") == \
        list(range(1, ROWS + 1, 2))


async def test_a_repair_called_off_by_a_table_swap_reads_the_rows_under_their_new_name(
        cdc: RunningService, source: Source, gate: Gate):
    """A swap (``RENAME TABLE m TO tmp, x TO m, tmp TO x``) while ``m``'s repair reads calls
    it off, and it starts again for ``x``, where its rows went. It used to start at once, in
    the swap's own transaction, when the store still held the other table's rows under
    ``x``: the repair compared those with the source and sent deletes and updates of rows no
    consumer of ``x`` held. It starts with the next transaction now, once the swap is
    stored."""
    m, other = _fill(source)
    db = source.database
    source.execute(f"USE `{db}`",
                   f"CREATE TABLE `{db}`.x (id INT PRIMARY KEY, c INT, e VARCHAR(10))",
                   f"INSERT INTO `{db}`.x SELECT seq, -seq, 'x' FROM seq_1_to_50")
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {m} MODIFY a VARCHAR(5)")
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    first = next(iter(_repairing(cdc).values()))
    source.execute(f"RENAME TABLE {m} TO `{db}`.tmp, `{db}`.x TO {m}, `{db}`.tmp TO `{db}`.x")
    await until(lambda: first.done.is_set(), timeout=30)
    gate.set()
    await _until_repaired(cdc, source, other)
    for table in ("x", "m"):
        await _exact_and_true(cdc, source, table)


async def test_a_schema_statement_during_the_repair_reads_it_again(
        cdc: RunningService, source: Source, gate: Gate):
    m, other = _fill(source)
    await cdc.caught_up(source)
    source.execute("SET SESSION sql_mode = ''",
                   f"ALTER TABLE {m} MODIFY a VARCHAR(5)")  # truncates: a rewrite
    await until(lambda: bool(_repairing(cdc)), timeout=30)
    first = next(iter(_repairing(cdc).values()))
    source.execute(f"UPDATE {m} SET b = -b WHERE id IN (20, 21)",  # held (before-image 'row 2')
                   f"ALTER TABLE {m} ADD COLUMN z INT DEFAULT 3")  # calls it off
    await until(lambda: first.done.is_set(), timeout=30)
    assert isinstance(first.error, Cancelled)
    source.execute(f"UPDATE {m} SET b = 0 WHERE id = 22")  # held by the repair read again
    gate.set()
    await _until_repaired(cdc, source, other)
    await _equals_select(cdc.port, source, "m")
    # what the first repair held never went out with the old rows' before-images
    lines = await read_stream(cdc.port, m, user=USER, password=PASSWORD, quiet=0.5)
    _check_before_images([r for r in lines if "event_type" in r])


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
        await _equals_select(running.port, source, "m")
    finally:
        await running.stop()


@pytest.fixture
def reader_of_other(source: Source) -> Any:
    """The test's tables (:func:`_fill`) and a replication user who may read ``other`` but
    not ``m``: a repair of ``m`` cannot read it (the table is quarantined) until ``m`` is
    granted."""
    user = f"rb{os.getpid()}"
    hosts = ("127.0.0.1", "localhost")
    tables = _fill(source)
    for host in hosts:
        source.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY 'pw'",
                       f"GRANT RELOAD, REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER "
                       f"ADMIN ON *.* TO '{user}'@'{host}'",
                       f"GRANT SELECT ON `{source.database}`.`other` TO '{user}'@'{host}'")

    def grant_m() -> None:
        source.execute(*(f"GRANT SELECT ON `{source.database}`.`m` TO '{user}'@'{host}'"
                         for host in hosts))

    yield source.server.url(user, "pw"), grant_m, tables
    for host in hosts:
        source.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")


async def test_a_quarantined_table_is_resynced_beside_the_stream(
        tmp_path, source: Source, users_file: str, gate: Gate, reader_of_other: Any,
        caplog: pytest.LogCaptureFixture):
    url, grant_m, (m, other) = reader_of_other
    table = TableName(source.database, "m")
    data_dir = str(tmp_path / "data")
    running = await start_service(make_config(data_dir, url, users_file))
    try:
        await running.caught_up(source)
        # a rewrite the service cannot read again: m is quarantined; a change made then is
        # not stored (the resync brings it)
        source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {m} MODIFY a VARCHAR(5)",
                       f"UPDATE {m} SET b = 0 WHERE id = 3")
        await until(lambda: table in running.service.data.store.quarantined, timeout=30)
        # a table the service may not read is quarantined by the failed read beside the
        # stream, not read again by the pipeline (which would hold every table as it folds)
        assert "the pipeline reads them" not in caplog.text
        grant_m()
        await _resync_beside(running, source, data_dir, table, other)
        assert table in _repairing(running), "the resync was not read beside the stream"
        # held at the gate after its read: the other table streams, m's changes wait
        source.execute(f"INSERT INTO {other} VALUES (1, 1), (2, 2)",
                       f"UPDATE {m} SET b = -b WHERE id IN (20, 21)",
                       f"DELETE FROM {m} WHERE id = 30",
                       f"INSERT INTO {m} VALUES (1001, 'new', 1)",
                       f"UPDATE {m} SET a = 'x' WHERE id = 5")
        await running.caught_up(source)
        others = await read_stream(running.port, other, user=USER, password=PASSWORD,
                                   quiet=0.5)
        assert [r["id"] for r in others if "event_type" in r and r["id"] < 2000] == [1, 2]
        assert table in running.service.data.store.quarantined
        gate.set()
        await _until_repaired(running, source, other)
        assert table not in running.service.data.store.quarantined
        assert running.service.replication.runner.repair_stats.resyncs
        await _equals_select(running.port, source, "m")
        lines = await read_stream(running.port, m, user=USER, password=PASSWORD, quiet=0.5)
        _check_before_images([r for r in lines if "event_type" in r])
        schemas = [line for line in lines if "event_type" not in line]
        assert (schemas[-1].get("ddl") or {}).get("kind") == "resync", schemas[-1]
    finally:
        await running.stop()


async def test_a_schema_statement_during_a_resync_beside_the_stream_starts_it_again(
        tmp_path, source: Source, users_file: str, gate: Gate, reader_of_other: Any):
    url, grant_m, (m, other) = reader_of_other
    table = TableName(source.database, "m")
    data_dir = str(tmp_path / "data")
    running = await start_service(make_config(data_dir, url, users_file))
    try:
        await running.caught_up(source)
        source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE {m} MODIFY a VARCHAR(5)")
        await until(lambda: table in running.service.data.store.quarantined, timeout=30)
        grant_m()
        await _resync_beside(running, source, data_dir, table, other)
        first = _repairing(running)[table]
        assert first.resync is not None
        source.execute(f"UPDATE {m} SET b = -b WHERE id = 20",  # held, then dropped
                       f"ALTER TABLE {m} ADD COLUMN z INT DEFAULT 3")  # calls it off
        await until(lambda: first.done.is_set(), timeout=30)
        assert isinstance(first.error, Cancelled)
        gate.set()
        for i in range(2300, 2600):  # asked again, it reads after the statement
            if table not in running.service.data.store.quarantined and not _repairing(running):
                break
            source.execute(f"INSERT INTO {other} VALUES ({i}, {i})")
            await asyncio.sleep(0.1)
        assert table not in running.service.data.store.quarantined
        await _equals_select(running.port, source, "m")
        lines = await read_stream(running.port, m, user=USER, password=PASSWORD, quiet=0.5)
        _check_before_images([r for r in lines if "event_type" in r])
        assert [(line.get("ddl") or {}).get("kind") for line in lines
                if "event_type" not in line][-1] == "resync"
    finally:
        await running.stop()


def _stored(data_dir: str, source: Source) -> bool:
    """Whether the service's checkpoint covers everything the source has logged."""
    stored = covered_state(DataDir(data_dir).checkpoint)
    return all(stored.covers(gtid) for gtid in source.gtid_state())


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _described(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f"{pid} {_running(pid)} {f.read()[:200]!r}")
        except OSError:
            out.append(f"{pid} gone")
    return out


def _children(pid: int) -> list[int]:
    """The repair processes the service spawned (multiprocessing's spawn entry point)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if parent == pid and b"multiprocessing" in cmdline:
            found.append(int(entry))
    return found


async def test_kill_9_of_the_service_ends_its_repair_and_the_next_start_repairs_again(
        tmp_path, source: Source, users_file: str):
    """A real big table (over MIN_BYTES stored): the service killed with -9 while the repair's
    process reads takes that process with it; the next start reads the change again (no
    checkpoint passed it) and repairs it, and no file of the killed repair is left."""
    db = source.database
    source.execute(f"USE `{db}`",
                   f"CREATE TABLE `{db}`.big (id INT PRIMARY KEY, a VARCHAR(600), b INT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.big SELECT seq, REPEAT(CONCAT('row ', seq), 50), "
                   "seq FROM seq_1_to_20000")  # 10 MB stored, over MIN_BYTES
    data_dir = str(tmp_path / "data")
    args = [a if a != "warning" else "info" for a in _service_args(data_dir, source,
                                                                   users_file)]
    log_path = str(tmp_path / "service.log")
    hold = Gate(str(tmp_path / "open"))  # the repair waits for it: killed while it reads
    service = ServiceProcess(args, log_path)
    os.environ["CDC_TEST_REPAIR_HOLD"] = hold.path
    try:
        service.start()
    finally:
        del os.environ["CDC_TEST_REPAIR_HOLD"]

    def logged(text: str) -> bool:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return text in f.read()

    try:
        await until(lambda: _stored(data_dir, source), timeout=120)
        source.execute(f"ALTER TABLE `{db}`.big ADD COLUMN k INT NOT NULL DEFAULT 7")
        await until(lambda: logged("is read beside the stream"), timeout=60)
        assert service.process is not None
        await until(lambda: bool(_children(service.process.pid)), timeout=30)
        repairs = _children(service.process.pid)
        service.kill()
        await until(lambda: not any(_running(p) for p in repairs), timeout=10,
                    what=f"the repair's process to end with the service: {_described(repairs)}")
        hold.set()  # (the next start's repair is not held)
        service.start()
        for i in range(600):  # transactions for the repair's records to ride on
            source.execute(f"INSERT INTO `{db}`.other VALUES ({i}, {i})")
            if logged("beside the stream, in"):
                break
            await asyncio.sleep(0.1)
        assert logged("beside the stream, in"), "the repair was not done again"
        await until(lambda: _stored(data_dir, source), timeout=120)
        with open(log_path, encoding="utf-8", errors="replace") as f:
            port = int(re.findall(r"listening on [\d.]+:(\d+)", f.read())[-1])
        await _equals_select(port, source, "big")
        assert not [n for n in os.listdir(os.path.join(data_dir, "state"))
                    if ".repair-" in n]
    finally:
        if service.process is not None and service.process.poll() is None:
            service.terminate()
