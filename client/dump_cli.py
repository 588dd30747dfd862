"""``cdc dumps`` (the server's dumps, one JSON line each) and ``cdc dump`` (a dump saved
with a progress bar and its checksum checked; with ``--new``, taken first; with
``--follow``, then the changes after it)."""

from __future__ import annotations

import argparse
import json
import sys
import time

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
from mariadb_cdc_client.dump import SavedDump
from mariadb_cdc_client.format.dump import DumpError, DumpHeader
from mariadb_cdc_client.format.names import BadTableRef, parse_table
from mariadb_cdc_client.format.wire import DumpRequest, ProtocolError
from mariadb_cdc_client.sync import SyncCdcConnection


def dumps_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc dumps", add_help=False,
                                     description="list the server's dumps")
    connection_options(parser)
    parser.add_argument("TABLE", nargs="?", help="only this DATABASE.TABLE's")
    return parser


def run_dumps(argv: list[str]) -> int:
    args = dumps_parser().parse_args(argv)
    try:
        if args.TABLE:
            parse_table(args.TABLE)
    except BadTableRef as exc:
        complain(exc)
        return EXIT_USAGE

    def listed(conn: SyncCdcConnection) -> None:
        for dump in conn.list_dumps(args.TABLE):
            print(json.dumps(dump))

    return answered(args, listed)


def dump_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc dump", add_help=False,
                                     description="save a dump, then optionally follow the "
                                                 "changes after it")
    connection_options(parser)
    parser.add_argument("TARGET", help="DATABASE.TABLE (its newest dump) or a dump name")
    parser.add_argument("-o", "--output", help="file to write (default: the dump's name)")
    parser.add_argument("--follow", action="store_true",
                        help="then print the changes after the dump to stdout")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: when stderr is a terminal)")
    parser.add_argument("--new", action="store_true",
                        help="have the server take a new dump of the table first "
                             "(START-DUMP; the stream goes on meanwhile), then save it")
    return parser


def run_dump(argv: list[str]) -> int:
    args = dump_parser().parse_args(argv)
    try:
        conn = open_connection(args)
    except (ProtocolError, OSError, ValueError) as exc:
        complain(exc)
        return EXIT_ERROR
    try:
        if args.new:
            _take_new_dump(conn, args)
        header = _save_dump(conn, args)
        complain(f"saved {header[1]} ({header[0].rows} rows at GTID "
                 f"{header[0].gtid or '(none)'})")
        if not args.follow:
            return EXIT_OK
        return copy_stream(conn, None, args.timeout)
    except (ProtocolError, OSError, DumpError) as exc:
        complain(exc)
        return EXIT_ERROR
    finally:
        conn.close()


def _take_new_dump(conn: SyncCdcConnection, args: argparse.Namespace) -> None:
    """START-DUMP the table, then follow LIST-DUMPS (rows written of the rows the source
    estimates) until its new dump is there."""
    from tqdm import tqdm

    table = args.TARGET
    before = {d["name"] for d in conn.list_dumps(table)}
    conn.start_dumps(table)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    with tqdm(unit=" rows", unit_scale=True, desc=f"dumping {table}", disable=not show,
              file=sys.stderr) as bar:
        while True:
            taking = conn.taking(table)
            if taking and taking[0]["state"] == "failed":
                raise DumpError(f"the dump of {table} failed: {taking[0].get('error', '')}")
            if taking:
                bar.total = max(int(taking[0]["estimated_rows"]), int(taking[0]["rows"])) \
                    or None
                bar.n = int(taking[0]["rows"])
                bar.refresh()
            elif {d["name"] for d in conn.list_dumps(table)} - before:
                return
            time.sleep(0.25)


def _save_dump(conn: SyncCdcConnection, args: argparse.Namespace) -> tuple[DumpHeader, str]:
    from tqdm import tqdm

    size, name = conn.request_dump(DumpRequest(args.TARGET, args.follow))
    path = args.output or name  # (a dump's name: request_dump refuses any other)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    with SavedDump(path) as saved, tqdm(total=size, unit="B", unit_scale=True,
                                        unit_divisor=1024, desc=name, disable=not show,
                                        file=sys.stderr) as bar:
        for data in conn.read_dump(size):
            saved.write(data)
            bar.update(len(data))
        return saved.finish(), path
