"""XA transactions, exactly (issue 50, item 1).

MariaDB logs an XA transaction as two event groups with GTIDs of their own: ``XA PREPARE``
with the rows, then ``XA COMMIT`` or ``XA ROLLBACK`` by xid, possibly much later and from
another connection. The rows go out once, at the commit, carrying the commit's GTID, in commit
order; a rollback's never. They used to stop the whole service ("XA transactions are not
supported"). The oracle is the table rebuilt from its raw JSON stream against ``SELECT``, and
the GTID each committing session read back from ``@@last_gtid``.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cdcserver.core.gtid import Gtid
from cdcserver.ops.metrics import health
from cdcserver.replication.xa import Xid
from cdcserver.store import checkpoint
from cdcserver.store.layout import DataDir
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, until
from tests.oracle import assert_stream_equals_table, read_stream
from tests.server.test_crash import ServiceProcess, _service_args, restartable

__all__ = ["restartable"]  # the fixture, used here

pytestmark = pytest.mark.mariadb


def _session(source: Source) -> Any:
    conn = source.server.connect()
    conn.autocommit(True)
    return conn


def _run(conn: Any, *statements: str) -> str:
    """The statements on one session; the GTID the last one logged (``@@last_gtid``)."""
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
        cur.execute("SELECT @@last_gtid")
        return str(cur.fetchone()[0])


def _prepare(conn: Any, db: str, xid: str, *rows: str) -> str:
    return _run(conn, f"XA START {xid}", *(f"INSERT INTO `{db}`.t VALUES {r}" for r in rows),
                f"XA END {xid}", f"XA PREPARE {xid}")


async def _records(cdc: RunningService, source: Source, table: str = "t"
                   ) -> list[dict[str, Any]]:
    """Every record up to what the source has logged now (a bounded read: the stream ends
    by itself, however slow the machine)."""
    name = f"`{source.database}`.{table}"
    lines = await read_stream(cdc.port, name, user=USER, password=PASSWORD, quiet=60,
                              request=f"REQUEST-DATA {name} UNTIL {source.gtid_state()}")
    assert "end" in lines[-1], "the bounded read was cut"
    return [line for line in lines if "event_type" in line]


async def _stream_equals_table(cdc: RunningService, source: Source) -> None:
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, source.database, "t", user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()


def _gtid(record: dict[str, Any]) -> str:
    return f"{record['domain']}-{record['server_id']}-{record['sequence']}"


async def test_rows_go_out_once_at_the_commit_with_its_gtid_and_never_at_a_rollback(
        cdc: RunningService, source: Source):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    first, other = _session(source), _session(source)
    try:
        _prepare(first, db, "'a'", "(1, 'prepared first')")
        _run(other, f"INSERT INTO `{db}`.t VALUES (2, 'plain')")  # commits before 'a'
        await cdc.caught_up(source)
        assert [r["id"] for r in await _records(cdc, source)] == [2], "prepared rows went out"
        binary = "X'00ff01', X'6271', 7"  # an xid with any bytes
        _prepare(other, db, binary, "(3, 'rolled back')")
        committed = _run(first, "XA COMMIT 'a'")
        rolled_back = _run(other, f"XA ROLLBACK {binary}")
        one_phase = _run(other, "XA START 'one'", f"INSERT INTO `{db}`.t VALUES (4, 'one')",
                         "XA END 'one'", "XA COMMIT 'one' ONE PHASE")
        _prepare(other, db, binary, "(5, 'xid used again')")
        other.close()  # a prepared XA outlives its session: another one commits it
        other = _session(source)
        again = _run(other, f"XA COMMIT {binary}")
    finally:
        first.close()
        other.close()
    await cdc.caught_up(source)
    records = await _records(cdc, source)
    assert [(r["id"], r["event_type"]) for r in records] == [
        (2, "insert"), (1, "insert"), (4, "insert"), (5, "insert")]
    assert [_gtid(r) for r in records[1:]] == [committed, one_phase, again]
    assert rolled_back not in [_gtid(r) for r in records]
    await _stream_equals_table(cdc, source)


def _interleaved(source: Source, seed: int, workers: int, each: int) -> dict[int, str]:
    """``workers`` sessions, each ``each`` XA transactions of 1-3 rows over two tables, some
    rolled back, some with a plain transaction between prepare and commit: the rows each
    committed, by the GTID of its commit."""
    db = source.database
    committed: dict[int, str] = {}
    lock = threading.Lock()

    def work(worker: int) -> None:
        chance = random.Random(seed * 100 + worker)
        conn = _session(source)
        try:
            for n in range(each):
                ids = [(worker * each + n) * 4 + k for k in range(chance.randint(1, 3))]
                xid = f"'w{worker}', 'n{n}', {worker + 1}"
                _prepare(conn, db, xid, *(f"({i}, 'w{worker}')" for i in ids))
                if chance.random() < 0.2:
                    _run(conn, f"XA ROLLBACK {xid}")
                    continue
                gtid = _run(conn, f"XA COMMIT {xid}")
                with lock:
                    committed.update((i, gtid) for i in ids)
                if chance.random() < 0.3:
                    _run(conn, f"INSERT INTO `{db}`.side VALUES ({ids[0]})")
        finally:
            conn.close()

    with ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(work, w) for w in range(workers)]:
            done.result()  # a session's error fails the test
    return committed


async def test_a_thousand_interleaved_xa_transactions_from_8_connections(
        cdc: RunningService, source: Source):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))",
                   f"CREATE TABLE `{db}`.side (id INT PRIMARY KEY)")
    seed = int(os.environ.get("CDC_TEST_SEED", "50"))
    committed = await asyncio.to_thread(_interleaved, source, seed, 8, 125)
    await cdc.caught_up(source, timeout=120)
    records = await _records(cdc, source)
    stream = {r["id"]: _gtid(r) for r in records}
    assert len(records) == len(stream), f"seed {seed}: a row went out twice"
    assert stream == committed, f"seed {seed}: rows or their GTIDs differ"
    sequences = [r["sequence"] for r in records]
    assert sequences == sorted(sequences), f"seed {seed}: not in commit order"
    await _stream_equals_table(cdc, source)
    assert cdc.service.replication.runner.stats().xa_prepared == 0
    kept = DataDir(cdc.service.config.store.data_dir).xa  # let go once checkpointed
    await until(lambda: not os.listdir(kept), 30, "the completed XA transactions let go")


async def test_prepared_rows_survive_kill_9_of_the_service_and_a_restart_of_mariadb(
        tmp_path, restartable: Source, users_file: str):
    """The prepare is read and checkpointed past; the service is killed (-9); MariaDB
    restarts; a new session commits: the rows go out at that commit, with its GTID."""
    source = restartable
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    data_dir = str(tmp_path / "data")
    service = ServiceProcess(_service_args(data_dir, source, users_file),
                             str(tmp_path / "service.log"))
    service.start()
    try:
        conn = _session(source)
        try:
            _prepare(conn, db, "'survivor'", "(1, 'kept')", "(2, 'kept too')")
        finally:
            conn.close()  # the prepared XA stays on the server, detached
        conn = _session(source)
        try:
            after = _run(conn, f"INSERT INTO `{db}`.t VALUES (3, 'after')")
        finally:
            conn.close()

        def checkpointed() -> bool:
            saved = checkpoint.load(DataDir(data_dir).checkpoint)
            return saved is not None and saved.position is not None and \
                saved.position.gtid_state.covers(Gtid.parse(after))

        await until(checkpointed, 60, "a checkpoint past the prepare")
    finally:
        service.kill()
    await asyncio.to_thread(source.server.stop)
    await asyncio.to_thread(source.server.start)
    conn = _session(source)
    try:
        assert any(b"survivor" in bytes(row[3]) for row in _xa_recover(conn))
        committed = _run(conn, "XA COMMIT 'survivor'")
    finally:
        conn.close()
    running = await start_service(make_config(data_dir, source.url, users_file))
    try:
        await running.caught_up(source)
        records = await _records(running, source)
        assert [(r["id"], _gtid(r)) for r in records] == [
            (3, after), (1, committed), (2, committed)]
        assert running.service.replication.runner.stats().xa_prepared == 0
    finally:
        await running.stop()


def _xa_recover(conn: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute("XA RECOVER")
        return list(cur.fetchall())


@pytest.fixture(autouse=True)
def _no_prepared_left(source: Source) -> Iterator[None]:
    """A test that fails between prepare and commit leaves no XA holding locks for the
    next test."""
    yield
    if source.server.process is None:
        return
    conn = _session(source)
    try:
        for format_id, gtrid_length, _, data in _xa_recover(conn):
            raw = data if isinstance(data, bytes) else str(data).encode()
            _run(conn, f"XA ROLLBACK X'{raw[:gtrid_length].hex()}', "
                       f"X'{raw[gtrid_length:].hex()}', {format_id}")
    finally:
        conn.close()


async def test_a_commit_of_a_transaction_prepared_before_the_start_is_named_in_health(
        tmp_path, source: Source, users_file: str):
    """Its rows were logged before the position the service starts from: they cannot be
    streamed, and the service says so (`/health` degraded, naming the xid and the commit)
    instead of passing the commit in silence."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    conn = _session(source)
    try:
        _prepare(conn, db, "'early'", "(1, 'before the start')")
    finally:
        conn.close()
    start = str(source.gtid_state())
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file,
                                              source={"start_gtid": start}))
    try:
        conn = _session(source)
        try:
            committed = _run(conn, "XA COMMIT 'early'")
        finally:
            conn.close()
        await running.caught_up(source)
        healthy, document = health(running.service.stats(), 60.0)
        assert not healthy
        assert any(str(Xid(1, b"early", b"")) in p and committed in p and "resync" in p
                   for p in document["problems"]), document["problems"]
    finally:
        await running.stop()
