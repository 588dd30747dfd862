"""Security: per-user table permissions, login throttling, TLS on the listener and to MariaDB,
and no password in the process title."""

from __future__ import annotations

import asyncio
import functools
import io
import logging
import os
import select
import ssl
import subprocess
import sys
import time

import pytest

from cdcserver.app import logs
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import ListenerConfig
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.protocol.throttle import FailureLog, LoginThrottle
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client import SyncCdcClient
from mariadb_cdc_client.format.wire import auth_message
from tests.conftest import make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, self_signed_certificate, until, wait_until
from tests.unit.test_listener import Listener, _listener


@pytest.fixture
async def listener(tmp_path) -> Listener:
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=5, idle_timeout=5))
    await running.commit_rows((1, "one"))
    yield running
    await running.server.stop()
    running.store.close()


async def _logged_in(port: int, user: str, password: str) -> RawClient:
    client = await RawClient.connect(port)
    await client.send(auth_message(user, password))
    assert await client.line() == b"OK\n"
    await client.send(b"REGISTER UUID=sec, TYPE=JSON")
    assert await client.line() == b"OK\n"
    return client


async def test_a_user_reads_only_the_tables_the_users_file_lists(listener: Listener, tmp_path):
    users = UsersFile(str(tmp_path / "cdcusers"))
    users.add("alice", "pw-a", "shop.other,crm.*")
    alice = await _logged_in(listener.port, "alice", "pw-a")
    await alice.send(b"REQUEST-DATA shop.items\n")
    assert await alice.line() == b"ERR FORBIDDEN user alice may not read shop.items\n"
    await alice.send(b"LIST-TABLES\n")  # the connection stays usable
    assert (await alice.json_line())["tables"] == []
    await alice.send(b"QUERY-LAST-TRANSACTION\n")  # none of alice's tables changed
    assert (await alice.line()).startswith(b"ERR NO-TRANSACTION")
    await alice.send(b"QUERY-RANGE shop.items LIMIT 10\n")
    assert (await alice.line()).startswith(b"ERR FORBIDDEN")
    await alice.close()

    users.add("alice", "pw-a", "shop.*")  # granted: the next request sees it
    alice = await _logged_in(listener.port, "alice", "pw-a")
    await alice.send(b"REQUEST-DATA shop.items\n")
    assert (await alice.json_line())["table"] == "items"
    assert (await alice.json_line())["id"] == 1
    await alice.close()

    # A MaxScale line (no table list) reads everything, as before the extension.
    everyone = await _logged_in(listener.port, USER, PASSWORD)
    await everyone.send(b"LIST-TABLES\n")
    assert [t["table"] for t in (await everyone.json_line())["tables"]] == ["items"]
    await everyone.close()


async def test_a_removed_user_or_a_lost_table_ends_open_sessions(listener: Listener,
                                                                  tmp_path):
    users = UsersFile(str(tmp_path / "cdcusers"))
    users.add("bob", "pw-b", "shop.*")
    users.add("carol", "pw-c", "shop.*")
    streams = {}
    for name, password in (("bob", "pw-b"), ("carol", "pw-c"), (USER, PASSWORD)):
        client = await _logged_in(listener.port, name, password)
        await client.send(b"REQUEST-DATA shop.items\n")
        await client.json_line()  # the schema
        assert (await client.json_line())["id"] == 1
        streams[name] = client
    idle = await _logged_in(listener.port, "bob", "pw-b")  # registered, reading nothing
    users.remove("bob")
    users.add("carol", "pw-c", "crm.*")
    # Closed by the server within seconds (it checks the file every second), with why
    assert await streams["bob"].line() == b"ERR FORBIDDEN user bob was removed\n"
    assert await streams["carol"].line() == \
        b"ERR FORBIDDEN user carol may no longer read shop.items\n"
    assert await idle.line() == b"ERR FORBIDDEN user bob was removed\n"
    for client in (streams["bob"], streams["carol"], idle):
        assert await client.line() == b""  # and the connection is closed
        await client.close()
    await listener.commit_rows((2, "two"))  # the others' streams go on
    assert (await streams[USER].json_line())["id"] == 2
    await streams[USER].close()


def test_users_file_table_lists_round_trip_and_are_validated(tmp_path):
    path = tmp_path / "cdcusers"
    users = UsersFile(str(path))
    users.add("bob", "pw", "shop.orders, crm.*")
    users.add("bob", "new password")  # a new password keeps bob's tables
    name, hashed, tables, scram = path.read_text().splitlines()[0].split(":")
    assert (name, len(hashed), tables) == ("bob", 40, "shop.orders,crm.*")
    assert scram.startswith("scram=4096$")
    users.add("bob", "pw", "*")  # every table: MaxScale's two fields, then the options
    assert path.read_text().split(":")[2] == "*"
    for bad in ("shop", "shop.", ".t", "a.b.c", "sh op.t"):
        with pytest.raises(Exception, match="invalid table list"):
            users.add("bob", "pw", bad)


WRONG = [bytes([n]) * 20 for n in range(10)]  # ten distinct wrong SHA1 digests


def test_a_repeated_wrong_password_counts_once_and_never_slows_anyone():
    now = [1000.0]
    throttle = LoginThrottle(limit=3, window=60, max_wait=60, clock=lambda: now[0])
    for _ in range(50):  # a misconfigured client retrying one stale password
        turn = throttle.turn("10.0.0.1", "etl", WRONG[0])
        assert turn.wait == 0 and not turn.refused
        throttle.failed("10.0.0.1", "etl", WRONG[0])
        now[0] += 0.1
    good = throttle.turn("10.0.0.1", "etl", WRONG[9])  # the right password, same user
    assert good.wait == 0 and not good.refused
    throttle.succeeded("10.0.0.1", "etl", good)
    assert throttle.delayed == throttle.refused == 0


def test_new_passwords_beyond_the_budget_wait_their_turn_in_order():
    now = [1000.0]
    throttle = LoginThrottle(limit=3, window=60, max_wait=60, clock=lambda: now[0])
    waits = []
    for digest in WRONG[:7]:  # a guesser with many connections at once
        turn = throttle.turn("10.0.0.1", "root", digest)
        waits.append(None if turn.refused else turn.wait)
    # Three a minute: three now, three a minute later, the seventh two minutes away: refused.
    assert waits == [0, 0, 0, 60, 60, 60, None]
    assert throttle.turn("10.0.0.1", "root", WRONG[6]).wait == 120  # says when to come back
    # Other users from that address and that user from elsewhere are not slowed.
    assert throttle.turn("10.0.0.1", "app", WRONG[0]).wait == 0
    assert throttle.turn("10.0.0.2", "root", WRONG[7]).wait == 0
    for digest in WRONG[:3]:
        throttle.failed("10.0.0.1", "root", digest)
    assert throttle.turn("10.0.0.1", "root", WRONG[1]).wait == 0  # known wrong: at once
    now[0] += 121  # every turn has left the window
    assert throttle.turn("10.0.0.1", "root", WRONG[8]).wait == 0
    assert throttle.delayed == 3 and throttle.refused == 2


def test_a_correct_password_gives_its_turn_back():
    now = [1000.0]
    throttle = LoginThrottle(limit=2, window=60, max_wait=60, clock=lambda: now[0])
    for _ in range(5):  # the right password, many times: never counted
        turn = throttle.turn("10.0.0.1", "app", WRONG[9])
        assert turn.wait == 0
        throttle.succeeded("10.0.0.1", "app", turn)
    assert throttle.turn("10.0.0.1", "app", WRONG[0]).wait == 0
    assert throttle.turn("10.0.0.1", "app", WRONG[1]).wait == 0
    assert throttle.turn("10.0.0.1", "app", WRONG[2]).wait == 60


def test_junk_logins_cannot_flush_a_users_budget():
    """The issue's attack: five guesses for ``victim``, then 10,010 logins with made-up names
    (from the same address and from as many others) to push ``victim`` out of the table."""
    now = [1000.0]
    throttle = LoginThrottle(limit=5, window=60, max_wait=600, max_keys=100,
                             clock=lambda: now[0])
    for digest in WRONG[:5]:
        turn = throttle.turn("10.0.0.1", "victim", digest)
        assert turn.wait == 0
        throttle.failed("10.0.0.1", "victim", digest)
    for n in range(10_010):
        junk = bytes([n % 256, n // 256]) * 10
        for host, known in (("10.0.0.1", False), (f"10.{n // 250 % 250}.{n % 250}.9", False),
                            (f"172.16.{n // 250 % 250}.{n % 250}", True)):
            user = f"junk{n}" if not known else "someone"
            turn = throttle.turn(host, user, junk, known)
            if not turn.refused:
                throttle.failed(host, user, junk, known)
        now[0] += 0.00015  # 1.5 s in all, as in the issue
    assert len(throttle._keys) <= 100 + 4  # bounded: the table plus the shared overflow
    turn = throttle.turn("10.0.0.1", "victim", WRONG[5])
    assert turn.refused or turn.wait > 55, "victim's budget was reset by junk logins"


def test_new_addresses_share_a_budget_per_user_while_the_table_is_full():
    now = [1000.0]
    throttle = LoginThrottle(limit=2, window=60, max_wait=600, max_keys=10,
                             clock=lambda: now[0])
    waits = []
    for n in range(30):  # one guess for victim from each of 30 addresses
        turn = throttle.turn(f"10.0.0.{n}", "victim", WRONG[n % 10] + bytes([n]))
        waits.append(turn.wait)
    # Each address takes two entries (its user's budget and its own): five fit the table
    assert waits[:5] == [0] * 5
    assert waits[5:7] == [0, 0] and all(w >= 60 for w in waits[7:])  # shared from there
    assert len(throttle._keys) <= 10 + 2


def test_an_ipv6_clients_addresses_share_its_budget():
    now = [1000.0]
    throttle = LoginThrottle(limit=2, window=60, max_wait=600, clock=lambda: now[0])
    waits = [throttle.turn(f"2001:db8:1:2::{n:x}", "victim", WRONG[n]).wait
             for n in range(4)]
    assert waits == [0, 0, 60, 60]
    assert throttle.turn("2001:db8:1:3::1", "victim", WRONG[5]).wait == 0  # another /64


def test_a_password_that_logged_in_is_never_delayed_or_refused():
    now = [1000.0]
    throttle = LoginThrottle(limit=2, window=60, max_wait=60, clock=lambda: now[0])
    good = WRONG[9]
    turn = throttle.turn("10.0.0.1", "victim", good)
    throttle.succeeded("10.0.0.1", "victim", turn, good)
    for digest in WRONG[:8]:  # someone guesses from the same address: budgets spent
        turn = throttle.turn("10.0.0.1", "victim", digest)
        if not turn.refused:
            throttle.failed("10.0.0.1", "victim", digest)
    assert throttle.turn("10.0.0.1", "victim", WRONG[8]).refused
    again = throttle.turn("10.0.0.1", "victim", good)
    assert again.wait == 0 and not again.refused
    throttle.failed("10.0.0.1", "victim", good)  # the password changed: forgotten
    assert not throttle._good


def test_failed_logins_are_logged_cut_escaped_and_summed_up():
    lines: list[str] = []
    now = [1000.0]
    failures = FailureLog(lambda fmt, *args: lines.append(fmt % args), first=10,
                          interval=60, clock=lambda: now[0])
    for n in range(10_000):
        failures.failed(f"10.0.{n % 7}.1:5000", f"10.0.{n % 7}.1", "x" * 32_768 + "\n\x1b[2J")
    assert len(lines) == 10
    assert all(len(line) < 200 and "\n" not in line and "\x1b" not in line for line in lines)
    now[0] += 61
    failures.tick()
    assert lines[-1] == "9990 more failed logins in the last 60 s, from 7 addresses"
    failures.tick()
    assert len(lines) == 11  # nothing more to say


async def test_thousands_of_huge_user_names_leave_no_trace(listener: Listener, caplog):
    """The issue's 32 KB user names: refused before any lookup, no throttle entry, no log
    line that holds the name; a normal client is served afterwards."""
    caplog.set_level("INFO")
    huge = ("u" * 32_000).encode()  # as long as a line allows, in hex
    message = (huge + b":").hex().encode() + b"00" * 20

    async def attempt() -> bytes:
        client = await RawClient.connect(listener.port)
        try:
            await client.send(message)
            return await client.line()
        finally:
            await client.close()

    for _ in range(10):
        replies = await asyncio.gather(*(attempt() for _ in range(30)))
        assert all(r.startswith(b"ERR BAD-AUTH a user name has at most 43 characters")
                   for r in replies), replies[:2]
    assert not listener.server.context.throttle._keys
    logged = sum(len(r.getMessage()) for r in caplog.records)
    assert logged < 300 * 200, f"{logged} characters logged for 300 refused logins"
    assert await _login(listener.port, PASSWORD) == b"OK\n"


async def _login(port: int, password: str) -> bytes:
    client = await RawClient.connect(port)
    try:
        await client.send(auth_message(USER, password))
        return await client.line()
    finally:
        await client.close()


async def test_a_client_retrying_a_wrong_password_never_locks_out_the_right_one(
        listener: Listener):
    for _ in range(12):  # one misconfigured executor behind the same address
        assert (await _login(listener.port, "stale")).startswith(b"ERR AUTH-FAILED")
    started = time.monotonic()
    assert await _login(listener.port, PASSWORD) == b"OK\n"
    assert time.monotonic() - started < 1  # not made to wait either
    assert listener.server.context.throttle.delayed == 0


async def test_guessing_is_slowed_to_the_budget_and_the_right_password_waits_its_turn(
        listener: Listener):
    listener.server.context.throttle = LoginThrottle(limit=2, window=1.5, max_wait=2)
    guesses = await asyncio.gather(*(_login(listener.port, f"guess{n}") for n in range(4)))
    # Two checked at once, two a window later, however many connections ask at once.
    assert all(reply.startswith(b"ERR AUTH-FAILED") for reply in guesses)
    assert listener.server.context.throttle.delayed == 2
    started = time.monotonic()
    assert await _login(listener.port, PASSWORD) == b"OK\n"  # still never refused...
    assert time.monotonic() - started >= 0.5  # ...but it waited behind the guesses
    refused = await asyncio.gather(*(_login(listener.port, f"more{n}") for n in range(6)))
    # The turns now lie beyond max_wait: refused unchecked, with when to come back.
    assert sum(r.startswith(b"ERR THROTTLED too many new passwords tried for 'cdcuser' "
                            b"from 127.0.0.1; try again in") for r in refused) >= 2


async def test_the_listener_speaks_tls_and_refuses_plain_tcp(tmp_path):
    cert, key = self_signed_certificate(str(tmp_path))
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=5, idle_timeout=5))
    await running.server.stop()  # again, with TLS
    tls = ListenerConfig(tls_cert=cert, tls_key=key).tls_context()
    _, port = await running.server.start("127.0.0.1", 0, ssl=tls)
    await running.commit_rows((7, "secret row"))
    try:
        context = ssl.create_default_context(cafile=cert)
        records = await asyncio.to_thread(_stream_over_tls, port, context)
        assert [r.values["id"] for r in records] == [7]
        plain = await RawClient.connect(port)
        await plain.send(auth_message(USER, PASSWORD))
        assert b"OK" not in await plain.closed()  # no TLS handshake, nothing served
    finally:
        await running.server.stop()
        running.store.close()


def _stream_over_tls(port: int, context: ssl.SSLContext) -> list:
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, ssl=context) as client:
        return [e for e in client.stream("shop.items", idle_timeout=1)
                if hasattr(e, "values")]


@pytest.mark.mariadb
async def test_replication_over_tls_to_a_mariadb_that_requires_it(tmp_path, users_file: str):
    cert, key = self_signed_certificate(str(tmp_path))
    server = EmbeddedMariaDB(str(tmp_path / "tls-mariadb"), port=0, server_id=77, extra_args=[
        f"--ssl-cert={cert}", f"--ssl-key={key}", "--require-secure-transport=ON"])
    server.start()
    try:
        server.create_replication_user("tlsrepl", "tlspw")
        server.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)",
                       "INSERT INTO d.t VALUES (1), (2)")
        plain = server.url("tlsrepl", "tlspw", tcp=True)
        config = make_config(str(tmp_path / "data"), plain + f"?ssl_ca={cert}", users_file)
        running = await start_service(config)
        try:
            await running.replicating()
            await running.service.wait_caught_up(GtidState.parse(
                str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])))
            entry = running.service.data.catalog.get(TableName("d", "t"))
            assert entry is not None and entry.latest() is not None
        finally:
            await running.stop()
    finally:
        server.stop()


def test_a_password_on_the_command_line_is_not_in_the_process_title(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    (tmp_path / "users").touch()  # a service without its users file refuses to start
    process = subprocess.Popen(
        [exe, "run", "--source", "mysql://cdc:s3cret-pw@127.0.0.1:1", "--data-dir",
         str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--users-file", str(tmp_path / "users")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    logged = b""
    try:
        def title() -> bytes:
            with open(f"/proc/{process.pid}/cmdline", "rb") as f:
                return f.read()

        wait_until(lambda: b"cdc:***@127.0.0.1" in title(), what="the masked title")
        assert b"s3cret-pw" not in title()
        assert process.stderr is not None
        deadline = time.monotonic() + 30
        while b"retrying" not in logged and time.monotonic() < deadline:  # a connect failure
            ready, _, _ = select.select([process.stderr], [], [], 1)
            if ready:
                logged += os.read(process.stderr.fileno(), 65536)
    finally:
        process.terminate()
        logged += process.communicate(timeout=30)[1]
    assert b"cdc@127.0.0.1:1" in logged and b"s3cret-pw" not in logged
    # told why and what to use instead
    assert b"warning: a password on the command line can be read by every user" in logged
    assert b"--source-password-file" in logged


def test_the_text_log_escapes_what_names_hold():
    """A table or user name holding a newline, an escape sequence or a bidirectional override
    cannot forge log lines (issue 36, finding 8); a traceback keeps its lines; a table named
    like a secret is not masked."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.TextFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test.escapes")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        hostile = "t\n2026-11-28 00:00:00,000 CRITICAL cdcserver: forged\x1b[2J\u202egnp.exe"
        logger.warning("%s: version %d", f"shop.{hostile}", 2)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed on %s", hostile)
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == ("WARNING shop.t\\n2026-11-28 00:00:00,000 CRITICAL cdcserver: "
                        "forged\\x1b[2J\\u202egnp.exe: version 2")
    assert lines[1].startswith("ERROR failed on t\\n2026") and lines[2] == \
        "Traceback (most recent call last):"
    assert not any(line.startswith("2026") for line in lines)
    assert logs.mask_secrets("shop.secret: version 2") == "shop.secret: version 2"
    assert logs.mask_secrets("password: hunter2") == "password: ***"


async def test_the_clients_password_option_is_not_in_its_process_title(listener: Listener):
    exe = os.path.join(os.path.dirname(sys.executable), "cdc")
    process = await asyncio.create_subprocess_exec(
        exe, "-h", "127.0.0.1", "-P", str(listener.port), "-u", USER, "-p", PASSWORD,
        "shop.items", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        await asyncio.wait_for(process.stdout.readline(), 30)  # the schema: it is streaming
        with open(f"/proc/{process.pid}/cmdline", "rb") as f:
            title = f.read()
        assert PASSWORD.encode() not in title and b"-p ***" in title
    finally:
        process.terminate()
        await process.wait()


async def _made_up_salt(port: int) -> str:
    """The salt of the SCRAM server-first-message for a name nobody has."""
    raw = await RawClient.connect(port)
    try:
        await raw.send(b"AUTH SCRAM-SHA-256 n,,n=nobody-here,r=clientnonce\n")
        reply = (await raw.line()).decode()
        assert reply.startswith("SCRAM "), reply
        return dict(f.split("=", 1) for f in reply[6:].strip().split(","))["s"]
    finally:
        await raw.close()


async def test_an_unknown_name_gets_the_same_salt_after_a_restart(tmp_path, source,
                                                                   users_file: str):
    """The made-up SCRAM verifier of a name that does not exist comes from a secret kept in
    the data directory: a salt that changed with each restart of the process, while real
    users' stay, would tell the two apart. ``cdcserver run`` processes, restarted."""
    from tests.server.test_shutdown import Service

    salts = []
    for folder in ("one", "one", "other"):
        (tmp_path / folder).mkdir(exist_ok=True)
        service = Service(tmp_path / folder, source.url, users_file)
        service.start()
        try:
            await until(functools.partial(_listening, service.port), what="the CDC listener")
            salts.append(await _made_up_salt(service.port))
        finally:
            assert service.terminate() == 0
    assert salts[0] == salts[1] != salts[2]
    secret = tmp_path / "one" / "data" / "state" / "login-secret"
    assert secret.stat().st_size == 32 and secret.stat().st_mode & 0o077 == 0


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
