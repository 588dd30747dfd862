"""The admin API as ``cdcserver ctl`` reaches it: its address (``--url``, else the
configuration's ``[admin] listen``), the bearer token, JSON requests over the standard
library's urllib (no proxy, no redirect: the token goes to the service and nowhere else),
and what each failure says, as one line that tells what to give instead."""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcserver.app.process import EXIT_FAILED, EXIT_USAGE
from cdcserver.core import config as cfg
from cdcserver.core.options import ADMIN_TOKEN_VARIABLE
from mariadb_cdc_client.format.names import BadTableRef, parse_table, table_ref

PROG = "cdcserver ctl"
TOKEN_VARIABLE = ADMIN_TOKEN_VARIABLE
TIMEOUT = 10.0  # seconds, per request


class CtlError(Exception):
    """What ``cdcserver ctl`` prints as ``cdcserver ctl: <why>`` (with its exit status)."""

    def __init__(self, why: str, status: int = EXIT_FAILED) -> None:
        super().__init__(why)
        self.status = status


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


def table_path(text: str) -> str:
    """A table as a path of the API names it: its protocol reference, percent-encoded."""
    ref = table_named(text)
    return urllib.parse.quote(ref, safe="")


def table_named(text: str) -> str:
    """``text`` as the API names a table (its reference in protocol.md's grammar)."""
    try:
        parsed = parse_table(text)
    except BadTableRef as exc:
        raise CtlError(f"{text!r} is not a table: {exc}", EXIT_USAGE) from None
    return table_ref(parsed.database, parsed.table)
