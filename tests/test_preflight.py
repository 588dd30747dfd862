"""Preflight (`cdcserver check`) against the real MariaDB: what it finds, and that the SQL it
prints fixes what it found. Settings changed here are global: each test restores them."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest

from cdcserver.cli import main as cdcserver_main
from cdcserver.config import parse_source_url
from cdcserver.embedded import EmbeddedMariaDB
from cdcserver.errors import SourceError
from cdcserver.preflight import Severity, check_source
from tests.conftest import Source, make_config, start_service

pytestmark = pytest.mark.mariadb


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
