"""What the ``cdc`` commands share: the connection options, a connection opened from them
(each service instance tried in turn), and the stream copied to stdout as it arrives."""

from __future__ import annotations

import argparse
import os
import re
import ssl
import sys
from collections.abc import Callable

from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.wire import DataRequest, Format, ProtocolError
from mariadb_cdc_client.login import Auth
from mariadb_cdc_client.sync import SyncCdcConnection

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

# What a terminal would act on rather than show: control characters (escape sequences that
# clear the screen or set the window's title, carriage returns and backspaces that overwrite
# what was printed, newlines that forge lines) and the marks that reorder text
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
SHOWN_MAX = 2000  # characters of a message shown


def shown(text: str, limit: int = SHOWN_MAX) -> str:
    """``text`` (a server's error, a name it sent) as it is safe to print on a terminal:
    control characters escaped (``\\x1b``), and cut to ``limit`` characters."""
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], text)


def complain(message: object) -> None:
    """``cdc: <message>`` on stderr, shown safely (:func:`shown`)."""
    print(f"cdc: {shown(str(message))}", file=sys.stderr)


def connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-h", "--host", default="localhost",
                        help="server address; several service instances as HOST[:PORT],... "
                             "(the first that answers is used)")
    parser.add_argument("-P", "--port", type=int, default=4001, help="server port")
    parser.add_argument("-u", "--user", default="", help="user name")
    parser.add_argument("-p", "--password", default=None,
                        help="password (or set CDC_PASSWORD)")
    parser.add_argument("--auth", default="auto", choices=[a.value for a in Auth],
                        help="the login: auto (SCRAM-SHA-256 when the server offers it, else "
                             "MaxScale's), scram (never MaxScale's replayable login) or "
                             "legacy (MaxScale's only)")
    parser.add_argument("-f", "--format", default="JSON", choices=["JSON", "AVRO"],
                        help="stream format")
    parser.add_argument("-t", "--timeout", type=float, default=0,
                        help="exit after this many seconds without data (0: never)")
    parser.add_argument("--tls", action="store_true",
                        help="connect with TLS, verifying the server's certificate")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="the CA bundle that signed the server's certificate (implies "
                             "--tls; default: the system's)")
    parser.add_argument("--help", action="help", help="show this help and exit")


def open_connection(args: argparse.Namespace) -> SyncCdcConnection:
    if not args.user:  # no user name is valid: the server would only say BAD-AUTH
        raise ValueError("a user is required: -u USER (and -p PASSWORD or CDC_PASSWORD)")
    password = args.password if args.password is not None else os.environ.get("CDC_PASSWORD", "")
    tls = None
    if args.tls or args.tls_ca:
        tls = ssl.create_default_context(cafile=args.tls_ca)
    endpoints = Endpoints.of(args.host, args.port)
    for _ in range(len(endpoints.all)):
        host, port = endpoints.current
        try:
            return SyncCdcConnection.open(host, port, args.user, password,
                                          format=Format(args.format), ssl=tls,
                                          timeout=args.timeout or 10.0, auth=args.auth)
        except OSError as exc:
            tried = endpoints.describe()
            if endpoints.failed():
                raise
            complain(f"{tried}: {exc}; trying {endpoints.describe()}")
    raise AssertionError("unreachable")


def copy_stream(conn: SyncCdcConnection, request: DataRequest | None, timeout: float) -> int:
    """Write what the server sends to stdout, as it arrives (``request`` None: the stream
    has already begun, after a dump)."""
    if request is not None:
        conn.sock.sendall(request.line().encode())
    conn.sock.settimeout(timeout or None)
    out = sys.stdout.buffer
    first = True
    if conn._pending:
        out.write(bytes(conn._pending))
        conn._pending.clear()
        first = False
    while True:
        try:
            data = conn.sock.recv(1 << 16)
        except TimeoutError:
            return EXIT_OK
        except OSError as exc:
            complain(exc)
            return EXIT_ERROR
        if not data:
            return EXIT_OK
        if first and data.startswith(b"ERR"):
            print(shown(data.decode("utf-8", "replace").split("\n", 1)[0]), file=sys.stderr)
            return EXIT_ERROR
        first = False
        out.write(data)
        out.flush()


def answered(args: argparse.Namespace, ask: Callable[[SyncCdcConnection], None]) -> int:
    """Connect, ``ask`` (it prints the answers), close: EXIT_OK, or EXIT_ERROR with the
    failure printed as ``cdc: <why>``."""
    try:
        conn = open_connection(args)
        try:
            ask(conn)
        finally:
            conn.close()
    except (TimeoutError, ProtocolError, OSError, ValueError) as exc:
        complain(exc)
        return EXIT_ERROR
    return EXIT_OK
