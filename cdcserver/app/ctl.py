"""``cdcserver ctl``: the admin API (docs/admin.md) from a terminal, as ``maxctrl`` is MaxScale's.

    cdcserver ctl [--url URL] [--token-file FILE] [--cacert FILE] [--json] [--timeout S]
                  [--config FILE] COMMAND
      replication                 the replication's state, source, position, lag, problems
      clients                     the connections, and how far behind each stream is
      tables                      the stored tables, their versions, sizes and state
      dumps                       the complete dumps, and those being taken
      dump DB.TABLE|DB.* [...] [--progress]   take dumps (follow them to the end)
      resync DB.TABLE [...]       resync quarantined tables now
      kick ID                     disconnect a client
      reload-users                read the users file again now

The API's address is ``--url``, else ``[admin] listen`` of the configuration (HTTPS when it
has a ``tls_cert``); the token is ``--token-file``'s, else ``CDCSERVER_ADMIN_TOKEN``'s, else
``[admin] token_file``'s. Tables are printed for a person; ``--json`` prints the API's JSON.
Standard library HTTP only (urllib): nothing more to install. Exit 0 on success, 1 when the
API refuses or cannot be reached, 2 when there is no token or the configuration is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcserver.app.ctlformat import (
    render_clients,
    render_dumps,
    render_replication,
    render_tables,
    thousands,
)
from cdcserver.app.process import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cdcserver.core import config as cfg
from cdcserver.core.errors import ConfigError
from cdcserver.core.options import ADMIN_TOKEN_VARIABLE
from mariadb_cdc_client.format.names import BadTableRef, parse_table, table_ref

PROG = "cdcserver ctl"
TOKEN_VARIABLE = ADMIN_TOKEN_VARIABLE
TIMEOUT = 10.0  # seconds, per request
RESYNC_PATH = "/api/v1/tables/{table}/resync"  # the table percent-encoded
POLL = 0.5  # seconds between looks at a dump being taken
# A dump that left ``taking`` without failing is listed in ``dumps`` by the next look or so;
# after this long without it, something removed it (say, the retention cleaner).
VANISHED_AFTER = 10.0


class CtlError(Exception):
    """What ``cdcserver ctl`` prints as ``cdcserver ctl: <why>`` (with its exit status)."""

    def __init__(self, why: str, status: int = EXIT_FAILED) -> None:
        super().__init__(why)
        self.status = status


# -- the command line ----------------------------------------------------------------------

def add_command(commands: Any) -> None:
    """``ctl`` and its actions, under ``cdcserver``'s subcommands."""
    ctl = commands.add_parser("ctl", help="a running service's admin API from the terminal "
                                          "(clients, tables, dumps, resync, kick; docs/admin.md)",
                              description="The admin API of a running service (docs/admin.md), as "
                                          "maxctrl is MaxScale's: tables for a person, --json "
                                          "for a script.")
    _common_options(ctl)
    ctl.set_defaults(**_COMMON_DEFAULTS)
    actions = ctl.add_subparsers(metavar="ACTION", required=True)

    def action(name: str, handler: Callable[[Api, argparse.Namespace], int], helptext: str
               ) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=helptext, description=helptext)
        _common_options(sub)  # the options may follow the action too
        sub.set_defaults(handler=lambda args: run(args, handler))
        return sub

    action("replication", show_replication, "the replication: state, source, position, lag, "
                                            "problems, quarantined tables")
    action("clients", show_clients, "the connected clients, what each reads and how far "
                                    "behind it is")
    action("tables", show_tables, "the stored tables: versions, records, size, state")
    action("dumps", show_dumps, "the complete dumps and their readers, and the dumps being "
                                "taken")
    dump = action("dump", take_dumps, "take dumps of tables now, without stopping replication")
    dump.add_argument("tables", nargs="+", metavar="DB.TABLE|DB.*",
                      help="the tables to dump (DB.*: every table of DB)")
    dump.add_argument("--progress", action="store_true",
                      help="follow the dumps until they are complete, with a progress bar "
                           "each (exit 1 if one fails)")
    resync = action("resync", resync_tables, "resync quarantined tables now")
    resync.add_argument("tables", nargs="+", metavar="DB.TABLE",
                        help="quarantined tables (as `cdcserver ctl tables` names them)")
    kick = action("kick", kick_client, "disconnect a client (it gets ERR FORBIDDEN)")
    kick.add_argument("id", type=int, metavar="ID", help="the client's id (`cdcserver ctl "
                                                         "clients`)")
    action("reload-users", reload_users, "read the users file again now (ends the sessions "
                                         "of removed users)")


_COMMON_DEFAULTS: dict[str, Any] = {"url": None, "token_file": None, "cacert": None,
                                    "json": False, "timeout": TIMEOUT, "config": None}


def _common_options(parser: argparse.ArgumentParser) -> None:
    """ctl's options, on ``ctl`` and on each action: given before or after the action. Their
    defaults are ``ctl``'s (:data:`_COMMON_DEFAULTS`); an action's own parser sets only what
    was given to it, so it does not undo what was given before it."""
    default = argparse.SUPPRESS
    parser.add_argument("--url", default=default, metavar="URL",
                        help="the admin API, http://HOST:PORT or https://HOST:PORT (default: "
                             "from [admin] listen and tls_cert of the configuration)")
    parser.add_argument("--token-file", default=default, metavar="FILE",
                        help=f"the file holding the admin token (default: ${TOKEN_VARIABLE}, "
                             "else [admin] token_file of the configuration)")
    parser.add_argument("--cacert", default=default, metavar="FILE",
                        help="trust the certificate authorities in this PEM file for HTTPS "
                             "(e.g. a self-signed admin.tls_cert)")
    parser.add_argument("--json", action="store_true", default=default,
                        help="print the API's JSON as it is (for scripts)")
    parser.add_argument("--timeout", type=float, default=default, metavar="SECONDS",
                        help=f"seconds to wait for each answer (default {TIMEOUT:g})")
    parser.add_argument("--config", default=default, metavar="FILE",
                        help="the service's TOML file (its [admin] section is read)")


def run(args: argparse.Namespace,
        handler: Callable[[Api, argparse.Namespace], int]) -> int:
    """Run one action; its failure is one line on stderr."""
    try:
        return handler(Api.of(args), args)
    except CtlError as exc:
        _err(f"{PROG}: {exc}")
        return exc.status
    except ConfigError as exc:
        _err(f"{PROG}: {exc}")
        return EXIT_USAGE


# -- the API -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    value: str
    origin: str  # where it came from, in words (for a refusal)


class Api:
    """JSON requests to the admin API, with the bearer token; errors become :class:`CtlError`."""

    def __init__(self, url: str, token: Token, timeout: float = TIMEOUT,
                 context: ssl.SSLContext | None = None, url_origin: str = "--url") -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.url_origin = url_origin
        # No proxy and no redirect: the token goes to the service and nowhere else.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({}),
                                                      _NoRedirect()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def of(cls, args: argparse.Namespace) -> Api:
        loaded: list[cfg.Config] = []

        def config() -> cfg.Config:
            if not loaded:
                loaded.append(cfg.Config.load(args.config))
            return loaded[0]

        if args.url:
            url, origin, trusted = args.url, "--url", None
        else:
            url, origin, trusted = _url_of(config().admin, args.config)
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise CtlError(f"--url {url}: give the admin API as http://HOST:PORT or "
                           "https://HOST:PORT", EXIT_USAGE)
        if args.timeout <= 0:
            raise CtlError("--timeout must be more than 0 seconds", EXIT_USAGE)
        context = None
        if parsed.scheme == "https":
            context = ssl.create_default_context()
            for cafile in (args.cacert, trusted):
                if cafile:
                    try:
                        context.load_verify_locations(cafile)
                    except (OSError, ssl.SSLError) as exc:
                        if cafile == args.cacert:
                            raise CtlError(f"--cacert {cafile}: {exc}", EXIT_USAGE) from exc
        return cls(url, _token(args, config), args.timeout, context, origin)

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token.value}",
                     "Accept": "application/json",
                     **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return self._document(response.read(), response.status)
        except urllib.error.HTTPError as exc:
            with exc:
                raise self._refused(exc.code, exc.read()) from None
        except urllib.error.URLError as exc:
            raise self._unreachable(exc.reason) from None
        except TimeoutError:
            raise CtlError(f"{self.url} did not answer within {self.timeout:g} s (--timeout)"
                           ) from None
        except (ConnectionError, OSError) as exc:  # e.g. reset before the answer
            raise self._unreachable(exc) from None

    def _document(self, body: bytes, status: int) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            raise CtlError(f"{self.url} answered HTTP {status} with something that is not "
                           "JSON: is it the admin API (--url)?") from None

    def _refused(self, status: int, body: bytes) -> CtlError:
        try:
            document = json.loads(body)
            why = document["error"] if isinstance(document, dict) else None
        except (ValueError, KeyError):
            why = None
        if status == 401:
            return CtlError(f"the admin API at {self.url} refused the token {self.token.origin}"
                            f"{f' ({why})' if why else ''}: give the content of the service's "
                            "[admin] token_file with --token-file FILE or "
                            f"${TOKEN_VARIABLE}")
        if why is None:
            return CtlError(f"{self.url} answered HTTP {status}, not the admin API's JSON: is "
                            "it the admin API (--url)?")
        return CtlError(str(why))

    def _unreachable(self, reason: object) -> CtlError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return CtlError(f"{self.url}: the service's certificate is not trusted "
                            f"({reason.verify_message}): give its CA (or a self-signed "
                            "certificate itself) with --cacert FILE, and a --url with the "
                            "name the certificate holds")
        if isinstance(reason, ssl.SSLError):
            return CtlError(f"{self.url}: TLS failed ({reason}): is the admin listener "
                            "HTTPS (an [admin] tls_cert) or plain HTTP?")
        if isinstance(reason, TimeoutError):
            return CtlError(f"{self.url} did not answer within {self.timeout:g} s (--timeout)")
        if isinstance(reason, ConnectionRefusedError):
            return CtlError(f"nothing answers at {self.url} (connection refused; address "
                            f"from {self.url_origin}): is the service running, with an "
                            "[admin] token_file? Give the admin API's address with --url "
                            "http://HOST:PORT, or the configuration holding its [admin] listen "
                            "with --config FILE")
        if isinstance(reason, socket.gaierror):
            return CtlError(f"{self.url}: no such host ({reason.strerror}; address from "
                            f"{self.url_origin}): give the admin API's address with --url")
        why = getattr(reason, "strerror", None) or reason
        if isinstance(reason, ConnectionResetError) and self.url.startswith("http:"):
            return CtlError(f"{self.url} closed the connection ({why}): an HTTPS listener? "
                            "Then give --url https://HOST:PORT")
        return CtlError(f"cannot reach the admin API at {self.url} ({why}; address from "
                        f"{self.url_origin}): give it with --url http://HOST:PORT, or the "
                        "configuration holding its [admin] listen with --config FILE")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (an error: the API has none), never followed with the token."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _url_of(admin: cfg.AdminConfig, config_file: str | None) -> tuple[str, str, str | None]:
    """The admin API's URL as seen on this host (a wildcard address is reached on the
    loopback), where it came from, and a certificate to trust (the listener's own, which is
    what a self-signed one needs)."""
    host, port = admin.host_port()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if admin.tls_cert else "http"
    origin = f"[admin] listen of {config_file}" if config_file else \
        "the default [admin] listen, no --config given"
    trusted = admin.tls_cert if admin.tls_cert and os.access(admin.tls_cert, os.R_OK) else None
    return f"{scheme}://{host}:{port}", origin, trusted


def _token(args: argparse.Namespace, config: Callable[[], cfg.Config]) -> Token:
    if args.token_file:
        return Token(_read_token(args.token_file, "--token-file"),
                     f"read from --token-file {args.token_file}")
    given = os.environ.get(TOKEN_VARIABLE, "").strip()
    if given:
        return Token(given, f"in ${TOKEN_VARIABLE}")
    path = config().admin.token_file
    if not path:
        raise CtlError("no admin token: give the file holding it with --token-file FILE, the "
                       f"token itself in ${TOKEN_VARIABLE}, or the service's configuration "
                       "(its [admin] token_file) with --config FILE", EXIT_USAGE)
    where = f"[admin] token_file of {args.config}" if args.config else "[admin] token_file"
    return Token(_read_token(path, where), f"read from {path} ({where})")


def _read_token(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            token = f.read(4096).strip()
    except OSError as exc:
        raise CtlError(f"{where} {path}: {exc.strerror}: cannot read the admin token",
                       EXIT_USAGE) from exc
    if not token:
        raise CtlError(f"{where} {path} is empty: it must hold the admin token", EXIT_USAGE)
    return token


def _table_path(text: str) -> str:
    """A table as a path of the API names it: its protocol reference, percent-encoded."""
    ref = _table(text)
    return urllib.parse.quote(ref, safe="")


def _table(text: str) -> str:
    try:
        parsed = parse_table(text)
    except BadTableRef as exc:
        raise CtlError(f"{text!r} is not a table: {exc}", EXIT_USAGE) from None
    return table_ref(parsed.database, parsed.table)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def _print_json(document: Any) -> None:
    _out(json.dumps(document, indent=1, ensure_ascii=False))


# -- the actions -----------------------------------------------------------------------------

def listing(path: str, render: Callable[[Any], str]) -> Callable[[Api, argparse.Namespace], int]:
    """An action that prints what ``GET path`` answers: ``render``'s table, or the JSON."""
    def show(api: Api, args: argparse.Namespace) -> int:
        document = api.get(path)
        _out(json.dumps(document, indent=1, ensure_ascii=False) if args.json
             else render(document))
        return EXIT_OK
    return show


show_replication = listing("/api/v1/replication", render_replication)
show_clients = listing("/api/v1/clients", lambda d: render_clients(d["clients"]))
show_tables = listing("/api/v1/tables", lambda d: render_tables(d["tables"]))
show_dumps = listing("/api/v1/dumps", render_dumps)


def take_dumps(api: Api, args: argparse.Namespace) -> int:
    names = [text if text.strip().endswith(".*") else _table(text) for text in args.tables]
    before: set[str] = set()
    if args.progress:
        before = {d["name"] for d in api.get("/api/v1/dumps")["dumps"]}
    answer = api.call("POST", "/api/v1/dumps", {"tables": names})
    queued: list[str] = list(answer.get("queued", []))
    under_way: list[str] = list(answer.get("under_way", []))
    if not args.progress:
        if args.json:
            _print_json(answer)
        else:
            if queued:
                _out(f"queued: {', '.join(queued)} (`{PROG} dumps` shows the progress)")
            if under_way:
                _out(f"under way already: {', '.join(under_way)}")
        return EXIT_OK
    return _follow(api, [*queued, *under_way], before, args.json)


def _follow(api: Api, tables: list[str], before: set[str], as_json: bool) -> int:
    """Poll ``GET /api/v1/dumps`` until each table's dump is complete (a new one is listed)
    or failed, with a progress bar each on stderr."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def bar_of(table: str, total: int | None = None) -> Any:
        """The table's bar, made at the first look (with the source's estimate, if any)."""
        if table not in bars:
            bars[table] = tqdm(total=total or None, desc=table, unit=" rows", unit_scale=True,
                               position=tables.index(table), file=sys.stderr,
                               dynamic_ncols=True)
        return bars[table]

    done: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    gone_since: dict[str, float] = {}
    try:
        while len(done) + len(failed) < len(tables):
            document = api.get("/api/v1/dumps")
            taking = {entry.get("ref") or table_ref(entry["database"], entry["table"]): entry
                      for entry in document.get("taking", [])}
            fresh = {d["table"]: d for d in document["dumps"] if d["name"] not in before}
            for table in tables:
                if table in done or table in failed:
                    continue
                entry = taking.get(table)
                bar = bar_of(table, int((entry or {}).get("estimated_rows") or 0))
                if entry is not None and entry.get("state") == "failed":
                    failed[table] = entry.get("error") or "the dump failed"
                    bar.set_postfix_str("failed", refresh=False)
                    bar.close()
                elif entry is not None:
                    gone_since.pop(table, None)
                    _progressed(bar, entry)
                elif table in fresh:
                    done[table] = dump = fresh[table]
                    rows = int(dump.get("rows") or 0)
                    bar.set_postfix_str("done", refresh=False)
                    if rows:
                        bar.total = max(rows, bar.n)
                        bar.update(rows - bar.n)
                    bar.close()
                elif time.monotonic() - gone_since.setdefault(table, time.monotonic()) > \
                        VANISHED_AFTER:
                    failed[table] = "no longer being taken, but no new dump of it is listed"
                    bar.close()
            if len(done) + len(failed) < len(tables):
                time.sleep(POLL)
    except KeyboardInterrupt:
        for bar in bars.values():
            bar.close()
        sys.stderr.write("\n")
        _err(f"{PROG}: stopped following; the dumps go on in the service (`{PROG} dumps`)")
        return EXIT_FAILED
    finally:
        for bar in bars.values():
            bar.close()
    if as_json:
        _print_json({"dumps": list(done.values()),
                     "failed": [{"table": t, "error": e} for t, e in failed.items()]})
    else:
        for table in tables:
            if table in done:
                _out(done[table]["name"])
    for table, error in failed.items():
        _err(f"{PROG}: the dump of {table} failed: {error}")
    return EXIT_FAILED if failed else EXIT_OK


def _progressed(bar: Any, entry: dict[str, Any]) -> None:
    rows, estimate = int(entry.get("rows") or 0), int(entry.get("estimated_rows") or 0)
    if estimate and bar.total != max(estimate, rows):
        bar.total = max(estimate, rows)  # an estimate that was low grows with the rows
    bar.set_postfix_str(str(entry.get("state", "")), refresh=False)
    bar.update(rows - bar.n)


def resync_tables(api: Api, args: argparse.Namespace) -> int:
    status = EXIT_OK
    answers = []
    for text in args.tables:
        try:
            answer = api.call("POST", RESYNC_PATH.format(table=_table_path(text)))
        except CtlError as exc:
            _err(f"{PROG}: {exc}")
            status = max(status, exc.status)
            continue
        answers.append(answer)
        if not args.json:
            _out(f"resyncing {answer.get('resyncing', text)} (`{PROG} tables` shows when it "
                 "is released)")
    if args.json and answers:
        _print_json(answers[0] if len(answers) == 1 else answers)
    return status


def kick_client(api: Api, args: argparse.Namespace) -> int:
    answer = api.call("DELETE", f"/api/v1/clients/{args.id}")
    if args.json:
        _print_json(answer)
    else:
        _out(f"disconnected client {answer.get('disconnected', args.id)}")
    return EXIT_OK


def reload_users(api: Api, args: argparse.Namespace) -> int:
    answer = api.call("POST", "/api/v1/users/reload")
    if args.json:
        _print_json(answer)
    else:
        users = answer.get("users")
        _out(f"read the users file again: {thousands(users)} "
             f"{'user' if users == 1 else 'users'}")
    return EXIT_OK
