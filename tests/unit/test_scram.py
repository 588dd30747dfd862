"""The SCRAM-SHA-256 login (protocol.md, "SCRAM-SHA-256"): a login that cannot be replayed,
beside MaxScale's, over real sockets to a real listener.

The oracle is an RFC 5802 client written here with hashlib and hmac alone: it shares no code
with the server's (scramp) or the client library's, so a mistake in either shows as a
disagreement with the RFC's arithmetic, not as two halves agreeing with each other."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from cdcserver.core.config import ListenerConfig
from cdcserver.core.errors import ConfigError
from cdcserver.protocol.scram import Verifier, fake_verifier, login_secret
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client import CdcClient, SyncCdcClient
from mariadb_cdc_client.format.wire import ProtocolError, auth_message
from mariadb_cdc_client.login import ScramLogin
from tests.helpers import PASSWORD, USER, RawClient
from tests.unit.test_listener import Listener, _listener


@pytest.fixture
async def listener(tmp_path) -> Listener:
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=5, idle_timeout=5))
    await running.commit_rows((1, "one"))
    yield running
    await running.server.stop()
    running.store.close()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class RfcClient:
    """RFC 5802 section 3, step by step (no SASLprep: the test passwords are ASCII)."""

    def __init__(self, user: str, password: str, nonce: str = "") -> None:
        self.user, self.password = user, password
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return f"AUTH SCRAM-SHA-256 n,,{self.first_bare}\n".encode()

    def final(self, reply: bytes) -> bytes:
        assert reply.startswith(b"SCRAM "), reply
        server_first = reply[len(b"SCRAM "):].decode().strip()
        fields = dict(item.split("=", 1) for item in server_first.split(","))
        assert fields["r"].startswith(self.nonce) and len(fields["r"]) > len(self.nonce)
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(),
                                     base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = _hmac(salted, "Client Key")
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.first_bare},{server_first},{without_proof}"
        signature = _hmac(hashlib.sha256(client_key).digest(), message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = _hmac(_hmac(salted, "Server Key"), message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}\n".encode()


async def _scram(port: int, client: RfcClient) -> tuple[RawClient, bytes, bytes]:
    """(connection, the server's first reply, its last) after one whole exchange."""
    raw = await RawClient.connect(port)
    await raw.send(client.first())
    server_first = await raw.line()
    await raw.send(client.final(server_first))
    return raw, server_first, await raw.line()


async def test_an_rfc_5802_client_logs_in_and_checks_the_servers_signature(listener: Listener):
    client = RfcClient(USER, PASSWORD)
    raw, _, last = await _scram(listener.port, client)
    expected = base64.b64encode(client.server_signature).decode()
    assert last == f"OK v={expected}\n".encode()  # the server holds the user's verifier
    await raw.send(b"REGISTER UUID=scram, TYPE=JSON\n")
    assert await raw.line() == b"OK\n"
    await raw.send(b"REQUEST-DATA shop.items\n")
    assert (await raw.json_line())["table"] == "items"
    assert (await raw.json_line())["name"] == "one"
    await raw.close()


async def test_a_captured_scram_login_cannot_be_replayed(listener: Listener):
    client = RfcClient(USER, PASSWORD)
    first = client.first()
    raw, server_first, last = await _scram(listener.port, client)
    assert last.startswith(b"OK v=")
    final = client.final(server_first)  # exactly what crossed the wire
    await raw.close()

    replay = await RawClient.connect(listener.port)
    await replay.send(first)
    again = await replay.line()
    assert again.startswith(b"SCRAM ") and again != server_first  # a fresh server nonce
    await replay.send(final)
    assert await replay.line() == b"ERR AUTH-FAILED Authentication failed\n"
    await replay.send(b"REGISTER UUID=replay, TYPE=JSON\n")  # and nothing else opens
    assert (await replay.line()).startswith(b"ERR BAD-AUTH")
    await replay.close()


def _server_first(reply: bytes) -> dict[str, str]:
    return dict(f.split("=", 1) for f in reply.decode().split(" ", 1)[1].strip().split(","))


async def test_a_wrong_password_fails_and_an_unknown_user_looks_the_same(listener: Listener):
    raw, real_first, wrong = await _scram(listener.port, RfcClient(USER, "not the password"))
    assert wrong == b"ERR AUTH-FAILED Authentication failed\n"
    await raw.close()
    real = _server_first(real_first)
    # A made-up name gets the same shape of exchange (a salt as long as a real user's, the
    # same iteration count), with a salt that does not change between attempts (a random
    # one would tell it apart from a real user's), and fails the same way.
    salts = []
    for _ in range(2):
        raw, server_first, last = await _scram(listener.port, RfcClient("nobody", "x"))
        made_up = _server_first(server_first)
        assert made_up.keys() == real.keys() and made_up["i"] == real["i"] == "4096"
        assert len(base64.b64decode(made_up["s"])) == len(base64.b64decode(real["s"])) == 32
        salts.append(made_up["s"])
        assert last == b"ERR AUTH-FAILED Authentication failed\n"
        await raw.close()
    assert salts[0] == salts[1] != real["s"]


def test_the_login_secret_is_made_once_kept_private_and_checked(tmp_path):
    path = str(tmp_path / "login-secret")
    secret = login_secret(path)
    assert len(secret) == 32 and login_secret(path) == secret
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert fake_verifier("nobody", secret) == fake_verifier("nobody", login_secret(path))
    assert fake_verifier("nobody", secret) != fake_verifier("nobody", b"\1" * 32)
    assert fake_verifier("nobody", secret) != fake_verifier("somebody", secret)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="may be read by other users"):
        login_secret(path)
    os.chmod(path, 0o600)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(ConfigError, match="holds 33 bytes"):
        login_secret(path)


async def test_a_scram_only_user_is_refused_maxscales_login(listener: Listener, tmp_path,
                                                             caplog):
    caplog.set_level("INFO")
    users = UsersFile(str(tmp_path / "cdcusers"))
    users.add("etl", "etl-pw", legacy=False)
    line = next(text for text in (tmp_path / "cdcusers").read_text().splitlines()
                if text.startswith("etl:"))
    assert line.startswith("etl:-:*:scram=4096$")
    legacy = await RawClient.connect(listener.port)
    await legacy.send(auth_message("etl", "etl-pw"))  # the right password, replayable form
    assert await legacy.line() == b"ERR AUTH-FAILED Authentication failed\n"
    await legacy.close()
    assert any("'etl' may log in with SCRAM-SHA-256 only" in r.getMessage()
               for r in caplog.records)
    raw, _, last = await _scram(listener.port, RfcClient("etl", "etl-pw"))
    assert last.startswith(b"OK v=")
    await raw.close()
    users.add("etl", "new-pw")  # a new password keeps the policy
    assert not users.verify("etl", hashlib.sha1(b"new-pw").digest())
    assert users.legacy_refused("etl")


async def test_malformed_scram_messages_get_a_clear_error_and_the_listener_serves_on(
        listener: Listener):
    for bad, reply in ((b"AUTH SCRAM-SHA-1 n,,n=a,r=x\n", b"ERR BAD-AUTH unknown mechanism"),
                       (b"AUTH SCRAM-SHA-256 garbage\n", b"ERR BAD-AUTH not a SCRAM"),
                       (b"AUTH SCRAM-SHA-256 p=tls-unique,,n=a,r=x\n", b"ERR BAD-AUTH"),
                       ("AUTH SCRAM-SHA-256 n,,n=" + "x" * 44 + ",r=abc\n",
                        b"ERR BAD-AUTH a user name has at most 43")):
        raw = await RawClient.connect(listener.port)
        await raw.send(bad if isinstance(bad, bytes) else bad.encode())
        assert (await raw.line()).startswith(reply), bad
        await raw.close()
    raw = await RawClient.connect(listener.port)  # a proof that is not base64
    await raw.send(RfcClient(USER, PASSWORD).first())
    assert (await raw.line()).startswith(b"SCRAM ")
    await raw.send(b"c=biws,r=nope,p=!!!\n")
    assert await raw.line() == b"ERR AUTH-FAILED Authentication failed\n"
    await raw.close()
    raw, _, last = await _scram(listener.port, RfcClient(USER, PASSWORD))
    assert last.startswith(b"OK v=")
    await raw.close()


async def test_a_scram_login_split_across_writes_is_read_whole(listener: Listener):
    client = RfcClient(USER, PASSWORD)
    raw = await RawClient.connect(listener.port)
    first = client.first()
    for piece in (first[:2], first[2:9], first[9:]):
        await raw.send(piece)
        await asyncio.sleep(0.05)
    server_first = await raw.line()
    final = client.final(server_first)
    await raw.send(final[:10])
    await asyncio.sleep(0.05)
    await raw.send(final[10:])
    assert (await raw.line()).startswith(b"OK v=")
    await raw.close()


async def test_the_library_uses_scram_when_offered_and_falls_back_for_a_hash_only_user(
        listener: Listener, tmp_path, caplog):
    users_file = tmp_path / "cdcusers"
    # A line as MaxScale's cdc_users.py writes it: a hash, no verifier (foobar / foopasswd).
    with open(users_file, "a") as f:
        f.write("foobar:534EBD301EF499621802C63709693765CB5E81E0\n")
    caplog.set_level("INFO")
    async with CdcClient("127.0.0.1", listener.port, USER, PASSWORD) as cdc:
        conn = await cdc.connect()
        await conn.close()
    assert any("authenticated as 'cdcuser'" in r.getMessage() for r in caplog.records)
    assert not any("trying MaxScale's login" in r.getMessage() for r in caplog.records)
    async with CdcClient("127.0.0.1", listener.port, "foobar", "foopasswd") as cdc:
        conn = await cdc.connect()  # auto: SCRAM fails, MaxScale's login works
        await conn.close()
    assert any("trying MaxScale's login" in r.getMessage() for r in caplog.records)
    with pytest.raises(ProtocolError, match="AUTH-FAILED"):
        await CdcClient("127.0.0.1", listener.port, "foobar", "foopasswd",
                        auth="scram").connect()

    def blocking() -> None:
        with SyncCdcClient("127.0.0.1", listener.port, USER, PASSWORD, auth="scram") as cdc:
            cdc.connect().close()
        with pytest.raises(ProtocolError, match="AUTH-FAILED"):
            SyncCdcClient("127.0.0.1", listener.port, USER, "wrong", auth="scram").connect()
        with SyncCdcClient("127.0.0.1", listener.port, "foobar", "foopasswd") as cdc:
            cdc.connect().close()

    await asyncio.to_thread(blocking)


def _maxscale_like_server() -> tuple[socket.socket, threading.Thread]:
    """A stand-in for MaxScale, which cannot run here: it answers a login that is not its
    hex form with an error and hangs up (either is how a server without SCRAM refuses it);
    a hex login gets OK, then REGISTER gets OK."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(3):  # auth=scram; then auth=auto's SCRAM try and its hex login
            conn, _ = server.accept()
            with conn:
                data = conn.recv(4096)
                if data.startswith(b"AUTH "):
                    conn.sendall(b"ERR, authentication failed\n")
                    continue
                conn.sendall(b"OK\n")
                conn.recv(4096)
                conn.sendall(b"OK\n")
                conn.recv(4096)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_a_server_without_scram_gets_maxscales_login_unless_scram_is_required():
    server, thread = _maxscale_like_server()
    port = server.getsockname()[1]
    with pytest.raises(ProtocolError, match="does not offer SCRAM-SHA-256"):
        SyncCdcClient("127.0.0.1", port, "u", "p", auth="scram").connect()
    SyncCdcClient("127.0.0.1", port, "u", "p").connect().close()  # auto: MaxScale's login
    thread.join(10)
    server.close()


def test_the_client_refuses_a_server_whose_signature_is_wrong():
    login = ScramLogin(USER, PASSWORD)
    first = login.first().decode().split(" ", 2)[2].strip()
    nonce = first.split("r=", 1)[1]
    verifier = Verifier.make("another password")  # a server that does not hold ours
    salt = base64.b64encode(verifier.salt).decode()
    login.final(f"SCRAM r={nonce}server,s={salt},i=4096\n".encode())
    with pytest.raises(ProtocolError, match="signature is wrong"):
        login.check("v=" + base64.b64encode(b"\0" * 32).decode())


def test_a_verifier_round_trips_and_bad_ones_are_skipped(tmp_path):
    verifier = Verifier.make("pw")
    assert Verifier.parse(verifier.text()) == verifier
    path = tmp_path / "cdcusers"
    good = f"ok:-:*:scram={verifier.text()}"
    path.write_text("\n".join([
        good,
        "nohash:-:*",  # neither login possible
        f"few:-:*:scram=1000${verifier.text().split('$', 1)[1]}",  # under 4096 iterations
        "odd:534EBD301EF499621802C63709693765CB5E81E0:*:colour=blue",
    ]) + "\n")
    loaded, problems = UsersFile(str(path)).check()
    assert list(loaded) == ["ok"]
    assert [p.split(": ", 1)[1] for p in problems] == [
        "user nohash: no hash and no scram= verifier: no login is possible",
        "user few: scram=: at least 4096 iterations, a salt, and 32-byte keys",
        "user odd: unknown option 'colour=blue' (json=DIALECT, scram=VERIFIER)"]


def test_a_password_scram_cannot_use_is_legacy_only_or_refused(tmp_path, caplog):
    users = UsersFile(str(tmp_path / "cdcusers"))
    users.add("bell", "ring\x07ring")  # SASLprep forbids control characters
    assert users.verify("bell", hashlib.sha1(b"ring\x07ring").digest())
    assert users.verifier("bell") is None
    assert any("logs in with MaxScale's login only" in r.getMessage() for r in caplog.records)
    with pytest.raises(Exception, match="choose another password"):
        users.add("strict", "ring\x07ring", legacy=False)


async def test_cdc_logs_in_with_scram_only_when_told(listener: Listener, tmp_path):
    UsersFile(str(tmp_path / "cdcusers")).add("etl", "etl-pw", legacy=False)
    command = os.path.join(os.path.dirname(sys.executable), "cdc")

    def cdc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([command, "-h", "127.0.0.1", "-P", str(listener.port), "-u",
                               "etl", "-t", "1", *args, "shop.items"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "CDC_PASSWORD":
                                                          "etl-pw"}, check=False)

    scram = await asyncio.to_thread(cdc, "--auth", "scram")
    assert scram.returncode == 0, scram.stderr
    assert [json.loads(line).get("name") for line in scram.stdout.splitlines()][1:] == ["one"]
    legacy = await asyncio.to_thread(cdc, "--auth", "legacy")  # refused for this user
    assert legacy.returncode != 0 and "AUTH-FAILED" in legacy.stderr


def test_the_spark_sources_auth_option():
    pytest.importorskip("pyspark")
    from mariadb_cdc_client.spark import plan

    base = {"user": "u", "password": "p", "tables": "shop.items"}
    assert plan.Options.parse(base, streaming=True).auth == "auto"
    assert plan.Options.parse({**base, "auth": "SCRAM"}, streaming=True).auth == "scram"
    with pytest.raises(plan.OptionError, match="auth is auto, scram or legacy"):
        plan.Options.parse({**base, "auth": "none"}, streaming=True)


async def test_the_gs2_flag_y_is_accepted_and_p_refused(listener: Listener):
    """RFC 5802, section 6: a server without channel binding takes 'y' (the client could
    bind, and believes the server cannot: with no -PLUS mechanism offered, there is no
    downgrade to detect) and refuses 'p' (binding asked for)."""
    client = RfcClient(USER, PASSWORD)
    raw = await RawClient.connect(listener.port)
    await raw.send(f"AUTH SCRAM-SHA-256 y,,{client.first_bare}\n".encode())
    server_first = await raw.line()
    # the proof covers the channel binding the client names: "y,," here, not "n,,"
    fields = _server_first(server_first)
    salted = hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), base64.b64decode(fields["s"]),
                                 int(fields["i"]))
    client_key = _hmac(salted, "Client Key")
    without_proof = f"c={base64.b64encode(b'y,,').decode()},r={fields['r']}"
    message = f"{client.first_bare},{server_first.decode()[6:].strip()},{without_proof}"
    proof = bytes(a ^ b for a, b in zip(client_key, _hmac(hashlib.sha256(client_key).digest(),
                                                          message), strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}\n".encode()
    await raw.send(final)
    assert (await raw.line()).startswith(b"OK v=")
    await raw.close()
    raw = await RawClient.connect(listener.port)
    await raw.send(f"AUTH SCRAM-SHA-256 p=tls-unique,,{client.first_bare}\n".encode())
    assert (await raw.line()).startswith(b"ERR BAD-AUTH")
    await raw.close()
