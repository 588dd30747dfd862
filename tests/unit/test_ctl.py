"""``cdcserver ctl`` without a service: its tables for a terminal, and its HTTP side against a
small scripted stand-in for the admin API (refusals, a failed dump, HTTPS)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cdcserver.app import ctldumps, ctlformat
from cdcserver.app.cli import main as cdcserver_main
from tests.helpers import self_signed_certificate

Answer = tuple[int, Any]  # HTTP status, JSON document (or bytes as they are)


class FakeApi:
    """An HTTP server answering each request with ``script(method, path, body)``; it records
    what it was asked and with which Authorization header."""

    def __init__(self, script: Callable[[str, str, Any], Answer],
                 context: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, str, Any, str | None]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                api.requests.append((self.command, self.path, body,
                                     self.headers.get("Authorization")))
                status, document = script(self.command, self.path, body)
                data = document if isinstance(document, bytes) else json.dumps(document).encode()
                self.send_response(status)
                if 300 <= status < 400:  # elsewhere, where the token must not go
                    self.send_header("Location", "http://127.0.0.1:1/api/v1/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_file(tmp_path) -> str:
    path = str(tmp_path / "admin.token")
    with open(path, "w") as f:
        f.write("  the-admin-token-0123456789\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def fake() -> Iterator[Callable[..., FakeApi]]:
    made: list[FakeApi] = []

    def make(script: Callable[[str, str, Any], Answer], context: ssl.SSLContext | None = None
             ) -> FakeApi:
        made.append(FakeApi(script, context))
        return made[-1]

    yield make
    for api in made:
        api.close()


def _ctl(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cdcserver_main(["ctl", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- for a person ----------------------------------------------------------------------------

def test_sizes_and_columns():
    sizes = (None, 0, 1023, 1024, 1887437, 1048575, 5 * 2**40)
    assert [ctlformat.human_bytes(n) for n in sizes] == \
        ["-", "0 B", "1023 B", "1.0 KiB", "1.8 MiB", "1.0 MiB", "5.0 TiB"]
    assert ctlformat.render_table(["NAME", "SIZE", "NOTE"], [["a", "1.0 KiB", ""],
                                                        ["longer", "12 B", "x"]],
                            right=["SIZE"]) == (
        "NAME       SIZE  NOTE\n"
        "a       1.0 KiB\n"
        "longer     12 B  x")
    assert ctlformat.render_table(["ID", "USER"], []) == "ID  USER"


# The examples of docs/admin.md.
CLIENT = {"id": 12, "address": "10.0.0.7:51234", "user": "reader", "uuid": "a3c5",
          "format": "AVRO", "dialect": "maxscale", "phase": "streaming",
          "reading": "shop.orders", "request": "REQUEST-DATA shop.orders 0-1-4000",
          "kind": "stream", "position": {"version": 2, "offset": 183211, "gtid": "0-1-4709"},
          "behind": {"bytes": 1887437, "seconds": 75.0}, "records_sent": 5210,
          "bytes_sent": 1834411, "bytes_per_second": 1203.5,
          "connected_at": "2026-11-28T17:20:00+00:00"}
LOGGING_IN = {**CLIENT, "id": 13, "address": "10.0.0.8:4000", "user": None, "format": None,
              "dialect": None, "phase": "login", "reading": None, "kind": None,
              "position": None, "behind": None, "bytes_per_second": 0.0}


def test_clients_table():
    since = dt.datetime.fromisoformat(CLIENT["connected_at"]).astimezone()
    # another day in every zone (17 h later in UTC was the same day from UTC+13)
    text = ctlformat.render_clients([CLIENT, LOGGING_IN], now=since + dt.timedelta(days=2))
    day = f"{since:%Y-%m-%d %H:%M}"
    assert text.splitlines() == [
        "ID  ADDRESS         USER    FORMAT  READING      POSITION       BEHIND              "
        "      RATE  SINCE",
        "12  10.0.0.7:51234  reader  AVRO    shop.orders  0-1-4709 (v2)  1.8 MiB, 1 min 15 s  "
        f"1.2 KiB/s  {day}",
        "13  10.0.0.8:4000   -       -       (login)      -              -                   "
        f"     0 B/s  {day}"]


def test_tables_table():
    tables = [{"table": "shop.orders", "database": "shop", "name": "orders",
               "versions": [{"version": 1}, {"version": 2}], "records": 52100,
               "bytes": 1924622, "last_gtid": "0-1-4709", "quarantined": None, "clients": 3},
              {"table": "shop.odd", "database": "shop", "name": "odd", "versions": [{}],
               "records": None, "bytes": 10, "last_gtid": None,
               "quarantined": {"cause": "a row that does not fit", "since": "0-1-4000",
                               "resyncing": True}, "clients": 0}]
    assert ctlformat.render_tables(tables).splitlines() == [
        "TABLE        VERSIONS  RECORDS     SIZE  LAST GTID  STATE",
        "shop.orders         2   52,100  1.8 MiB  0-1-4709   ok",
        "shop.odd            1        -     10 B  -          quarantined (resyncing): a row "
        "that does not fit"]


def test_a_time_is_its_time_of_day_today_and_its_date_and_time_on_any_other_day():
    # Both branches at fixed instants: the answer depends on the local zone (the zone the
    # suite runs in), never on the day the suite runs.
    started = "2026-11-28T17:31:00+00:00"
    local = dt.datetime.fromisoformat(started).astimezone()
    assert ctlformat.when(started, now=local) == f"{local:%H:%M:%S}"
    assert ctlformat.when(started, now=local + dt.timedelta(days=3)) == f"{local:%Y-%m-%d %H:%M}"
    naive = "2026-11-28T17:31:00"  # no offset: taken as UTC, as the admin API writes
    assert ctlformat.when(naive, now=local) == f"{local:%H:%M:%S}"
    assert ctlformat.when(None) == "-" and ctlformat.when("not a time") == "not a time"


def test_dumps_table_with_the_dumps_being_taken():
    started = "2026-11-28T17:31:00+00:00"
    now = dt.datetime.fromisoformat(started) + dt.timedelta(days=2)  # another day anywhere
    at = f"{dt.datetime.fromisoformat(started).astimezone():%Y-%m-%d %H:%M}"
    text = ctlformat.render_dumps({
        "dumps": [{"name": "shop.orders.20261128T172000Z.dump", "table": "shop.orders",
                   "bytes": 4410023, "rows": 52100, "created": "2026-11-28T17:20:00+00:00",
                   "gtid": "0-1-4000", "readers": [12, 14]}],
        "taking": [{"ref": "shop.orders", "database": "shop", "table": "orders",
                    "state": "running", "rows": 20000, "estimated_rows": 52100,
                    "started": started},
                   {"ref": "shop.x", "database": "shop", "table": "x", "state": "queued",
                    "rows": 0, "estimated_rows": 0},
                   {"ref": "shop.y", "database": "shop", "table": "y", "state": "failed",
                    "rows": 0, "estimated_rows": 0, "error": "lost the connection"}]}, now=now)
    assert text.splitlines() == [
        "NAME                               TABLE           SIZE    ROWS  GTID      READERS",
        "shop.orders.20261128T172000Z.dump  shop.orders  4.2 MiB  52,100  0-1-4000  12, 14",
        "",
        "Being taken:",
        "TABLE        STATE                      PROGRESS  STARTED           ERROR",
        f"shop.orders  running  20,000 / 52,100 rows (38%)  {at}",
        "shop.x       queued                            -  -",
        "shop.y       failed                       0 rows  -                 lost the connection"]


def test_replication_summary():
    text = ctlformat.render_replication({
        "state": "paused", "problems": ["the data directory's disk is full"],
        "source": {"current": "db1:3306", "sources": 2, "switches": 1, "refused": []},
        "position": "0-1-4711", "last_commit": "2026-11-28T17:30:00+00:00",
        "lag_seconds": 0.4, "lag_transactions": 3, "lag_measured_at": None,
        "transactions": 4711, "queue": {"bytes": 0, "capacity": 67108864},
        "quarantined": [{"table": "shop.odd", "cause": "bad row", "since": "0-1-4000",
                         "resyncing": False}]})
    lines = text.splitlines()
    assert lines[0] == "State         paused"
    assert "Source        db1:3306 (2 sources; 1 switches)" in lines
    assert "Lag           0.4 s, 3 transactions" in lines
    assert "Transactions  4,711" in lines and "Queue         0 B of 64.0 MiB" in lines
    assert "Problems      the data directory's disk is full" in lines
    assert "Quarantined   shop.odd since 0-1-4000: bad row" in lines
    lines = ctlformat.render_replication({"state": "starting", "lag_seconds": None,
                                    "lag_transactions": 1}).splitlines()
    assert "Lag           1 transaction" in lines and "Position      (nothing applied yet)" \
        in lines and "Problems      none" in lines and "Quarantined   none" in lines
    assert "Lag           not measured yet" in ctlformat.render_replication({}).splitlines()


# -- over HTTP -------------------------------------------------------------------------------

def test_options_before_or_after_the_action_and_the_bearer_token(fake, token_file, capsys):
    api = fake(lambda method, path, body: (200, {"users": 4}))
    url = f"http://127.0.0.1:{api.port}"
    assert _ctl(capsys, "--url", url, "--token-file", token_file, "reload-users") == \
        (0, "read the users file again: 4 users\n", "")
    assert _ctl(capsys, "reload-users", "--json", "--url", url + "/",
                "--token-file", token_file) == (0, '{\n "users": 4\n}\n', "")
    assert api.requests == [("POST", "/api/v1/users/reload", None,
                             "Bearer the-admin-token-0123456789")] * 2


def test_refusals_are_one_line(fake, token_file: str, capsys, monkeypatch):
    answers: dict[str, Answer] = {
        "/api/v1/tables": (401, {"error": "this needs the admin token"}),
        "/api/v1/clients": (404, {"error": "no such thing"}),
        "/api/v1/dumps": (502, b"<html>a proxy</html>"),
        "/api/v1/replication": (200, b"not json"),
        "/api/v1/users/reload": (307, {}),
    }
    api = fake(lambda method, path, body: answers[path])
    url = f"http://127.0.0.1:{api.port}"
    monkeypatch.setenv("CDCSERVER_ADMIN_TOKEN", "from-the-environment")
    code, out, err = _ctl(capsys, "--url", url, "tables")
    assert (code, out) == (1, "")
    assert err == (f"cdcserver ctl: the admin API at {url} refused the token in "
                   "$CDCSERVER_ADMIN_TOKEN (this needs the admin token): give the content of "
                   "the service's [admin] token_file with --token-file FILE or "
                   "$CDCSERVER_ADMIN_TOKEN\n")
    assert api.requests[-1][3] == "Bearer from-the-environment"
    assert _ctl(capsys, "--url", url, "clients") == (1, "", "cdcserver ctl: no such thing\n")
    code, _, err = _ctl(capsys, "--url", url, "dumps")
    assert code == 1 and "answered HTTP 502, not the admin API's JSON" in err
    code, _, err = _ctl(capsys, "--url", url, "replication")
    assert code == 1 and "with something that is not JSON" in err
    code, _, err = _ctl(capsys, "--url", url, "reload-users")  # not followed
    assert code == 1 and "answered HTTP 307, not the admin API's JSON" in err


def test_no_token_says_how_to_give_one(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("CDCSERVER_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("CDCSERVER_ADMIN_TOKEN_FILE", raising=False)
    code, out, err = _ctl(capsys, "--url", "http://127.0.0.1:1", "clients")
    assert (code, out) == (2, "")
    assert err.startswith("cdcserver ctl: no admin token: give the file holding it with "
                          "--token-file FILE, the token itself in $CDCSERVER_ADMIN_TOKEN")
    code, _, err = _ctl(capsys, "--url", "http://127.0.0.1:1", "--token-file",
                        str(tmp_path / "missing"), "clients")
    assert code == 2 and "No such file or directory: cannot read the admin token" in err
    code, _, err = _ctl(capsys, "--url", "ftp://x", "--token-file", "f", "clients")
    assert code == 2 and "give the admin API as http://HOST:PORT" in err


def test_dump_progress_ends_at_the_failure(fake, token_file, capsys, monkeypatch):
    monkeypatch.setattr(ctldumps, "POLL", 0.01)
    taking = iter([
        [{"ref": "shop.a", "state": "running", "rows": 10, "estimated_rows": 100},
         {"ref": "shop.b", "state": "queued", "rows": 0, "estimated_rows": 0}],
        [{"ref": "shop.b", "state": "running", "rows": 5, "estimated_rows": 50}],
        [{"ref": "shop.b", "state": "failed", "rows": 0, "estimated_rows": 0,
          "error": "the source went away"}],
    ])
    old = {"name": "shop.a.1.dump", "table": "shop.a", "rows": 1}
    new = {"name": "shop.a.2.dump", "table": "shop.a", "rows": 100}
    looks = []

    def script(method: str, path: str, body: Any) -> Answer:
        if method == "POST":
            return 202, {"queued": ["shop.b"], "under_way": ["shop.a"]}
        looks.append(path)
        if len(looks) == 1:  # before the request
            return 200, {"dumps": [old], "taking": []}
        return 200, {"dumps": [old] + ([new] if len(looks) > 2 else []),
                     "taking": next(taking, [])}

    api = fake(script)
    code, out, err = _ctl(capsys, "--url", f"http://127.0.0.1:{api.port}", "--token-file",
                          token_file, "dump", "shop.a", "shop.b", "--progress")
    assert api.requests[1][:3] == ("POST", "/api/v1/dumps", {"tables": ["shop.a", "shop.b"]})
    assert (code, out) == (1, "shop.a.2.dump\n")
    assert err.endswith("cdcserver ctl: the dump of shop.b failed: the source went away\n")
    assert "100/100" in err  # shop.a's bar, at its end
    assert len(looks) == 4


def test_https_with_the_listeners_certificate(fake, token_file, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("CDCSERVER_ADMIN_TOKEN", raising=False)
    cert, key = self_signed_certificate(str(tmp_path))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    api = fake(lambda method, path, body: (200, {"disconnected": 7}), context)
    url = f"https://127.0.0.1:{api.port}"
    code, out, err = _ctl(capsys, "--url", url, "--token-file", token_file, "kick", "7")
    assert (code, out) == (1, "")
    assert "the service's certificate is not trusted" in err and "--cacert" in err
    assert _ctl(capsys, "--url", url, "--token-file", token_file, "--cacert", cert,
                "kick", "7") == (0, "disconnected client 7\n", "")
    # From a configuration: https because of its tls_cert, which is trusted as it is.
    config = tmp_path / "cdcserver.toml"
    config.write_text(f'[admin]\nlisten = "0.0.0.0:{api.port}"\ntoken_file = "{token_file}"\n'
                      f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    assert _ctl(capsys, "--config", str(config), "kick", "7") == \
        (0, "disconnected client 7\n", "")
    assert api.requests[-1][:2] == ("DELETE", "/api/v1/clients/7")
    code, _, err = _ctl(capsys, "--url", f"http://127.0.0.1:{api.port}", "--token-file",
                        token_file, "--timeout", "2", "kick", "7")
    assert code == 1 and "Connection reset" in err and "an HTTPS listener?" in err


def test_a_table_in_a_path_is_percent_encoded(fake, token_file, capsys):
    api = fake(lambda method, path, body: (202, {"resyncing": "`my.db`.t"}))
    code, out, _ = _ctl(capsys, "--url", f"http://127.0.0.1:{api.port}", "--token-file",
                        token_file, "resync", "`my.db`.t")
    assert code == 0 and out.startswith("resyncing `my.db`.t")
    assert api.requests[0][:2] == ("POST", "/api/v1/tables/%60my.db%60.t/resync")
