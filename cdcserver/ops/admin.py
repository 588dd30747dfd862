"""The admin API and the web console (docs/admin.md): JSON over HTTP(S) on a listener of its own.

aiohttp serves it (routing, request bodies, keep-alive, TLS, static files): the monitoring
endpoint's few fixed GET routes are small enough to answer by hand (``monitoring.py``), an API
with bodies, methods, path parameters and a console is not. Everything under ``/api/`` needs
the bearer token of ``[admin] token_file``; the console's static files need none (they hold
nothing but code: the console asks the operator for the token), nor do ``/live`` and
``/ready``. What the API reports and does comes from an :class:`AdminState` (the service's is
``cdcserver/app/adminview.py``), on the service's own event loop. Its answers and the
requests' bodies are read and written by ``adminjson.py``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from cdcserver.ops.adminjson import (
    MAX_BODY,
    Refused,
    answer,
    dump_refs,
    error_answer,
    http_reason,
    path_table,
    read_body,
)
from cdcserver.ops.httpgate import ConnectionGate, GatedProtocol, client_host

log = logging.getLogger(__name__)

CONSOLE = Path(__file__).with_name("console")  # index.html, console.js, console.css
MIN_TOKEN = 16  # characters
# The console is served from here only: no inline script, no other origin, no framing.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
Probe = Callable[[], tuple[bool, dict[str, Any]]]


class AdminState(Protocol):
    """What the API reads and does (each a JSON-ready value; :class:`Refused` when it
    cannot)."""

    def replication(self) -> dict[str, Any]: ...
    async def clients(self) -> list[dict[str, Any]]: ...
    async def tables(self) -> list[dict[str, Any]]: ...
    async def dumps(self) -> dict[str, Any]: ...
    async def take_dumps(self, refs: list[tuple[str, str | None]]
                         ) -> dict[str, list[str]]: ...
    def resync(self, table: TableName) -> str: ...
    def disconnect(self, client_id: int) -> None: ...
    async def reload_users(self) -> int: ...


class TokenFile:
    """The bearer token: the file's content, stripped; read again when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature: tuple[int, int, int, int] | None = None
        self._token = b""

    def current(self) -> bytes:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise ConfigError(f"admin.token_file {self.path}: {exc.strerror}") from exc
        signature = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)  # chmod counts too
        if signature != self._signature:
            self._token = _read_token(self.path, st)
            self._signature = signature
        return self._token

    def accepts(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return False
        try:
            token = self.current()
        except ConfigError as exc:  # removed or loosened meanwhile: nobody gets in
            self._unusable(str(exc))
            return False
        self._unusable_said = ""
        # (surrogateescape: a header's bytes that are not UTF-8 reach here as surrogates,
        # which the strict codec refused with an error, a 500 and a traceback, before any
        # login: found by attack; they are a wrong token like any other)
        return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token)

    _unusable_said = ""
    _unusable_at = 0.0

    def _unusable(self, why: str) -> None:
        """Say once (and again each minute it lasts) that the file cannot be used: every
        request that comes meanwhile is refused, and would otherwise log a line each."""
        now = time.monotonic()
        if why != self._unusable_said or now - self._unusable_at >= 60.0:
            log.error("admin API: %s; every request is refused until it is fixed", why)
            self._unusable_said, self._unusable_at = why, now


class TokenGuesses:
    """Wrong tokens, by address: past ``limit`` within ``window`` seconds an address is
    answered 429 without its token being compared, until the oldest of them leaves the
    window; each is logged, the first ``first`` of a minute one line each, then summed up."""

    def __init__(self, limit: int = 10, window: float = 60.0, first: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.first, self.clock = limit, window, first, clock
        self._failed: dict[str, list[float]] = {}
        self._logged = 0
        self._more: Counter[str] = Counter()
        self._since = clock()

    def wait(self, host: str) -> float:
        """Seconds ``host`` must wait before a token of its is compared again (0: now)."""
        times = self._recent(host)
        return 0.0 if len(times) < self.limit else times[0] + self.window - self.clock()

    def failed(self, host: str) -> None:
        self._recent(host).append(self.clock())
        self._summarise()
        if self._logged < self.first:
            self._logged += 1
            log.warning("admin API: a request from %s with a wrong or missing token", host)
        else:
            self._more[host] += 1

    def refused(self, host: str) -> None:
        self._summarise()
        self._more[host] += 1

    def _recent(self, host: str) -> list[float]:
        """``host``'s wrong tokens within the window (the list kept for it)."""
        now = self.clock()
        times = self._failed[host] = [t for t in self._failed.get(host, ())
                                      if now - t < self.window]
        if len(self._failed) > 10_000:  # forget the addresses whose guesses are all old
            self._failed = {h: t for h, t in self._failed.items()
                            if h == host or (t and now - t[-1] < self.window)}
        return times

    def _summarise(self) -> None:
        now = self.clock()
        if now - self._since < 60.0:
            return
        if self._more:
            log.warning("admin API: %d more requests with a wrong token, or refused for too "
                        "many of them, in the last %.0f s, from %d addresses",
                        sum(self._more.values()), now - self._since, len(self._more))
        self._logged, self._more, self._since = 0, Counter(), now


def _read_token(path: str, st: os.stat_result) -> bytes:
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"admin.token_file {path} may be read or changed by other users "
                          f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 {path}")
    with open(path, "rb") as f:
        token = f.read(4096).strip()
    if len(token) < MIN_TOKEN or any(c < 0x21 or c > 0x7e for c in token):
        raise ConfigError(f"admin.token_file {path} must hold one token of at least "
                          f"{MIN_TOKEN} printable characters (e.g. head -c 32 /dev/urandom | "
                          "base64)")
    return token


# A connection's idle time between requests (aiohttp's default is an hour); the first
# request has httpgate.FIRST_REQUEST
KEEPALIVE = 15.0


class AdminServer:
    def __init__(self, state: AdminState, token: TokenFile, probes: dict[str, Probe]) -> None:
        self.state = state
        self.token = token
        self.probes = probes  # /live and /ready: open, as on the monitoring listener
        self.gate = ConnectionGate("admin API")
        self.guesses = TokenGuesses()
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, ssl: object = None) -> tuple[str, int]:
        self.token.current()  # a token file that cannot be used stops the start
        app = web.Application(client_max_size=MAX_BODY,
                              middlewares=[self._errors, self._authenticated])
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=KEEPALIVE, logger=_HTTP_LOG)
        await self._runner.setup()
        site = _GatedSite(self._runner, host, port, self.gate,
                          ssl_context=ssl, backlog=128)
        await site.start()
        server = site._server  # the bound address, port 0 included
        assert server is not None
        sockname = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        scheme = "https" if ssl is not None else "http"
        log.info("admin API and console on %s://%s:%d/console/", scheme, sockname[0],
                 sockname[1])
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/v1/replication", self._replication)
        r.add_get("/api/v1/clients", self._clients)
        r.add_delete("/api/v1/clients/{id}", self._disconnect)
        r.add_get("/api/v1/tables", self._tables)
        r.add_post("/api/v1/tables/{table:.+}/resync", self._resync)
        r.add_get("/api/v1/dumps", self._dumps)
        r.add_post("/api/v1/dumps", self._take_dumps)
        r.add_post("/api/v1/users/reload", self._reload_users)
        for path in self.probes:
            r.add_get(path, self._probe)
        r.add_get("/", _to_console)
        r.add_get("/console", _to_console)
        if not (CONSOLE / "index.html").is_file():
            # an install without the package's data files: the API still serves
            log.warning("admin: the web console's files are missing from %s (a broken "
                        "install?); the API answers, /console/ does not", CONSOLE)
            return
        r.add_get("/console/", _console_page)
        r.add_static("/console/", CONSOLE, follow_symlinks=False, append_version=False)

    # -- middlewares -----------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        """Every answer under /api/ is JSON, errors included; every other one, a redirect
        or a 404 of the console's files included, gets the console's security headers;
        and no answer names the server's software."""
        try:
            response = await handler(request)
        except Refused as exc:
            response = error_answer(exc.status, str(exc))
        except web.HTTPException as exc:
            if not request.path.startswith("/api/"):
                response = web.Response(status=exc.status, text=exc.text,
                                        headers={k: v for k, v in exc.headers.items()
                                                 if k in ("Location", "Allow")})
            else:
                response = error_answer(exc.status, http_reason(exc))
                if "Allow" in exc.headers:
                    response.headers["Allow"] = exc.headers["Allow"]
        except Exception:  # a bug in one view must not take the API down (logged)
            log.exception("admin API: %s %s failed", request.method, request.path)
            response = error_answer(500, "internal error; see the service's log")
        if request.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"
        else:
            response.headers["Content-Security-Policy"] = _CSP
            response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Server"] = "cdcserver"
        return response

    @web.middleware
    async def _authenticated(self, request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                             ) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        host = client_host(request.transport.get_extra_info("peername")
                           if request.transport is not None else request.remote)
        wait = self.guesses.wait(host)
        if wait > 0:
            self.guesses.refused(host)
            response = error_answer(429, "too many requests with a wrong token from this "
                                         f"address; try again in {wait:.0f} s")
            response.headers["Retry-After"] = str(max(1, round(wait)))
            return response
        if not self.token.accepts(request.headers.get("Authorization")):
            self.guesses.failed(host)
            response = error_answer(401, "this needs the admin token: Authorization: Bearer "
                                         "<the content of [admin] token_file>")
            response.headers["WWW-Authenticate"] = 'Bearer realm="cdcserver"'
            return response
        return await handler(request)

    # -- views -----------------------------------------------------------------------------

    async def _replication(self, request: web.Request) -> web.Response:
        return answer(self.state.replication())

    async def _clients(self, request: web.Request) -> web.Response:
        return answer({"clients": await self.state.clients()})

    async def _disconnect(self, request: web.Request) -> web.Response:
        text = request.match_info["id"]
        if not (text.isascii() and text.isdigit()):  # "²" is a digit to str.isdigit()
            raise Refused(400, f"a client id is a number (GET /api/v1/clients), not {text!r}")
        if len(text.lstrip("0")) > 19:  # past any id (and past what int() takes: 4,300 digits)
            raise Refused(404, f"no client {text[:24]}... is connected (GET /api/v1/clients)")
        self.state.disconnect(int(text))
        return answer({"disconnected": int(text)})

    async def _tables(self, request: web.Request) -> web.Response:
        return answer({"tables": await self.state.tables()})

    async def _resync(self, request: web.Request) -> web.Response:
        table = path_table(request.match_info["table"])
        return answer({"resyncing": self.state.resync(table)}, status=202)

    async def _dumps(self, request: web.Request) -> web.Response:
        return answer(await self.state.dumps())

    async def _take_dumps(self, request: web.Request) -> web.Response:
        refs = dump_refs(await read_body(request))
        return answer(await self.state.take_dumps(refs), status=202)

    async def _reload_users(self, request: web.Request) -> web.Response:
        return answer({"users": await self.state.reload_users()})

    async def _probe(self, request: web.Request) -> web.Response:
        good, document = self.probes[request.path]()
        return answer(document, status=200 if good else 503)


class _ClientFaults(logging.Filter):
    """aiohttp's server logs a malformed request (no ``Host``, a bad method, a header past its
    limit) or a client gone mid-request at ERROR, with a ten-line traceback, before any
    login: anyone who reaches the port could fill the log (found by attack). Such a record
    becomes one line at INFO, naming the client and what was wrong: the client's fault, not
    the service's."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, ConnectionError)):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "admin API: %s: %s", (peer, exc)
            record.exc_info, record.exc_text = None, None
            return _HTTP_LOG.isEnabledFor(logging.INFO)  # (the level the service logs at)
        return True


_HTTP_LOG = logging.getLogger("cdcserver.ops.admin.http")  # aiohttp's server's, for this API
_HTTP_LOG.addFilter(_ClientFaults())


class _GatedSite(web.TCPSite):
    """aiohttp's TCP site, each connection behind the listener's :class:`ConnectionGate`."""

    __slots__ = ("_gate",)

    def __init__(self, runner: web.BaseRunner, host: str, port: int, gate: ConnectionGate,
                 **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._gate = gate

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registered with the runner, as TCPSite.start does
        server = self._runner.server
        assert server is not None
        gate = self._gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GatedProtocol(server(), gate), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog)
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def _to_console(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


async def _console_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(CONSOLE / "index.html")
