"""Preflight (`cdcserver check`) against the real MariaDB: what it finds, and that the SQL it
prints fixes what it found. Settings changed here are global: each test restores them."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cdcserver.app.cli import main as cdcserver_main
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import parse_source_url
from cdcserver.core.errors import SourceError
from cdcserver.replication.preflight import Severity, check_source
from tests.conftest import Source, make_config, start_service

pytestmark = pytest.mark.mariadb


def cdcserver(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command, as an operator runs it."""
    command = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


@contextlib.contextmanager
def global_setting(server: EmbeddedMariaDB, name: str, value: str) -> Iterator[None]:
    def literal(v: object) -> str:
        return str(v) if str(v).isdigit() else f"'{v}'"

    old = server.query(f"SELECT @@GLOBAL.{name}")[0][0]
    server.execute(f"SET GLOBAL {name} = {literal(value)}")
    try:
        yield
    finally:
        server.execute(f"SET GLOBAL {name} = {literal(old)}")


def _severities(url: str, server_id: int | None = None) -> dict[str, Severity]:
    report = check_source(parse_source_url(url), server_id)
    return {f.check: f.severity for f in report.findings}


def _fixes(output: str) -> list[str]:
    """The SQL statements a report prints."""
    return [m[1] for m in re.finditer(r"^\s+((?:GRANT|SET GLOBAL) [^;]+);", output, re.M)]


def test_a_ready_source_has_no_fatal_finding(source: Source):
    found = _severities(source.url, 4321)
    assert Severity.FATAL not in found.values()
    for check in ("binary log", "binlog_format", "binlog_row_image", "binlog_row_metadata",
                  "privilege REPLICATION SLAVE", "privilege BINLOG MONITOR", "server_id"):
        assert found[check] == Severity.OK, check


def test_missing_privileges_are_fatal_and_the_printed_grants_fix_them(source: Source, capsys):
    server = source.server
    server.execute("DROP USER IF EXISTS 'weak'@'localhost'", "DROP USER IF EXISTS "
                   "'weak'@'127.0.0.1'")
    for host in ("localhost", "127.0.0.1"):
        server.execute(f"CREATE USER 'weak'@'{host}' IDENTIFIED BY 'pw'")
    try:
        url = server.url("weak", "pw")
        assert cdcserver_main(["check", "--source", url]) == 1
        output = capsys.readouterr().out
        assert "FATAL   privilege REPLICATION SLAVE" in output
        assert "not ready" in output and "pw" not in output  # no password in the report
        fixes = _fixes(output)
        assert "GRANT REPLICATION SLAVE ON *.* TO 'weak'@'127.0.0.1'" in fixes
        assert "GRANT BINLOG MONITOR ON *.* TO 'weak'@'127.0.0.1'" in fixes
        server.execute(*fixes)
        assert cdcserver_main(["check", "--source", url]) == 0
        assert "ready" in capsys.readouterr().out
    finally:
        server.execute("DROP USER 'weak'@'localhost'", "DROP USER 'weak'@'127.0.0.1'")


def test_statement_format_is_fatal_the_fix_works_and_run_refuses(source: Source, capsys):
    with global_setting(source.server, "binlog_format", "STATEMENT"):
        assert cdcserver_main(["check", "--source", source.url]) == 1
        output = capsys.readouterr().out
        assert re.search(r"FATAL +binlog_format: binlog_format is STATEMENT", output)
        fixes = _fixes(output)
        assert fixes == ["SET GLOBAL binlog_format = 'ROW'"]
        source.server.execute(*fixes)
        assert _severities(source.url)["binlog_format"] == Severity.OK


async def test_run_refuses_to_start_with_the_same_message(source: Source, users_file: str,
                                                          tmp_path):
    with global_setting(source.server, "binlog_row_image", "MINIMAL"):
        config = make_config(str(tmp_path / "data"), source.url, users_file)
        running = await start_service(config)  # the listener is up; replication is not
        try:
            with pytest.raises(SourceError, match=r"(?s)cannot be captured.*binlog_row_image "
                               r"is MINIMAL.*SET GLOBAL binlog_row_image = 'FULL'"):
                await running.replicating()
        finally:
            if not running.task.done():
                await running.stop()


def test_short_retention_and_the_services_own_server_id(source: Source):
    source_id = int(source.query("SELECT @@GLOBAL.server_id")[0][0])
    with global_setting(source.server, "binlog_expire_logs_seconds", "3600"):
        found = _severities(source.url, source_id)
    assert found["binlog retention"] == Severity.WARNING
    assert found["server_id"] == Severity.FATAL


@contextlib.contextmanager
def account(server: EmbeddedMariaDB, name: str, *grants: str, role: str | None = None
            ) -> Iterator[str]:
    """A real user (at every host the service may connect from) given ``grants`` (``{u}``
    is the user), and optionally ``role``'s grants through a default role; its URL."""
    hosts = ("localhost", "127.0.0.1")
    drop = [f"DROP USER IF EXISTS '{name}'@'{h}'" for h in hosts]
    if role:
        drop.append(f"DROP ROLE IF EXISTS {role}")
    server.execute(*drop)
    try:
        if role:
            server.execute(f"CREATE ROLE {role}")
        for host in hosts:
            user = f"'{name}'@'{host}'"
            server.execute(f"CREATE USER {user} IDENTIFIED BY 'pw'",
                           *(g.format(u=user) for g in grants))
        yield server.url(name, "pw")
    finally:
        server.execute(*drop)


def test_select_granted_with_other_privileges_or_through_a_role_is_no_warning(source: Source):
    """SHOW GRANTS lists SELECT among others ("GRANT SELECT, REPLICATION SLAVE, BINLOG
    MONITOR ON *.*"), or on the current role's line: either way the account has it."""
    server = source.server
    together = ("GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {u}",)
    with account(server, "together", *together) as url:
        found = _severities(url)
        assert found["privilege SELECT"] == Severity.OK
        assert found["privilege REPLICATION SLAVE"] == Severity.OK
    last = ("GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO {u}",)
    with account(server, "last", *last) as url:
        assert _severities(url)["privilege SELECT"] == Severity.OK
    by_role = ("GRANT SELECT ON *.* TO reader", "GRANT REPLICATION SLAVE ON *.* TO {u}",
               "GRANT reader TO {u}", "SET DEFAULT ROLE reader FOR {u}")
    with account(server, "by_role", *by_role, role="reader") as url:
        assert _severities(url)["privilege SELECT"] == Severity.OK


def test_select_really_missing_is_still_a_warning(source: Source):
    """SELECT on one database, on a column, or through a role that is not enabled is not
    SELECT on *.*; REPLICATION SLAVE ADMIN is not REPLICATION SLAVE."""
    server = source.server
    db = source.database
    server.execute(f"CREATE TABLE `{db}`.t (a INT, b INT)")
    partial = (f"GRANT SELECT ON `{db}`.* TO {{u}}", f"GRANT SELECT (a, b) ON `{db}`.t TO {{u}}",
               "GRANT REPLICATION SLAVE ADMIN, BINLOG MONITOR ON *.* TO {u}")
    with account(server, "partial", *partial) as url:
        report = check_source(parse_source_url(url))
        findings = {f.check: f for f in report.findings}
        select = findings["privilege SELECT"]
        assert select.severity == Severity.WARNING
        assert "has no SELECT on *.* (only on `" + db + "`.*)" in select.detail
        assert findings["privilege REPLICATION SLAVE"].severity == Severity.FATAL
    idle_role = ("GRANT SELECT ON *.* TO idle", "GRANT REPLICATION SLAVE ON *.* TO {u}",
                 "GRANT idle TO {u}")
    with account(server, "idle_role", *idle_role, role="idle") as url:
        assert _severities(url)["privilege SELECT"] == Severity.WARNING


@pytest.fixture(scope="module")
def without_binlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedMariaDB]:
    """A second private server started with --skip-log-bin, as a stock MariaDB runs."""
    server = EmbeddedMariaDB(str(tmp_path_factory.mktemp("nobinlog")), port=0, server_id=71,
                             extra_args=["--skip-log-bin"])
    server.start()
    yield server
    server.stop()


def test_check_reports_a_server_without_binlog_with_the_settings_to_add(
        without_binlog: EmbeddedMariaDB):
    checked = cdcserver("check", "--source", without_binlog.url())
    assert checked.returncode == 1, checked.stderr
    assert "Traceback" not in checked.stderr, checked.stderr
    assert re.search(r"^FATAL +binary log: log_bin is OFF$", checked.stdout, re.M)
    fix = [line.strip() for line in checked.stdout.splitlines()]
    for setting in ("log_bin = mysql-bin", "binlog_format = ROW", "binlog_row_image = FULL"):
        assert setting in fix, checked.stdout
    assert re.search(r"^OK +privilege BINLOG MONITOR", checked.stdout, re.M)
    assert checked.stdout.rstrip().endswith("not ready: fix the fatal findings above")


def test_run_refuses_a_server_without_binlog_in_one_message(without_binlog: EmbeddedMariaDB,
                                                            users_file: str, tmp_path):
    ran = cdcserver("run", "--source", without_binlog.url(), "--data-dir", str(tmp_path / "d"),
                    "--users-file", users_file, "--listen", "127.0.0.1:0",
                    "--metrics-listen", "")
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr, ran.stderr
    assert "the source cannot be captured" in ran.stderr
    assert "binary log: log_bin is OFF" in ran.stderr and "log_bin = mysql-bin" in ran.stderr
