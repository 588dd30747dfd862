"""``cdcserver ctl`` against a real service's admin API, replicating the real MariaDB.

ctl's ``main`` runs in a worker thread (urllib blocks; the service runs in the test's loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from cdcserver.app.cli import main as cdcserver_main
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import USER, RawClient

pytestmark = pytest.mark.mariadb

ROWS = 1500  # a count the tables print with a thousands separator


@dataclass
class Admin:
    running: RunningService
    url: str
    token_file: str
    tmp: str

    async def ctl(self, capsys: pytest.CaptureFixture[str], *argv: str,
                  token_file: str | None = None, url: str | None = None
                  ) -> tuple[int, str, str]:
        """``cdcserver ctl --url URL --token-file FILE argv...``: (exit code, stdout, stderr)."""
        capsys.readouterr()
        code = await asyncio.to_thread(cdcserver_main, [
            "ctl", "--url", url or self.url, "--token-file", token_file or self.token_file,
            *argv])
        out, err = capsys.readouterr()
        return code, out, err


def _token_file(directory: str, name: str = "admin.token") -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
async def admin(tmp_path: os.PathLike[str], source: Source, users_file: str
                ) -> AsyncIterator[Admin]:
    tmp = os.fspath(tmp_path)
    token = _token_file(tmp)
    running = await start_service(make_config(
        os.path.join(tmp, "data"), source.url, users_file,
        admin={"listen": "127.0.0.1:0", "token_file": token}))
    try:
        assert running.service.admin.address is not None
        host, port = running.service.admin.address
        yield Admin(running, f"http://{host}:{port}", token, tmp)
    finally:
        if not running.task.done():
            await running.stop()


def _fill(source: Source) -> str:
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))",
                   f"INSERT INTO {table} VALUES " + ", ".join(
                       f"({i}, 'v{i}')" for i in range(1, ROWS + 1)))
    return f"{source.database}.t"


async def _streaming(running: RunningService, table: str) -> RawClient:
    """A logged-in client streaming ``table``, with its schema and first record read."""
    client = await RawClient.connect(running.port)
    await client.login()
    await client.send(f"REQUEST-DATA {table}\n".encode())
    assert "namespace" in (await client.json_line())  # the schema
    assert (await client.json_line())["id"] == 1
    return client


def _rows(table_text: str) -> list[list[str]]:
    """A printed table's lines, split at runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in table_text.splitlines() if line]


async def test_listings_as_tables_and_json(admin: Admin, source: Source, capsys):
    table = _fill(source)
    await admin.running.caught_up(source)
    client = await _streaming(admin.running, table)
    try:
        code, out, err = await admin.ctl(capsys, "replication")
        assert code == 0, err
        fields = dict(line.split(None, 1) for line in out.splitlines()
                      if not line.startswith(("Last commit", "Quarantined")))
        assert fields["State"].strip() == "replicating"
        assert fields["Position"].strip() == str(source.gtid_state())
        assert re.search(r"^Quarantined +none$", out, re.M)
        code, out, _ = await admin.ctl(capsys, "replication", "--json")
        document = json.loads(out)
        assert code == 0 and document["state"] == "replicating"
        assert document["position"] == str(source.gtid_state())

        code, out, err = await admin.ctl(capsys, "clients")
        assert code == 0, err
        rows = _rows(out)
        assert rows[0] == ["ID", "ADDRESS", "USER", "FORMAT", "READING", "POSITION", "BEHIND",
                           "RATE", "SINCE"]
        assert len(rows) == 2
        row = dict(zip(rows[0], rows[1], strict=True))
        assert row["USER"] == USER and row["READING"] == table
        assert row["FORMAT"].startswith("JSON")
        assert re.fullmatch(r"0-1-\d+ \(v1\)", row["POSITION"]), row
        assert re.fullmatch(r"[\d.]+ (B|KiB|MiB)/s", row["RATE"]), row
        code, out, _ = await admin.ctl(capsys, "--json", "clients")
        clients = json.loads(out)["clients"]
        assert code == 0 and [c["user"] for c in clients] == [USER]
        assert clients[0]["reading"] == table and clients[0]["kind"] == "stream"
        assert str(clients[0]["id"]) == row["ID"]

        code, out, err = await admin.ctl(capsys, "tables")
        assert code == 0, err
        rows = _rows(out)
        assert rows[0] == ["TABLE", "VERSIONS", "RECORDS", "SIZE", "LAST GTID", "STATE"]
        row = dict(zip(rows[0], next(r for r in rows if r[0] == table), strict=True))
        assert row["VERSIONS"] == "1" and row["RECORDS"] == f"{ROWS:,}" == "1,500"
        assert re.fullmatch(r"[\d.]+ KiB", row["SIZE"]), row
        assert row["LAST GTID"] == str(source.gtid_state()) and row["STATE"] == "ok"
        code, out, _ = await admin.ctl(capsys, "tables", "--json")
        tables = {t["table"]: t for t in json.loads(out)["tables"]}
        assert code == 0 and tables[table]["records"] == ROWS
        assert tables[table]["quarantined"] is None and tables[table]["clients"] == 1

        code, out, err = await admin.ctl(capsys, "reload-users")
        assert (code, out) == (0, "read the users file again: 1 user\n"), err
        code, out, _ = await admin.ctl(capsys, "reload-users", "--json")
        assert code == 0 and json.loads(out) == {"users": 1}
    finally:
        await client.close()


async def test_dump_with_progress_then_listed(admin: Admin, source: Source, capsys):
    table = _fill(source)
    await admin.running.caught_up(source)
    code, out, err = await admin.ctl(capsys, "dumps")
    assert code == 0 and out == "NAME  TABLE  SIZE  ROWS  GTID  READERS\n", err

    code, out, err = await admin.ctl(capsys, "dump", table, "--progress")
    assert code == 0, err
    name = out.strip()
    assert name.startswith(table + ".") and name.endswith(".dump"), out
    assert "100%" in err and "1.50k/1.50k" in err and "done" in err  # the bar, at its end

    code, out, err = await admin.ctl(capsys, "dumps")
    assert code == 0, err
    rows = _rows(out)
    assert rows[0] == ["NAME", "TABLE", "SIZE", "ROWS", "GTID", "READERS"]
    assert rows[1][:2] == [name, table] and rows[1][3] == "1,500" and rows[1][5] == "-"
    assert rows[1][4] == str(source.gtid_state())
    assert "Being taken" not in out
    code, out, _ = await admin.ctl(capsys, "dumps", "--json")
    document = json.loads(out)
    assert code == 0 and [d["name"] for d in document["dumps"]] == [name]
    assert document["dumps"][0]["rows"] == ROWS and document["taking"] == []

    # Without --progress: queued, and said so.
    code, out, err = await admin.ctl(capsys, "dump", table, "--json")
    assert code == 0 and json.loads(out)["queued"] == [table], err
    code, out, err = await admin.ctl(capsys, "dump", f"{source.database}.nosuch")
    assert code == 1 and out == ""
    assert err.startswith("cdcserver ctl: no table ") and "nosuch" in err


async def test_kick_ends_a_client_and_resync_of_a_whole_table_is_refused(
        admin: Admin, source: Source, capsys):
    table = _fill(source)
    await admin.running.caught_up(source)
    client = await _streaming(admin.running, table)
    code, out, _ = await admin.ctl(capsys, "clients", "--json")
    (listed,) = json.loads(out)["clients"]

    code, out, err = await admin.ctl(capsys, "kick", str(listed["id"]))
    assert (code, out) == (0, f"disconnected client {listed['id']}\n"), err
    rest = await client.closed()
    last = rest.splitlines()[-1]
    # (docs/admin.md writes the line "ERR FORBIDDEN: ..."; the wire's ERR lines have no colon)
    assert re.fullmatch(rb"ERR FORBIDDEN:? disconnected by an administrator", last), last
    code, out, err = await admin.ctl(capsys, "kick", str(listed["id"]))
    assert code == 1 and out == ""
    assert err == f"cdcserver ctl: no client {listed['id']} is connected (GET /api/v1/clients)\n"

    code, out, err = await admin.ctl(capsys, "resync", table)
    assert code == 1 and out == ""
    assert err == (f"cdcserver ctl: {table} is not quarantined: its stream is whole, there is "
                   "nothing to resync\n")
    code, out, err = await admin.ctl(capsys, "resync", f"{source.database}.nosuch")
    assert code == 1 and "stores no table" in err


async def test_refusals_and_where_the_address_and_token_come_from(
        admin: Admin, source: Source, capsys, monkeypatch: pytest.MonkeyPatch):
    wrong = _token_file(admin.tmp, "wrong.token")
    code, out, err = await admin.ctl(capsys, "tables", token_file=wrong)
    assert code == 1 and out == ""
    assert err.startswith(f"cdcserver ctl: the admin API at {admin.url} refused the token read "
                          f"from --token-file {wrong} ("), err

    # The token in the environment; the address and its scheme from a configuration.
    with open(admin.token_file) as f:
        token = f.read().strip()
    _, port = admin.running.service.admin.address  # type: ignore[misc]
    config = os.path.join(admin.tmp, "cdcserver.toml")
    with open(config, "w") as f:
        f.write(f'[admin]\nlisten = "0.0.0.0:{port}"\ntoken_file = "{wrong}"\n')
    monkeypatch.setenv("CDCSERVER_ADMIN_TOKEN", token)
    capsys.readouterr()
    code = await asyncio.to_thread(cdcserver_main, ["ctl", "--config", config, "replication",
                                                    "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["state"] in ("starting", "connecting", "replicating"), err
    monkeypatch.setenv("CDCSERVER_ADMIN_TOKEN", "not-the-token-at-all")
    code = await asyncio.to_thread(cdcserver_main, ["ctl", "--config", config, "clients"])
    out, err = capsys.readouterr()
    assert code == 1 and "refused the token in $CDCSERVER_ADMIN_TOKEN" in err
    monkeypatch.delenv("CDCSERVER_ADMIN_TOKEN")
    code = await asyncio.to_thread(cdcserver_main, ["ctl", "--config", config, "clients"])
    out, err = capsys.readouterr()
    assert code == 1 and f"refused the token read from {wrong} ([admin] token_file of " \
                          f"{config})" in err

    # Nothing listens.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    nowhere = f"http://127.0.0.1:{free}"
    code, out, err = await admin.ctl(capsys, "clients", url=nowhere)
    assert code == 1 and out == ""
    assert err.startswith(f"cdcserver ctl: nothing answers at {nowhere} (connection refused; "
                          "address from --url)"), err
    assert "--url" in err and "[admin] listen" in err
