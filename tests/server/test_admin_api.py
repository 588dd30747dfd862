"""The admin API (docs/admin.md) on a real service replicating the real MariaDB, with real CDC
clients connected: every endpoint, the token, and what each action does to the clients."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from cdcserver.core.errors import ConfigError
from cdcserver.protocol.users import UsersFile
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, eventually
from tests.server.test_migrations import limited_source  # noqa: F401 - a fixture

pytestmark = pytest.mark.mariadb

TOKEN = "s3cret-admin-token-0123456789"


def token_file(directory: str, text: str = TOKEN, mode: int = 0o600) -> str:
    path = os.path.join(directory, "admin.token")
    with open(path, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)
    return path


class Api:
    def __init__(self, running: RunningService, session: aiohttp.ClientSession) -> None:
        host, port = running.service.admin.address  # type: ignore[misc]
        self.base = f"http://{host}:{port}"
        self.session = session

    async def call(self, method: str, path: str, token: str | None = TOKEN,
                   body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self.session.request(method, self.base + path, headers=headers,
                                        json=body) as response:
            data = await response.json() if response.content_type == "application/json" \
                else await response.text()
            return response.status, data

    async def get(self, path: str) -> Any:
        status, data = await self.call("GET", path)
        assert status == 200, data
        return data


@pytest.fixture
async def admin(tmp_path: os.PathLike[str], source: Source, users_file: str
                ) -> AsyncIterator[tuple[RunningService, Api]]:
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         admin={"listen": "127.0.0.1:0",
                                "token_file": token_file(str(tmp_path))})
    running = await start_service(config)
    async with aiohttp.ClientSession() as session:
        yield running, Api(running, session)
    if not running.task.done():
        await running.stop()


def run_sql(source: Source, *statements: str) -> None:
    source.execute(f"USE `{source.database}`", *statements)


async def streaming_client(running: RunningService, source: Source, table: str
                           ) -> RawClient:
    client = await RawClient.connect(running.port)
    await client.login("JSON")
    await client.send(f"REQUEST-DATA {source.database}.{table}\n".encode())
    await client.json_line()  # the schema
    return client


async def test_every_endpoint_needs_the_token(admin: tuple[RunningService, Api]) -> None:
    _, api = admin
    calls = [("GET", "/api/v1/replication"), ("GET", "/api/v1/clients"),
             ("GET", "/api/v1/tables"), ("GET", "/api/v1/dumps"),
             ("POST", "/api/v1/dumps"), ("POST", "/api/v1/tables/a.b/resync"),
             ("DELETE", "/api/v1/clients/1"), ("POST", "/api/v1/users/reload")]
    tries = [(method, path, None) for method, path in calls] + \
        [("GET", "/api/v1/clients", t) for t in ("wrong-token-wrong-token", TOKEN + "x")]
    for method, path, token in tries:  # ten: an address's budget of wrong tokens a minute
        status, data = await api.call(method, path, token=token)
        assert status == 401, (method, path, token, data)
        assert "admin token" in data["error"]
    # past it, the address is answered 429 without its token being compared, the right one
    # too, for the rest of the minute
    for token in (TOKEN[:-1], TOKEN):
        async with api.session.get(api.base + "/api/v1/clients",
                                   headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 429 and 50 <= int(response.headers["Retry-After"]) <= 60
            assert "too many requests with a wrong token" in (await response.json())["error"]
    # the probes and the console's files stay open
    for path in ("/live", "/console/", "/console/console.js"):
        async with api.session.get(api.base + path) as response:
            assert response.status in (200, 503), path
            if path.startswith("/console"):
                assert response.status == 200
                assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    async with api.session.get(api.base + "/", allow_redirects=False) as response:
        assert response.status == 302 and response.headers["Location"] == "/console/"


async def test_a_token_file_others_can_read_stops_the_start(
        tmp_path: os.PathLike[str], source: Source, users_file: str) -> None:
    for text, mode, expected in ((TOKEN, 0o644, "other users"),
                                 ("short", 0o600, "at least 16"),
                                 ("two words here, too many", 0o600, "printable")):
        path = token_file(str(tmp_path), text, mode)
        config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                             admin={"listen": "127.0.0.1:0", "token_file": path})
        with pytest.raises(ConfigError, match=expected):
            running = await start_service(config)
            await running.stop()


async def test_replication_tables_and_clients(admin: tuple[RunningService, Api],
                                              source: Source) -> None:
    running, api = admin
    run_sql(source, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))",
                   "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                   "UPDATE t SET v = 'z' WHERE id = 2")
    await running.caught_up(source)
    replication = await api.get("/api/v1/replication")
    assert replication["state"] == "replicating"
    assert replication["position"] == str(source.gtid_state())
    assert replication["quarantined"] == []

    tables = {t["table"]: t for t in (await api.get("/api/v1/tables"))["tables"]}
    t = tables[f"{source.database}.t"]
    assert t["records"] == 5  # three inserts, an update's before and after
    assert [v["version"] for v in t["versions"]] == [1]
    assert t["bytes"] == t["versions"][0]["bytes"] > 0
    assert t["last_gtid"] == str(source.gtid_state()).split(",")[0]
    assert t["quarantined"] is None and t["clients"] == 0

    client = await streaming_client(running, source, "t")
    for _ in range(5):
        await client.json_line()
    clients = await eventually(lambda: api.get("/api/v1/clients"),
                               lambda d: d["clients"] and d["clients"][0]["position"])
    [seen] = clients["clients"]
    assert seen["user"] == USER and seen["uuid"] == "test-client"
    assert seen["format"] == "JSON" and seen["phase"] == "streaming"
    assert seen["reading"] == f"{source.database}.t" and seen["kind"] == "stream"
    assert seen["position"]["version"] == 1
    assert seen["position"]["gtid"] == t["last_gtid"]
    assert seen["behind"] == {"bytes": 0, "seconds": 0.0}
    assert seen["records_sent"] == 5 and seen["bytes_sent"] > 0
    tables = {t["table"]: t for t in (await api.get("/api/v1/tables"))["tables"]}
    assert tables[f"{source.database}.t"]["clients"] == 1

    # a commit reaches the client, and its position follows
    run_sql(source, "INSERT INTO t VALUES (4, 'd')")
    await client.json_line()
    await running.caught_up(source)
    clients = await eventually(
        lambda: api.get("/api/v1/clients"),
        lambda d: d["clients"][0]["position"]["gtid"] == str(source.gtid_state()))
    assert clients["clients"][0]["records_sent"] == 6
    await client.close()


async def test_kick_ends_only_that_client(admin: tuple[RunningService, Api],
                                          source: Source) -> None:
    running, api = admin
    run_sql(source, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    await running.caught_up(source)
    first = await streaming_client(running, source, "t")
    second = await streaming_client(running, source, "t")
    clients = (await api.get("/api/v1/clients"))["clients"]
    assert len(clients) == 2
    kicked = clients[0]["id"]
    status, data = await api.call("DELETE", f"/api/v1/clients/{kicked}")
    assert (status, data) == (200, {"disconnected": kicked})
    rest = await first.closed()
    assert rest.endswith(b"disconnected by an administrator\n"), rest
    left = await eventually(lambda: api.get("/api/v1/clients"),
                            lambda d: len(d["clients"]) == 1)
    assert left["clients"][0]["id"] != kicked
    run_sql(source, "INSERT INTO t VALUES (2)")
    assert (await second.json_line())["id"] == 1
    assert (await second.json_line())["id"] == 2  # the other one streams on
    assert (await api.call("DELETE", f"/api/v1/clients/{kicked}"))[0] == 404
    status, data = await api.call("DELETE", "/api/v1/clients/one")
    assert status == 400 and "number" in data["error"]
    status, data = await api.call("DELETE", "/api/v1/clients/" + "7" * 5000)  # past int()
    assert status == 404 and "no client 777" in data["error"]
    await second.close()


async def test_a_dump_taken_through_the_api(admin: tuple[RunningService, Api],
                                            source: Source) -> None:
    running, api = admin
    run_sql(source, "CREATE TABLE d (id INT PRIMARY KEY, v TEXT)",
                   "INSERT INTO d SELECT seq, REPEAT('x', 50) FROM seq_1_to_2000")
    await running.caught_up(source)
    status, data = await api.call("POST", "/api/v1/dumps",
                                  body={"table": f"{source.database}.d"})
    assert status == 202 and data["queued"] == [f"{source.database}.d"], data
    dumps = await eventually(lambda: api.get("/api/v1/dumps"),
                             lambda d: d["dumps"] and not d["taking"], timeout=60)
    [dump] = dumps["dumps"]
    assert dump["table"] == f"{source.database}.d" and dump["rows"] == 2000
    assert dump["bytes"] > 100_000 and dump["readers"] == []

    status, data = await api.call("POST", "/api/v1/dumps",
                                  body={"table": f"{source.database}.missing"})
    assert status == 404 and "missing" in data["error"]
    for body in (None, {}, {"tables": [1]}, {"table": "no-dot"}):
        status, data = await api.call("POST", "/api/v1/dumps", body=body)
        assert status == 400, (body, data)
    async with api.session.post(api.base + "/api/v1/dumps", data=b"{not json",
                                headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == 400
        assert "not JSON" in (await response.json())["error"]


async def test_resync_answers_for_tables_that_need_none(admin: tuple[RunningService, Api],
                                                       source: Source) -> None:
    running, api = admin
    run_sql(source, "CREATE TABLE `a.b` (id INT PRIMARY KEY)", "INSERT INTO `a.b` VALUES (1)")
    await running.caught_up(source)
    status, data = await api.call(
        "POST", f"/api/v1/tables/{source.database}.%60a.b%60/resync")
    assert status == 409 and "not quarantined" in data["error"], data
    status, data = await api.call("POST", f"/api/v1/tables/{source.database}.nope/resync")
    assert status == 404, data
    status, data = await api.call("POST", "/api/v1/tables/not%20a%20table/resync")
    assert status == 400, data


async def test_reload_users_ends_a_removed_users_session(
        admin: tuple[RunningService, Api], source: Source, users_file: str) -> None:
    running, api = admin
    run_sql(source, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    await running.caught_up(source)
    client = await streaming_client(running, source, "t")
    users = UsersFile(users_file)
    users.add("other", "other-password")
    users.remove(USER)
    status, data = await api.call("POST", "/api/v1/users/reload")
    assert (status, data) == (200, {"users": 1})
    rest = await asyncio.wait_for(client.closed(), 5)
    assert b"removed" in rest, rest


async def test_hostile_requests_get_clear_refusals(admin: tuple[RunningService, Api],
                                                  tmp_path: os.PathLike[str]) -> None:
    running, api = admin
    secret = running.service.config.admin.token_file
    # the console's directory is all that is served: no way out of it, token file included
    for path in ("/console/../admin.py", "/console/%2e%2e/admin.py",
                 "/console/..%2f..%2fcore%2fconfig.py", "/console/" + "%2e%2e/" * 8 + secret):
        async with api.session.get(api.base + path) as response:
            body = await response.read()
            assert response.status in (403, 404), (path, response.status)
            assert b"import" not in body and TOKEN.encode() not in body
    # a body over 64 KiB
    status, data = await api.call("POST", "/api/v1/dumps", body={"table": "x" * 100_000})
    assert status == 413 and "64" in data["error"], data
    # unknown paths and methods under /api/ answer JSON
    status, data = await api.call("GET", "/api/v1/nothing")
    assert status == 404 and "error" in data
    async with api.session.put(api.base + "/api/v1/clients",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == 405 and "GET" in response.headers["Allow"]
        assert "takes" in (await response.json())["error"]
    # a flood of requests does not stop the API: each answers, none left hanging (16 at a
    # time: within the connections an address may hold, 32)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as flood:
        async def replication() -> int:
            async with flood.get(api.base + "/api/v1/replication",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                return response.status
        assert set(await asyncio.gather(*(replication() for _ in range(200)))) == {200}
    # the token file turned loose while running: nobody gets in, with a clear log line
    os.chmod(secret, 0o644)
    try:
        assert (await api.call("GET", "/api/v1/clients"))[0] == 401
    finally:
        os.chmod(secret, 0o600)
    assert (await api.call("GET", "/api/v1/clients"))[0] == 200


async def test_a_quarantined_table_in_the_api_and_its_resync(
        tmp_path: os.PathLike[str], source: Source, users_file: str,
        limited_source: Any) -> None:  # noqa: F811 - the fixture imported above
    """A table the service cannot re-read is quarantined: /replication and /tables say so
    and why; a resync asked through the API releases it once the table can be read."""
    user, url = limited_source
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), url, users_file,
                         admin={"listen": "127.0.0.1:0",
                                "token_file": token_file(str(tmp_path))})
    running = await start_service(config)
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(running, session)
            run_sql(source, "INSERT INTO hidden VALUES (1, 1)")
            await running.caught_up(source)
            # rows rewritten without row events: the repair cannot SELECT hidden
            run_sql(source, "ALTER TABLE hidden ADD COLUMN c INT NOT NULL DEFAULT 7",
                    "INSERT INTO t VALUES (1, 1)")
            await running.caught_up(source)
            replication = await api.get("/api/v1/replication")
            [quarantined] = replication["quarantined"]
            assert quarantined["table"] == f"{db}.hidden" and quarantined["cause"]
            assert any("hidden is quarantined" in p for p in replication["problems"])
            tables = {t["table"]: t for t in (await api.get("/api/v1/tables"))["tables"]}
            assert tables[f"{db}.hidden"]["quarantined"]["since"] == quarantined["since"]
            assert tables[f"{db}.t"]["quarantined"] is None

            source.execute(*(f"GRANT SELECT ON `{db}`.`hidden` TO '{user}'@'{host}'"
                             for host in ("127.0.0.1", "localhost")))
            status, data = await api.call("POST", f"/api/v1/tables/{db}.hidden/resync")
            # the service's own retry may have asked first: then it is under way
            assert (status, data) == (202, {"resyncing": f"{db}.hidden"}) or \
                (status == 409 and "under way" in data["error"]), (status, data)

            async def released() -> Any:
                run_sql(source, "INSERT INTO t SELECT MAX(id) + 1, 0 FROM t")
                return await api.get("/api/v1/replication")

            await eventually(released, lambda d: not d["quarantined"], 60, "the resync")
            status, data = await api.call("POST", f"/api/v1/tables/{db}.hidden/resync")
            assert status == 409 and "not quarantined" in data["error"]
    finally:
        await running.stop()


async def test_odd_requests_get_clear_refusals_and_every_answer_its_headers(
        admin: tuple[RunningService, Api]) -> None:
    """A deeply nested body and a client id of a non-ASCII digit answered 500 with a
    traceback in the log; a 404 of the console's files, or a redirect, came without the
    console's Content-Security-Policy and named aiohttp and Python's versions."""
    _, api = admin
    async with api.session.post(api.base + "/api/v1/dumps", data=b"[" * 50_000,
                                headers={"Authorization": f"Bearer {TOKEN}",
                                         "Content-Type": "application/json"}) as response:
        assert response.status == 400 and "nested" in (await response.json())["error"]
    status, data = await api.call("DELETE", "/api/v1/clients/\u00b2")
    assert status == 400 and "a number" in data["error"], data
    for path in ("/console/missing.js", "/console", "/nothing"):
        async with api.session.get(api.base + path, allow_redirects=False) as response:
            assert response.status in (302, 404), path
            assert response.headers["Content-Security-Policy"].startswith("default-src"), path
            assert response.headers["Server"] == "cdcserver", path
            assert response.headers["X-Content-Type-Options"] == "nosniff", path


async def test_an_unusable_token_file_is_said_once_not_for_every_request(
        admin: tuple[RunningService, Api], caplog: pytest.LogCaptureFixture) -> None:
    running, api = admin
    secret = running.service.config.admin.token_file
    caplog.set_level("INFO", logger="cdcserver.ops.admin")
    os.chmod(secret, 0o644)
    try:
        for _ in range(8):
            assert (await api.call("GET", "/api/v1/clients"))[0] == 401
    finally:
        os.chmod(secret, 0o600)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "may be read or changed by other users" in errors[0].message
    assert (await api.call("GET", "/api/v1/clients"))[0] == 200


async def test_a_table_named_star_is_itself_not_the_wildcard(
        admin: tuple[RunningService, Api], source: Source) -> None:
    """``db.`*``` names a table called ``*``; ``db.*`` every table of ``db``. Both the API and
    START-DUMP took the quoted one for the wildcard and dumped every table."""
    from tests.helpers import RawClient

    running, api = admin
    db = source.database
    run_sql(source, "CREATE TABLE `*` (id INT PRIMARY KEY)", "INSERT INTO `*` VALUES (1)",
            "CREATE TABLE other (id INT PRIMARY KEY)", "INSERT INTO other VALUES (1)")
    await running.caught_up(source)
    status, data = await api.call("POST", "/api/v1/dumps", body={"table": f"{db}.`*`"})
    assert status == 202 and data["queued"] == [f"{db}.`*`"], data
    await eventually(lambda: api.get("/api/v1/dumps"),
                     lambda d: d["dumps"] and not d["taking"], timeout=60)
    client = await RawClient.connect(running.port)
    try:
        await client.login()
        await client.send(f"START-DUMP `{db}`.`*`\n".encode())
        assert await client.json_line() == {"started": [f"{db}.`*`"], "under_way": []}
    finally:
        await client.close()
    dumps = await eventually(lambda: api.get("/api/v1/dumps"),
                             lambda d: len(d["dumps"]) >= 2 and not d["taking"], timeout=60)
    assert {d["table"] for d in dumps["dumps"]} == {f"{db}.`*`"}, dumps


async def test_names_that_reorder_text_are_shown_escaped(
        admin: tuple[RunningService, Api], source: Source) -> None:
    """A table named with U+202E (right-to-left override) showed as another name in the API
    and in references: every such mark is escaped where a person reads it."""
    running, api = admin
    db = source.database
    evil = "gpj\u202eexe"
    run_sql(source, f"CREATE TABLE `{evil}` (id INT PRIMARY KEY)",
            f"INSERT INTO `{evil}` VALUES (1)")
    await running.caught_up(source)
    async with api.session.get(api.base + "/api/v1/tables",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        raw = await response.read()
    assert "\u202e".encode() not in raw
    tables = {t["name"]: t for t in json.loads(raw)["tables"]}
    assert tables[evil]["table"] == f'{db}."gpj\\u202eexe"'  # a reference that reads back
    client = RawClient(*await asyncio.open_connection("127.0.0.1", running.port))
    try:
        await client.login()
        await client.send(b"LIST-TABLES\n")
        line = await client.line()
        assert "\u202e".encode() not in line and evil in line.decode("unicode_escape")
    finally:
        await client.close()


async def test_a_token_that_is_not_utf8_is_a_wrong_token_not_an_error(
        admin: tuple[RunningService, Api]) -> None:
    """A bearer token whose bytes are not UTF-8 answered 500 with a traceback in the log,
    before any login, and was not counted among the wrong tokens (found by attack). It is
    a wrong token: 401."""
    _, api = admin
    host, port = api.base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /api/v1/replication HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer \xc3\x28\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    assert status.split()[1] == b"401", status


async def test_malformed_requests_are_one_line_each_not_a_traceback(
        admin: tuple[RunningService, Api], caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp logged each malformed request (no ``Host``, a header past its limit) or a
    client gone mid-body at ERROR with a ten-line traceback, before any login (found by
    attack): one line at INFO now, naming what was wrong, and the client is answered 400."""
    _, api = admin
    host, port = api.base.removeprefix("http://").rsplit(":", 1)
    caplog.set_level(logging.INFO)
    for request in (b"GET /api/v1/replication HTTP/1.1\r\nX: " + b"y" * 20_000 + b"\r\n\r\n",
                    b"GET /api/v1/replication HTTP/1.1\r\nHost x\r\n\r\n"):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 10)
        finally:
            writer.close()
        assert status.split()[1] == b"400", status
    await asyncio.sleep(0.2)
    said = [r for r in caplog.records if r.name == "cdcserver.ops.admin.http"]
    assert len(said) == 2, [r.getMessage() for r in said]
    assert all(r.levelno == logging.INFO and r.exc_info is None for r in said)
    assert "Traceback" not in caplog.text


async def test_a_client_ended_in_the_middle_of_an_avro_block_gets_no_line_inside_it(
        cdc: RunningService, source: Source) -> None:
    """An AVRO stream sends stored blocks as they are; ended while one is on its way (the
    client reads slowly), the client is not sent an ``ERR`` line in the middle of it, which
    it would read as part of the block: what it got is whole blocks, then either the line
    where a block would start or nothing (a cut it sees for one)."""
    import socket

    from mariadb_cdc_client.format.avro import block_at, parse_header
    from mariadb_cdc_client.format.wire import auth_message

    run_sql(source, "CREATE TABLE t (id INT PRIMARY KEY, v LONGTEXT)")
    for start in range(0, 60, 10):
        run_sql(source, "INSERT INTO t VALUES " + ", ".join(
            f"({i}, REPEAT('{chr(97 + i % 26)}', 300000))" for i in range(start, start + 10)))
    await cdc.caught_up(source)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.settimeout(30)

    def request() -> None:  # (blocking: in a thread, the service runs in this loop)
        sock.connect(("127.0.0.1", cdc.port))
        sock.sendall(auth_message(USER, PASSWORD))
        assert sock.recv(3) == b"OK\n"
        sock.sendall(b"REGISTER UUID=slow, TYPE=AVRO")
        assert sock.recv(3) == b"OK\n"
        sock.sendall(f"REQUEST-DATA {source.database}.t".encode())

    await asyncio.to_thread(request)
    server = cdc.service.listener.server
    await eventually(lambda: asyncio.sleep(0.2, server.sessions()),
                     lambda s: bool(s) and s[-1].out.buffered > 0, what="a block on its way")
    assert server.disconnect(server.sessions()[-1].id, "disconnected by an administrator")

    def read_all() -> bytes:
        data = bytearray()
        while chunk := sock.recv(1 << 16):
            data += chunk
        return bytes(data)

    data = await asyncio.to_thread(read_all)
    sock.close()
    header = parse_header(data)
    pos = header.size
    while (block := block_at(data, pos, header.sync)) is not None:
        pos = block[2]
    rest = data[pos:]
    assert rest.startswith(b"ERR FORBIDDEN") or b"ERR FORBIDDEN" not in rest, rest[:200]
