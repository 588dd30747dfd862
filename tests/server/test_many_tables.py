"""Many tables under a small descriptor limit: a service process limited to 200 open files
(``RLIMIT_NOFILE``, as a systemd unit may set) writes 400 tables, one transaction per table
and one transaction across all of them, without failing, with its default configuration:
the store keeps at most its share of the limit open (``cdcserver/app/descriptors.py``; not
``[store] max_open_files``' 256) and reopens the others when they are written. Every table's
stream still equals the table."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys

import pytest

from cdcserver.app.embedded import free_port
from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import GtidState
from cdcserver.store.reader import wait_for_checkpoint
from tests.conftest import Source
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb

TABLES = 400
LIMIT = 200


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


async def test_four_hundred_tables_under_a_limit_of_two_hundred_files(
        tmp_path: os.PathLike[str], source: Source, users_file: str) -> None:
    db = source.database
    source.execute(*(f"CREATE TABLE `{db}`.t{i} (id INT PRIMARY KEY, v INT)"
                     for i in range(TABLES)))
    data_dir = os.path.join(tmp_path, "data")
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    log = open(os.path.join(tmp_path, "service.log"), "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [exe, "run", "--source", source.url, "--data-dir", data_dir, "--listen",
         f"127.0.0.1:{port}", "--metrics-listen", "", "--users-file", users_file,
         "--server-id", "6301", "--start-gtid", "oldest", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_limit_files)
    try:
        source.execute(*(f"INSERT INTO `{db}`.t{i} VALUES (1, {i})" for i in range(TABLES)))
        conn = source.server.connect(db)
        try:
            with conn.cursor() as cur:  # one transaction across every table
                cur.execute("BEGIN")
                for i in range(TABLES):
                    cur.execute(f"INSERT INTO t{i} VALUES (2, {i})")
                    cur.execute(f"UPDATE t{i} SET v = v + 1 WHERE id = 1")
                cur.execute("COMMIT")
        finally:
            conn.close()
        source.execute(*(f"DELETE FROM `{db}`.t{i} WHERE id = 2" for i in range(0, TABLES, 3)))
        file, pos = source.query("SHOW MASTER STATUS")[0][:2]
        state = GtidState.parse(str(source.gtid_state()))
        for _ in range(120):  # until the store has it all, failing as soon as the process dies
            with open(os.path.join(tmp_path, "service.log"), encoding="utf-8") as f:
                assert process.poll() is None, f.read()
            try:
                await asyncio.to_thread(wait_for_checkpoint, data_dir, str(file), int(pos), 1,
                                        state)
                break
            except StoreError:
                continue
        descriptors = len(os.listdir(f"/proc/{process.pid}/fd"))
        assert descriptors < LIMIT // 2, descriptors
        conn = source.server.connect()
        try:
            for i in (0, 1, 199, 398, 399):
                await assert_stream_equals_table(port, conn, db, f"t{i}", user=USER,
                                                 password=PASSWORD, quiet=0.5)
        finally:
            conn.close()
    finally:
        process.kill()
        process.wait(30)
        log.close()
