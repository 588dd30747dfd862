"""``cdc``: MaxScale's ``cdc.py``, as a maintained command.

    cdc [-h HOST] [-P PORT] -u USER -p PASSWORD [-f JSON|AVRO] [-t TIMEOUT]
        DB.TABLE[.VERSION] [GTID]

takes ``cdc.py``'s arguments and prints what the server sends, unchanged (JSON lines, or the
Avro container stream), until the server hangs up or, with ``-t``, until nothing arrived for
that many seconds. A rejected request prints the server's ``ERR`` line on stderr and exits 1.
A database or table name holding a space, a dot, a comma or a quote is quoted as in MariaDB
(protocol.md, "Table names"): ``cdc -u U -p P '`my db`.`my.table`'``.

    cdc auth-string -u USER -p PASSWORD      the first line to send with netcat
    cdc last-transaction [connection options]     QUERY-LAST-TRANSACTION
    cdc transaction GTID [connection options]     QUERY-TRANSACTION
    cdc dumps [DB.TABLE] [connection options]     LIST-DUMPS (one JSON line per dump)
    cdc dump DB.TABLE|NAME [-o FILE] [--follow] [--new] [connection options]
        save a dump (a table's newest, or one by name) with a progress bar, check its
        checksum, then with --follow print the changes after it, as ``cdc DB.TABLE`` does;
        with --new the server takes a new dump of the table first (progress shown)

    cdc kafka TOPIC... [-b BOOTSTRAP] [--kafka-format F] [--from START] [-t TIMEOUT]
        read the service's Kafka topics back and print each change as a JSON line, values
        typed from the schema topic and decoded (base64 and all) in every message format
        (Avro values with --schema-registry URL, the service's kafka.schema_registry_url);
        START is earliest (default), latest, PARTITION:OFFSET[,...] or a GTID state

    cdc --help       these commands, and the stream's options; cdc COMMAND --help
    cdc --version

The password can also come from the ``CDC_PASSWORD`` environment variable (for ``cdc
kafka``, the SASL password from ``CDC_KAFKA_PASSWORD``). A first word that is neither a
command nor a table but close to a command (``cdc dumsp``) is reported as a mistyped command.

The dump commands are in ``dump_cli.py``, ``cdc kafka`` in ``kafka_cli.py``, and what the
commands share (the connection options, opening a connection, copying a stream) in
``cli_connection.py``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import mariadb_cdc_client
from mariadb_cdc_client import dump_cli
from mariadb_cdc_client.cli_connection import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    answered,
    complain,
    connection_options,
    copy_stream,
    open_connection,
)
from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.extras import MissingExtra, require
from mariadb_cdc_client.format.names import BadTableRef, parse_table
from mariadb_cdc_client.format.wire import (
    DataRequest,
    Format,
    ProtocolError,
    auth_message,
    parse_request_data,
)
from mariadb_cdc_client.resume import Resume
from mariadb_cdc_client.stream import JsonStreamDecoder
from mariadb_cdc_client.sync import SyncCdcConnection


class Command(NamedTuple):
    """A subcommand (``cdc dumps``): its line in ``cdc --help``, its options, and what it
    does with its arguments."""

    summary: str
    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[list[str]], int]


def _stream_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in COMMANDS) + 2
    commands = "\n".join(f"  {name:{width}}{command.summary}"
                         for name, command in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="cdc", add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] DATABASE.TABLE[.VERSION] [GTID]\n"
              "       %(prog)s COMMAND [options]",
        description="Stream a table's changes from a CDC server, or run a command",
        epilog=f"commands (cdc COMMAND --help for their options):\n{commands}")
    connection_options(parser)
    parser.add_argument("--version", action="version",
                        version=f"cdc {mariadb_cdc_client.__version__}",
                        help="print the version and exit")
    parser.add_argument("FILE", help="DATABASE.TABLE[.VERSION]")
    parser.add_argument("GTID", nargs="?", default=None, help="start at this GTID (inclusive)")
    return parser


def _without_password(argv: list[str]) -> list[str]:
    """``argv`` with the value of ``-p``/``--password`` replaced by ``***``."""
    masked, hide_next = [], False
    for arg in argv:
        if hide_next:
            masked.append("***")
            hide_next = False
        elif arg in ("-p", "--password"):
            masked.append(arg)
            hide_next = True
        elif arg.startswith("--password="):
            masked.append("--password=***")
        elif arg.startswith("-p") and len(arg) > 2:
            masked.append("-p***")
        else:
            masked.append(arg)
    return masked


def _hide_password_from_process_title(argv: list[str]) -> None:
    """A password given with -p would show in ``ps`` to every user of the machine."""
    masked = _without_password(argv)
    if masked != argv:
        import setproctitle

        setproctitle.setproctitle(" ".join(["cdc", *masked]))


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        _hide_password_from_process_title(sys.argv[1:])
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        try:
            return COMMANDS[argv[0]].run(argv[1:])
        except MissingExtra as exc:
            complain(exc)
            return EXIT_USAGE
    mistyped = _mistyped_command(argv[0]) if argv else None
    if mistyped:
        complain(mistyped)
        return EXIT_USAGE
    args = _stream_parser().parse_args(argv)
    try:
        request = parse_request_data(f"{args.FILE} {args.GTID or ''}")
    except ProtocolError as exc:
        complain(_mistyped_command(args.FILE) or exc.message)
        return EXIT_USAGE
    try:
        several = len(Endpoints.of(args.host, args.port).all) > 1
    except ValueError as exc:
        complain(exc)
        return EXIT_USAGE
    if several and args.format == "JSON" and not request.until:
        return _follow_instances(args, request)
    try:
        conn = open_connection(args)
    except (ProtocolError, OSError, ValueError) as exc:
        complain(exc)
        return EXIT_ERROR
    try:
        return copy_stream(conn, request, args.timeout)
    finally:
        conn.close()


def _mistyped_command(word: str) -> str | None:
    """What to say when ``word``, where a command or DB.TABLE goes, is no table but a
    command misspelt (``dumsp``) or placed after the options (None: neither)."""
    if word.startswith("-") or _is_table(word):
        return None
    if word in COMMANDS:
        return f"a command comes before the options: cdc {word} [options]"
    close = difflib.get_close_matches(word, COMMANDS, n=3)
    # A transposition (dumsp) is closest to the command with the same letters (dumps), which
    # difflib ranks after the one with a letter less (dump).
    same_letters = [name for name in close if sorted(name) == sorted(word)]
    best = same_letters or close
    return f"unknown command '{word}', did you mean '{best[0]}'?" if best else None


def _is_table(word: str) -> bool:
    try:
        parse_table(word)
    except BadTableRef:
        return False
    return True


def _follow_instances(args: argparse.Namespace, request: DataRequest) -> int:
    """JSON from several service instances: the lines as an instance sends them; when a
    connection fails, the stream continues on the next instance right after the last record
    printed (the library's Resume tells what is new), waiting only after every instance
    failed in a row. Ends, like one connection, after ``-t`` seconds of silence."""
    password = args.password if args.password is not None else os.environ.get("CDC_PASSWORD", "")
    endpoints = Endpoints.of(args.host, args.port)
    resume = Resume(request.version, request.gtid, request.after)
    tls = ssl.create_default_context(cafile=args.tls_ca) if args.tls or args.tls_ca else None
    out = sys.stdout.buffer
    delays = (0.1, 0.5, 1.0, 2.0, 5.0)
    rounds = 0
    while True:
        host, port = endpoints.current
        try:
            conn = SyncCdcConnection.open(host, port, args.user, password,
                                          format=Format.JSON, ssl=tls,
                                          timeout=args.timeout or 10.0, auth=args.auth)
        except ProtocolError as exc:
            complain(exc)
            return EXIT_ERROR
        except OSError as exc:
            failure: Exception = exc
        else:
            try:
                failure, printed = _print_new_lines(conn, request, resume, out, args.timeout)
            except ProtocolError as exc:
                complain(exc)
                return EXIT_ERROR
            except _Quiet:
                return EXIT_OK
            finally:
                conn.close()
            if printed:
                endpoints.succeeded()
                rounds = 0
        tried = endpoints.describe()
        if endpoints.failed():
            delay = delays[min(rounds, len(delays) - 1)]
            rounds += 1
            complain(f"{tried}: {failure}; retrying in {delay:.1f}s")
            time.sleep(delay)
        else:
            complain(f"{tried}: {failure}; continuing on {endpoints.describe()}")


class _Quiet(Exception):
    """Nothing arrived for the ``-t`` timeout: the command ends, as with one connection."""


def _print_new_lines(conn: SyncCdcConnection, request: DataRequest, resume: Resume, out: Any,
                     timeout: float) -> tuple[Exception, int]:
    """Print what is new of one connection's stream; returns why it ended, and how many
    lines it printed."""
    line = DataRequest(request.database, request.table, *resume.request()).line()
    conn.sock.sendall(line.encode())
    conn.sock.settimeout(timeout or None)
    decoder = JsonStreamDecoder()
    pending = bytearray(conn._pending)
    conn._pending.clear()
    printed = 0
    while True:
        while (newline := pending.find(b"\n")) >= 0:
            raw = bytes(pending[:newline + 1])
            del pending[:newline + 1]
            if any([resume.accept(event) for event in decoder.feed(raw)]):
                out.write(raw)
                out.flush()
                printed += 1
        try:
            data = conn.sock.recv(1 << 16)
        except TimeoutError:
            raise _Quiet from None
        except OSError as exc:
            return exc, printed
        if not data:
            return ConnectionError("the server closed the stream"), printed
        pending += data


def _auth_string_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc auth-string", add_help=False,
                                     description="print hex(user:SHA1(password))")
    parser.add_argument("-u", "--user", required=True, help="user name")
    parser.add_argument("-p", "--password", default=None,
                        help="password (or set CDC_PASSWORD)")
    parser.add_argument("--help", action="help", help="show this help and exit")
    return parser


def _auth_string(argv: list[str]) -> int:
    args = _auth_string_parser().parse_args(argv)
    password = args.password if args.password is not None else os.environ.get("CDC_PASSWORD", "")
    print(auth_message(args.user, password).decode())
    return EXIT_OK


def _query(summary: str, command: str, with_gtid: bool) -> Command:
    """``cdc last-transaction`` and ``cdc transaction GTID``: one query, its JSON reply."""
    def parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"cdc {command.lower().removeprefix('query-')}",
                                         add_help=False, description=summary)
        connection_options(parser)
        if with_gtid:
            parser.add_argument("GTID", help="the transaction's GTID (domain-server-sequence)")
        return parser

    def run(argv: list[str]) -> int:
        args = parser().parse_args(argv)
        line = command + (f" {args.GTID}" if with_gtid else "")
        return answered(args, lambda conn: print(json.dumps(conn.query(line))))
    return Command(summary, parser, run)


def _kafka_parser() -> argparse.ArgumentParser:
    require("kafka", "cdc kafka")
    from mariadb_cdc_client.kafka_cli import parser  # needs the kafka extra: only for `cdc kafka`

    return parser()


def _kafka(argv: list[str]) -> int:
    require("kafka", "cdc kafka")
    from mariadb_cdc_client.kafka_cli import run

    return run(argv)


COMMANDS = {
    "dump": Command("save a dump, checked; with --follow, then the changes after it",
                    dump_cli.dump_parser, dump_cli.run_dump),
    "dumps": Command("list the server's dumps, one JSON line each", dump_cli.dumps_parser,
                     dump_cli.run_dumps),
    "last-transaction": _query("the last transaction the server stored, as JSON",
                               "QUERY-LAST-TRANSACTION", False),
    "transaction": _query("a stored transaction, by its GTID, as JSON", "QUERY-TRANSACTION",
                          True),
    "auth-string": Command("print the first line to send with netcat",
                           _auth_string_parser, _auth_string),
    "kafka": Command("the service's Kafka topics, one decoded JSON line per change",
                     _kafka_parser, _kafka),
}


if __name__ == "__main__":
    sys.exit(main())
