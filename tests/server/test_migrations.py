"""Migration scripts, and what one table's problem may stop (issue 35, items 1 and 2).

Several ALTER TABLEs on one table in quick succession, as Flyway, Liquibase or Rails migrations
run them, used to stop the service for good: a repair read the table with columns a later
statement had renamed or dropped (``Unknown column 'a2'``), the store's encoder was handed a
value of a column's old type, the schema history lost track of two columns swapping names.
Each case here is checked against ``SELECT`` with the independent oracle (the table rebuilt
from its raw JSON stream), and by ``verify``. Then what remains for a table that cannot be
repaired: its quarantine (its stream stops, the others go on), and its resync.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request
from typing import Any

import pytest

from cdcserver.app.cli import main as cdcserver_main
from cdcserver.app.embedded import free_port
from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from cdcserver.store import checkpoint as ckpt
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from tests import chaos
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, eventually, lines_until
from tests.oracle import Rebuilt, assert_stream_equals_table

pytestmark = pytest.mark.mariadb

# The script, run as one
MIGRATION = (
    "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
    "INSERT INTO t VALUES (1, 1, 'x'), (2, 2, 'y')",
    "ALTER TABLE t RENAME COLUMN a TO a2",
    "UPDATE t SET a2 = 11 WHERE id = 1",
    "ALTER TABLE t CHANGE b bb VARCHAR(30) NOT NULL DEFAULT ''",
    "UPDATE t SET bb = 'yy' WHERE id = 2",
    "INSERT INTO t VALUES (3, 3, 'z')",
    "ALTER TABLE t CHANGE a2 b INT, CHANGE bb a VARCHAR(30)",
    "UPDATE t SET b = b + 100",
)


def _run(source: Source, *statements: str, session: tuple[str, ...] = ()) -> None:
    conn = source.server.connect(source.database)
    try:
        with conn.cursor() as cur:
            for statement in (*session, *statements):
                cur.execute(statement)
    finally:
        conn.close()


async def _exact(running: RunningService, source: Source, *tables: str) -> list[Rebuilt]:
    """Each table rebuilt from its stream equals it (the rebuilds, for more checks)."""
    await running.caught_up(source)
    conn = source.server.connect()
    try:
        return [await assert_stream_equals_table(running.port, conn, source.database, table,
                                                 user=USER, password=PASSWORD, quiet=0.5)
                for table in tables]
    finally:
        conn.close()


async def _verified(running: RunningService, source: Source, table: str) -> None:
    report = await asyncio.to_thread(verify_table, parse_source_url(source.url),
                                     running.service.config.store.data_dir,
                                     TableName(source.database, table))
    assert report.ok, "\n".join(report.lines())


async def test_a_migration_script_keeps_the_stream_exact(cdc: RunningService,
                                                         source: Source):
    _run(source, *MIGRATION)
    await _exact(cdc, source, "t")
    await _verified(cdc, source, "t")
    assert cdc.service.data.store.quarantined == {}


async def test_migrations_while_the_service_is_stopped(tmp_path, source: Source,
                                                       users_file: str):
    """Caught up afterwards: the source's columns are those after every statement, not
    those of the change being repaired."""
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    _run(source, "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10), "
                 "d DECIMAL(10,3), at DATETIME(3))",
         "INSERT INTO t VALUES (1, 1, 'x', 12.345, '2024-01-02 03:04:05.678'), "
         "(2, 2, 'y', 1.5, NULL)",
         "CREATE TABLE u (id INT PRIMARY KEY, v INT)", "INSERT INTO u VALUES (1, 1)")
    await running.caught_up(source)
    await running.stop()
    _run(source, "ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 5",
         "ALTER TABLE t DROP COLUMN b",
         "ALTER TABLE t MODIFY d DECIMAL(10,1)",  # narrowing: a repair in the new scale
         "ALTER TABLE t CHANGE at a2 DECIMAL(20,3)",  # a DATETIME's rows as a DECIMAL
         "ALTER TABLE t CHANGE a x INT, CHANGE c a INT",
         "UPDATE u SET v = 2")
    running = await start_service(config)
    try:
        await _exact(running, source, "t", "u")
        await _verified(running, source, "t")
        assert running.service.data.store.quarantined == {}
    finally:
        await running.stop()


async def test_two_columns_swap_names_in_one_statement(cdc: RunningService, source: Source):
    _run(source, "CREATE TABLE s (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
         "INSERT INTO s VALUES (1, 1, 'one'), (2, 2, 'two')",
         "ALTER TABLE s CHANGE a b INT, CHANGE b a VARCHAR(10)",
         "INSERT INTO s VALUES (3, 3, 'three')", "UPDATE s SET b = b * 10 WHERE id = 1")
    await _exact(cdc, source, "s")
    rebuilt_schema = await _schema_lines(cdc.port, f"{source.database}.s", source)
    assert rebuilt_schema[-1]["ddl"]["renamed_columns"] == {"a": "b", "b": "a"}
    # the history agrees with the binlog's table map after the swap: nothing was relearned
    assert [f["name"] for f in rebuilt_schema[-1]["fields"][6:]] == ["id", "b", "a"]


async def _schema_lines(port: int, table: str, source: Source) -> list[dict[str, Any]]:
    lines = await lines_until(port, f"REQUEST-DATA {table}", source.gtid_state())
    return [parsed for line in lines if "fields" in (parsed := json.loads(line))]


async def test_a_narrowing_alter_after_schema_forget_is_repaired(tmp_path, source: Source,
                                                                 users_file: str):
    """Without its old columns the history cannot tell whether an ALTER rewrote values:
    the table is read again."""
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    _run(source, "CREATE TABLE n (id INT PRIMARY KEY, s VARCHAR(10))",
         "INSERT INTO n VALUES (1, 'abcdefgh'), (2, 'ab')")
    await running.caught_up(source)
    await running.stop()
    assert cdcserver_main(["schema", "forget", f"{source.database}.n", "--data-dir",
                           str(tmp_path / "data")]) == 0
    _run(source, "ALTER TABLE n MODIFY s VARCHAR(3)", session=("SET SESSION sql_mode = ''",))
    running = await start_service(config)
    try:
        await _exact(running, source, "n")
    finally:
        await running.stop()


async def test_verify_agrees_after_add_system_versioning(cdc: RunningService, source: Source):
    _run(source, "CREATE TABLE v (id INT PRIMARY KEY, x INT)",
         "INSERT INTO v VALUES (1, 1), (2, 2)",
         "ALTER TABLE v ADD SYSTEM VERSIONING", "UPDATE v SET x = 3 WHERE id = 1",
         session=("SET SESSION system_versioning_alter_history = KEEP",))
    await cdc.caught_up(source)
    await _verified(cdc, source, "v")


# -- quarantine and resync --------------------------------------------------------------


def _health(running: RunningService) -> dict[str, Any]:
    host, port = running.service.monitoring.address  # type: ignore[misc]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as answer:
            data: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        data = json.loads(error.read())
    return data


@pytest.fixture
def limited_source(source: Source) -> Any:
    """The source as a replication user who may read the test's table ``t`` but not
    ``hidden``: a repair of it cannot read it."""
    user = f"repl{os.getpid()}"
    _run(source, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE hidden (id INT PRIMARY KEY, v INT)")
    for host in ("127.0.0.1", "localhost"):
        source.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY 'pw'",
                       f"GRANT RELOAD, REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER "
                       f"ADMIN ON *.* TO '{user}'@'{host}'",
                       f"GRANT SELECT ON `{source.database}`.`t` TO '{user}'@'{host}'")
    yield user, source.server.url(user, "pw")
    for host in ("127.0.0.1", "localhost"):
        source.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")


async def test_a_table_that_cannot_be_read_is_quarantined_and_resynced(
        tmp_path, source: Source, users_file: str, limited_source: Any):
    user, url = limited_source
    db = source.database
    _run(source, "INSERT INTO t VALUES (1, 1)", "INSERT INTO hidden VALUES (1, 1), (2, 2)")
    running = await start_service(make_config(str(tmp_path / "data"), url, users_file))
    try:
        await running.caught_up(source)
        # rows rewritten without row events: the repair cannot SELECT hidden
        _run(source, "ALTER TABLE hidden ADD COLUMN c INT NOT NULL DEFAULT 7",
             "INSERT INTO hidden VALUES (3, 3, 3)", "INSERT INTO t VALUES (2, 2)")
        await running.caught_up(source)
        assert set(running.service.data.store.quarantined) == {TableName(db, "hidden")}
        await _exact(running, source, "t")  # every other table goes on
        health = await asyncio.to_thread(_health, running)
        assert health["status"] == "degraded" and \
            [q["table"] for q in health["quarantined"]] == ["hidden"]
        assert any("hidden is quarantined" in p for p in health["problems"])
        # its readers get what was stored, then the in-band stop
        client = await RawClient.connect(running.port)
        await client.login(dialect="EXACT")
        await client.send(f"REQUEST-DATA {db}.hidden\n".encode())
        lines = []
        while (line := await client.line()) and not line.startswith(b"ERR"):
            lines.append(json.loads(line))
        assert line.startswith(b"ERR QUARANTINED ") and b"cdcserver resync" in line
        assert await client.closed() == b""  # the server closed it
        assert [r["id"] for r in lines if "event_type" in r] == [1, 2]
        # once it can be read, the service resyncs it by itself
        source.execute(*(f"GRANT SELECT ON `{db}`.`hidden` TO '{user}'@'{host}'"
                         for host in ("127.0.0.1", "localhost")))

        async def released() -> bool:
            _run(source, "INSERT INTO t SELECT MAX(id) + 1, 0 FROM t")  # a transaction
            return not running.service.data.store.quarantined

        await eventually(released, bool, 90, "the resync")
        await _exact(running, source, "t", "hidden")
        assert running.service.replication.runner.repair_stats.resyncs
        assert not (await asyncio.to_thread(_health, running))["quarantined"]
    finally:
        await running.stop()


def _follow(port: int, table: str, received: list[Any], stop: Any) -> None:
    """The client library following a table (it retries a quarantined one)."""
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, retry_delays=(0.2, 0.5)) as client:
        for event in client.stream(table, idle_timeout=60):
            if isinstance(event, ChangeRecord):
                received.append(event)
            if stop.is_set():
                return


@pytest.mark.slow
async def test_quarantine_and_resync_survive_kill_9(tmp_path, source: Source, users_file: str,
                                                    limited_source: Any):
    user, url = limited_source
    db = source.database
    data_dir = str(tmp_path / "data")
    # one port across the restarts, for the client following the table through them
    args = chaos.service_args(url, data_dir, users_file, 6601)
    args[args.index("--listen") + 1] = f"127.0.0.1:{free_port()}"
    service = chaos.Service(args, str(tmp_path / "service.log"))
    conn = source.server.connect(db)
    try:
        _run(source, "INSERT INTO t VALUES (1, 1)", "INSERT INTO hidden VALUES (1, 1), (2, 2)")
        service.start()
        await asyncio.to_thread(service.wait_ready)
        _run(source, "ALTER TABLE hidden ADD COLUMN c INT NOT NULL DEFAULT 7",
             "INSERT INTO hidden VALUES (3, 3, 3)", "INSERT INTO t VALUES (2, 2)")

        async def quarantined() -> list[Any]:
            return list(await asyncio.to_thread(lambda: service.health()["quarantined"]))

        await eventually(quarantined, bool, 60, "the quarantine")
        checkpoint = os.path.join(data_dir, "state", "checkpoint.json")
        await eventually(lambda: asyncio.to_thread(ckpt.load, checkpoint),
                         lambda c: c is not None and TableName(db, "hidden") in c.quarantined,
                         30, "a checkpoint holding the quarantine")
        service.kill()  # kill -9 while quarantined: the checkpoint keeps it
        service.start()
        await asyncio.to_thread(service.wait_ready)
        assert [q["table"] for q in await quarantined()] == ["hidden"]
        assert "is quarantined since" in service.text()
        # a reader, through the library, gets what was stored and waits through it
        received: list[Any] = []
        stop = threading.Event()
        # (a daemon thread: a failing test must not leave it retrying, and hanging the exit)
        follower = threading.Thread(target=_follow, daemon=True,
                                    args=(service.port, f"{db}.hidden", received, stop))
        follower.start()
        await eventually(lambda: asyncio.sleep(0, len(received)), lambda n: n >= 2, 30,
                         "the records stored before the quarantine")
        # granted: the resync reads it, and waits for a transaction to release it in; a
        # kill -9 then (no checkpoint was written meanwhile) starts it again after the restart
        source.execute(*(f"GRANT SELECT ON `{db}`.`hidden` TO '{user}'@'{host}'"
                         for host in ("127.0.0.1", "localhost")))
        assert cdcserver_main(["resync", f"{db}.hidden", "--data-dir", data_dir,
                               "--wait", "0"]) == 0
        await eventually(lambda: asyncio.to_thread(service.text), lambda t: "resyncing" in t,
                         30, "the resync")
        service.kill()
        service.start()
        await asyncio.to_thread(service.wait_ready)

        async def released() -> bool:
            _run(source, "INSERT INTO t SELECT MAX(id) + 1, 0 FROM t")  # a transaction
            return not await quarantined()

        await eventually(released, bool, 90, "the resync after the restart")
        _run(source, "INSERT INTO hidden VALUES (4, 4, 4)")
        await eventually(lambda: asyncio.sleep(0, [e.values["id"] for e in received]),
                         lambda ids: 4 in ids, 60, "the stream after the resync")
        stop.set()
        _run(source, "INSERT INTO hidden VALUES (5, 5, 5)")  # wakes the follower to stop
        await asyncio.to_thread(follower.join, 30)
        assert not follower.is_alive()
        # the library's records rebuild the table (no duplicate, nothing lost), and so does
        # the raw stream
        rows: dict[int, dict[str, Any]] = {}
        for event in received:
            if event.event_type in ("insert", "update_after"):
                rows[event.values["id"]] = event.values
            else:
                rows.pop(event.values["id"], None)
        table = {r[0]: (r[1], r[2]) for r in source.query(f"SELECT id, v, c FROM `{db}`.hidden")}
        assert {k: (v["v"], v.get("c")) for k, v in rows.items() if k in table} == \
            {k: v for k, v in table.items() if k in rows}
        report = await asyncio.to_thread(verify_table, parse_source_url(source.url), data_dir,
                                         TableName(db, "hidden"))
        assert report.ok and report.duplicates == 0, "\n".join(report.lines())
        assert "resynced in" in service.text(since_start=False)
    finally:
        if service.exited() is None:
            assert service.stop() == 0
        conn.close()


async def _exact_after_meeting(tmp_path: Any, source: Source, users_file: str,
                               setup: tuple[str, ...], while_stopped: tuple[str, ...]) -> None:
    """``setup`` replicated; then ``while_stopped`` run with the service stopped, so that it
    meets them with the source far ahead (its repairs wait through all of them); every table
    then equals its raw JSON stream (chaos.differences, the independent oracle), and no
    record is untrue to the rows the stream held (an audit of every before-image)."""
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    _run(source, *setup)
    await running.caught_up(source)
    await running.stop()
    _run(source, *while_stopped,
         session=("SET SESSION system_versioning_alter_history = KEEP",))
    running = await start_service(config)
    try:
        await running.caught_up(source)
        conn = source.server.connect(source.database)
        try:
            audit = chaos.Outcome(seed=0)
            assert await chaos.differences(running.port, conn, source.database, USER,
                                           PASSWORD, audit) == {}
            assert not audit.inconsistencies, audit.inconsistency_examples
        finally:
            conn.close()
    finally:
        await running.stop()


async def test_a_repair_waiting_through_renames_keeps_the_rows_they_moved(
        tmp_path, source: Source, users_file: str):
    """Soak seed 20261134: rows inserted just before a swap, then ADD SYSTEM VERSIONING (a
    new primary key, id and row_end), then renames while that repair waited for its
    watermark. The view that followed the renames was dropped for its new key and built
    again from the store, which did not hold the renames yet: the repair never saw those
    rows, and their images without row_end stayed in the stream for good. Statements run
    while the service is stopped, so that it meets them with the source far ahead."""
    await _exact_after_meeting(
        tmp_path, source, users_file,
        ("CREATE TABLE a (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE b (id INT PRIMARY KEY, w VARCHAR(10))",
         "INSERT INTO a VALUES (1, 1), (2, 2)", "INSERT INTO b VALUES (1, 'x')"),
        ("TRUNCATE TABLE a", "INSERT INTO a VALUES (715, 7), (716, 8)",
         "RENAME TABLE a TO tmp, b TO a, tmp TO b",
         "ALTER TABLE b ADD COLUMN c INT, ALGORITHM=INSTANT",
         "ALTER TABLE b ADD SYSTEM VERSIONING", "INSERT INTO b VALUES (720, 9, 1)",
         "RENAME TABLE b TO b2", "RENAME TABLE b2 TO tmp, a TO b2, tmp TO a",
         "ALTER TABLE a ADD COLUMN d INT NOT NULL DEFAULT 3, ALGORITHM=INSTANT",
         "INSERT INTO a VALUES (721, 1, 2, 3)"))


@pytest.mark.parametrize("then", [
    ("RENAME TABLE a TO tmp, b TO a, tmp TO b",),
    ("RENAME TABLE a TO a3", "RENAME TABLE a3 TO tmp, b TO a3, tmp TO b"),
])
async def test_a_repair_read_under_a_swapped_name_keeps_history_rows_apart(
        tmp_path, source: Source, users_file: str, then: tuple[str, ...]):
    """Soak seed 20261147: a table versioned (its key id and row_end), a row updated (the
    row and its history row share an id), a narrowing MODIFY whose repair read the name
    after a swap had put an unversioned table under it. The view was keyed by that table's
    key (id alone): the row and its history row merged into one, the swap moved the merged
    view on, and the row's image without row_end stayed in the stream for good."""
    await _exact_after_meeting(
        tmp_path, source, users_file,
        ("CREATE TABLE a (id INT PRIMARY KEY, v INT, w VARCHAR(10))",
         "CREATE TABLE b (id INT PRIMARY KEY, v INT, w VARCHAR(10))",
         "INSERT INTO a VALUES (1, 1, 'abcdef'), (2, 2, 'x')",
         "INSERT INTO b VALUES (1, 5, 'y')"),
        ("ALTER TABLE a ADD SYSTEM VERSIONING", "UPDATE a SET v = v + 1 WHERE id = 1",
         "ALTER TABLE a MODIFY w VARCHAR(8)", *then))


async def test_repairs_after_column_renames_take_their_before_images_from_the_rows_held(
        cdc: RunningService, source: Source):
    """A repair's ``update_before``/``delete`` is the row a consumer holds (issue 50, item
    3): after columns were renamed or swapped, its values under their new names. The view
    a repair compares with used to keep the old names (folded from the store or kept up to
    date alike), so a repair's before-images had NULL where the renamed columns held values.
    The stream is audited as a consumer that checks every before-image would."""
    _run(source, "CREATE TABLE f (id INT PRIMARY KEY, a INT, b VARCHAR(10), c INT)",
         "CREATE TABLE tick (id INT AUTO_INCREMENT PRIMARY KEY)",
         "INSERT INTO f VALUES (1, 1, 'one', 10), (2, 2, 'two', 20)")
    for statement in (
            "ALTER TABLE f CHANGE a b2 INT, CHANGE b a VARCHAR(10)",  # renamed, not repaired
            "ALTER TABLE f ADD COLUMN n INT NOT NULL DEFAULT 7",  # a repair: the view folded
            "ALTER TABLE f CHANGE b2 b INT, CHANGE a b2 VARCHAR(10)",  # the view kept, renamed
            "ALTER TABLE f ADD COLUMN m INT NOT NULL DEFAULT 8",  # a repair from the kept view
            "UPDATE f SET c = c + 1"):
        _run(source, statement, "INSERT INTO tick VALUES ()")  # the repair rides on it
        await cdc.caught_up(source)
    [rebuilt] = await _exact(cdc, source, "f")
    assert sum(1 for r in rebuilt.records if "cdc:repair" in r) == 8, rebuilt.records
    assert not rebuilt.inconsistencies, rebuilt.examples


async def test_a_narrowing_alter_deletes_in_the_old_types_what_the_new_ones_render_otherwise(
        cdc: RunningService, source: Source):
    """Issue 50, item 4: after ``MODIFY d DECIMAL(10,1)`` the repair's ``update_before`` of a
    row the stream held as ``12.345`` showed ``12.3``, its new scale. The rows whose values
    the new types render otherwise are deleted in the old version, exactly as held, and the
    repair inserts them as the table has them; the others keep their update pairs."""
    _run(source, "CREATE TABLE n (id INT PRIMARY KEY, d DECIMAL(10,3), at DATETIME(3), "
                 "day DATE, s VARCHAR(20))",
         "CREATE TABLE tick (id INT AUTO_INCREMENT PRIMARY KEY)",
         "INSERT INTO n VALUES (1, 12.345, '2024-01-02 03:04:05.678', '2024-01-02', 'x'), "
         "(2, 1.5, NULL, NULL, 'y'), (3, NULL, NULL, NULL, 'zzzzzzzzzz')")
    await cdc.caught_up(source)
    for statement in ("ALTER TABLE n MODIFY d DECIMAL(10,1)",
                      "ALTER TABLE n MODIFY at DATETIME, MODIFY day DATETIME",
                      "ALTER TABLE n MODIFY s VARCHAR(5)"):
        _run(source, "SET SESSION sql_mode = ''", statement, "INSERT INTO tick VALUES ()")
        await cdc.caught_up(source)
    [rebuilt] = await _exact(cdc, source, "n")
    assert not rebuilt.inconsistencies, rebuilt.examples
    repairs = [(r["event_type"], r["id"]) for r in rebuilt.records if "cdc:repair" in r]
    assert repairs[:2] == [("delete", 1), ("insert", 1)], repairs  # 12.345 out, 12.3 in
    assert ("update_before", 3) in repairs  # a narrower VARCHAR renders 'zzzzzzzzzz' alike


@pytest.mark.parametrize("versioned", [False, True])
async def test_a_narrowing_alter_while_a_repair_waits_deletes_what_it_retypes_as_held(
        tmp_path, source: Source, users_file: str, versioned: bool):
    """Soak seed 92001: a DOUBLE went to FLOAT while a repair waited for its watermark (the
    service met the statements with the source far ahead). A FLOAT holds 78375862 as the
    float32 78375864, but "78375862" is also the shortest text that reads back as that
    float32, so the value was taken to render alike and its row stayed in the stream as
    held. The next update's before-image, and DROP SYSTEM VERSIONING's deletes, then showed
    78375864: rows no consumer held. Such rows now go out again in the new type."""
    create = "CREATE TABLE n (id INT PRIMARY KEY, f DOUBLE, v INT)" + \
        (" WITH SYSTEM VERSIONING" if versioned else "")
    await _exact_after_meeting(
        tmp_path, source, users_file,
        (create, "INSERT INTO n VALUES (1, 78375862, 0), (2, 0.5, 0), (3, 75633988, 0)"),
        ("ALTER TABLE n ADD COLUMN w INT NOT NULL DEFAULT 3",  # a repair, waiting from here
         "ALTER TABLE n MODIFY f FLOAT", "UPDATE n SET v = 1 WHERE id = 2",
         "ALTER TABLE n DROP SYSTEM VERSIONING" if versioned else
         "ALTER TABLE n MODIFY v BIGINT, MODIFY w DOUBLE",
         "UPDATE n SET v = 2 WHERE id = 1"))
