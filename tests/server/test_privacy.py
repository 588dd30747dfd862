"""What the service keeps to itself (issue 36, items 1 and 5): the system schemas, the password
tables above all, and the files it writes.

A CDC user without a table list could send ``START-DUMP mysql.*`` and ``REQUEST-DUMP
mysql.global_priv`` and read every account's password hash; the dump was written 0644, the
data directory 0755, and ``cdcserver users add`` wrote the users file 0644 before making it
0600. Now the system schemas are captured only when named in ``[capture] system_tables``, the
password tables never, and what the service writes is its user's (0600, 0700).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from cdcserver.app.cli import main as cdcserver_main
from cdcserver.core import durable
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.config import parse_source_url
from cdcserver.core.errors import SourceError
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import dump_tables
from cdcserver.protocol.users import UsersFile
from tests.conftest import RunningService, Source
from tests.helpers import files_holding, reply_to

pytestmark = pytest.mark.mariadb


def test_the_filter_keeps_system_schemas_out_unless_named_and_the_password_tables_always():
    default = CaptureFilter()
    for database, table in (("mysql", "global_priv"), ("mysql", "user"), ("mysql", "db"),
                            ("MySQL", "Global_Priv"), ("sys", "x"), ("performance_schema", "t"),
                            ("information_schema", "TABLES")):
        assert not default.captures(database, table), (database, table)
    assert default.captures("shop", "orders") and default.captures("mysqlx", "t")
    named = CaptureFilter.parse("mysql.time_zone_name, mysql.global_priv,mysql.user")
    assert named.captures("mysql", "time_zone_name")
    assert not named.captures("mysql", "global_priv") and not named.captures("mysql", "user")
    assert not named.captures("mysql", "db")


async def test_no_client_reads_or_dumps_the_password_tables(cdc: RunningService,
                                                           source: Source):
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.t VALUES (1)",
                   "CREATE USER IF NOT EXISTS 'victim'@'%' IDENTIFIED BY 'hunter2'")
    await cdc.caught_up(source)
    for command in ("REQUEST-DATA mysql.global_priv", "REQUEST-DATA mysql.user",
                    "REQUEST-DUMP mysql.global_priv", "START-DUMP mysql.global_priv",
                    "QUERY-RANGE mysql.global_priv LIMIT 5"):
        reply = await reply_to(cdc.port, command)
        assert reply.startswith(b"ERR FORBIDDEN mysql.") and b"not captured" in reply, reply
    reply = await reply_to(cdc.port, "START-DUMP mysql.*")
    assert reply.startswith(b"ERR NO-FILE no table you may read"), reply
    listed = json.loads(await reply_to(cdc.port, "LIST-TABLES"))["tables"]
    assert {t["database"] for t in listed} == {source.database}
    # nothing of mysql.* was stored, though the CREATE USER changed mysql.global_priv
    stored = {t.database for t in cdc.service.data.catalog.tables}
    assert "mysql" not in stored
    data_dir = cdc.service.config.store.data_dir
    with pytest.raises(SourceError, match="not captured"):
        dump_tables(parse_source_url(source.url), data_dir, [TableName("mysql", "global_priv")])
    assert cdcserver_main(["dump", "mysql.global_priv", "--source", source.url, "--data-dir",
                           data_dir]) == 1
    assert files_holding(data_dir, b"global_priv") == []
    assert files_holding(data_dir, b"victim") == []
    source.execute("DROP USER IF EXISTS 'victim'@'%'")


async def test_the_data_directory_and_its_files_are_private(cdc: RunningService,
                                                           source: Source):
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.t VALUES (1)")
    await cdc.caught_up(source)
    data_dir = cdc.service.config.store.data_dir
    await asyncio.to_thread(dump_tables, parse_source_url(source.url), data_dir,
                            [TableName(source.database, "t")])
    await cdc.service.data.store.flush()
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
    seen = 0
    for dirpath, dirnames, names in os.walk(data_dir):
        for name in dirnames:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) & 0o077 == 0, name
        for name in names:
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
            assert mode & 0o077 == 0, (name, oct(mode))
            seen += 1
    assert seen > 5  # the version files, the index, the checkpoint, the dump...


def test_the_users_file_is_never_readable_by_others(tmp_path, monkeypatch):
    """The temporary file is created 0600 before its first byte (os.replace then moves it)."""
    modes = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "replace", replace)
    os.umask(0o022)  # as a shell has it: the users file must not depend on it
    path = str(tmp_path / "cdcusers")
    UsersFile(path).add("alice", "pw")
    UsersFile(path).add("bob", "pw2")
    assert modes == [0o600, 0o600]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
