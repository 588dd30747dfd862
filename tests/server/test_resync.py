"""A purged binlog: the source no longer holds what the stream needs next. The service says
so once, with the way out, keeps serving what it stored (``/health`` degraded), and
``cdcserver resync`` is that way out: every table gets a resync version (a client following
it sees why), each is dumped, and the stream continues from the source's position then. The
oracle is the table: the new dump plus the stream after it equals ``SELECT``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys

import pytest

from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.ops.metrics import health
from tests.conftest import Source, make_config, start_service
from tests.helpers import PASSWORD, USER, until, wait_until
from tests.oracle import read_stream

pytestmark = pytest.mark.mariadb


def _dumped(path: str) -> dict[int, int]:
    rows: dict[int, int] = {}
    with open(path, "rb") as f:
        f.readline()
        for line in f:
            for row in json.loads(line)["rows"]:
                key, amount = (int(base64.b64decode(v)) for v in row)
                rows[key] = amount
    return rows


async def test_a_purged_binlog_stops_replication_loudly_and_resync_is_the_way_out(
        tmp_path: os.PathLike[str], source: Source, users_file: str) -> None:
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.orders (id INT PRIMARY KEY, amount INT)",
                   f"CREATE TABLE `{db}`.gone (id INT PRIMARY KEY)",
                   f"INSERT INTO `{db}`.orders VALUES (1, 10), (2, 20), (3, 30)",
                   f"INSERT INTO `{db}`.gone VALUES (1)")
    data_dir = os.path.join(tmp_path, "data")
    config = make_config(data_dir, source.url, users_file)
    cdc = await start_service(config)
    await cdc.caught_up(source)
    await cdc.stop()

    # while the service is stopped: changes, then their binlog is purged
    source.execute(f"UPDATE `{db}`.orders SET amount = 21 WHERE id = 2",
                   f"DELETE FROM `{db}`.orders WHERE id = 3",
                   f"INSERT INTO `{db}`.orders VALUES (4, 40)", f"DROP TABLE `{db}`.gone",
                   f"CREATE TABLE `{db}`.born (id INT PRIMARY KEY, amount INT)",
                   f"INSERT INTO `{db}`.born VALUES (7, 70), (8, 80)",
                   "FLUSH BINARY LOGS")
    newest = source.query("SHOW MASTER STATUS")[0][0]

    def purged() -> bool:
        # MariaDB keeps a binlog until its binlog checkpoint (InnoDB has the transactions
        # durable); purging again until it goes
        source.execute(f"PURGE BINARY LOGS TO '{newest}'")
        return [row[0] for row in source.query("SHOW BINARY LOGS")] == [newest]

    wait_until(purged, 30, "the old binlog purged")

    cdc = await start_service(config)
    try:
        def problems() -> list[str]:
            return health(cdc.service.stats(), 60)[1]["problems"]

        await until(lambda: any("purged" in text for text in problems()), timeout=60)
        (problem,) = problems()
        assert "cdcserver resync" in problem and "no longer holds the binlog" in problem
        assert not cdc.task.done()  # it serves what it stored meanwhile
        lines = await read_stream(cdc.port, f"{db}.orders", user=USER, password=PASSWORD)
        assert len([line for line in lines if "fields" not in line]) == 3
    finally:
        await cdc.stop()

    command = [os.path.join(os.path.dirname(sys.executable), "cdcserver"), "resync",
               "--source", source.url, "--data-dir", data_dir, "--server-id",
               str(config.source.server_id)]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True,
                                   timeout=120)
    assert done.returncode == 0, done.stderr
    assert "purged" in done.stdout and "1 dropped meanwhile" in done.stdout, done.stdout
    again = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True,
                                    timeout=120)
    assert again.returncode != 0 and "nothing was lost" in again.stderr, again.stderr

    cdc = await start_service(config)
    try:
        source.execute(f"UPDATE `{db}`.orders SET amount = 41 WHERE id = 4",
                       f"INSERT INTO `{db}`.orders VALUES (5, 50)")
        await cdc.caught_up(source)
        # a client that follows the table from its start sees the resync version and why
        lines = await read_stream(cdc.port, f"{db}.orders", user=USER, password=PASSWORD)
        schemas = [line for line in lines if "fields" in line]
        assert schemas[-1]["ddl"]["kind"] == "resync", schemas[-1]
        assert "purged" in schemas[-1]["ddl"]["note"]
        gone = await read_stream(cdc.port, f"{db}.gone", user=USER, password=PASSWORD)
        assert [line["ddl"]["kind"] for line in gone if "fields" in line][-1] == "drop"
        # a table created in the gap: never in the stream, now with a version and a dump
        born = await read_stream(cdc.port, f"{db}.born", user=USER, password=PASSWORD)
        assert [line["ddl"]["kind"] for line in born if "fields" in line] == ["resync"]
        (first,) = files.list_dumps(data_dir, TableName(db, "born"))
        assert _dumped(first.path) == {7: 70, 8: 80}
        # the dump resync took, plus the stream after it, is the table
        (dump,) = files.list_dumps(data_dir, TableName(db, "orders"))
        image = _dumped(dump.path)
        assert image == {1: 10, 2: 21, 4: 40}
        after = await read_stream(cdc.port, f"{db}.orders", user=USER, password=PASSWORD,
                                  request=f"REQUEST-DATA {db}.orders AFTER "
                                          f"{dump.header.gtid}")
        for line in after:
            if "fields" in line:
                continue
            if line["event_type"] in ("insert", "update_after"):
                image[line["id"]] = line["amount"]
            else:
                image.pop(line["id"], None)
        assert image == dict(source.query(f"SELECT id, amount FROM `{db}`.orders"))
    finally:
        await cdc.stop()
