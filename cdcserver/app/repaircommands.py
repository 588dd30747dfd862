"""The commands that repair a data directory: ``cdcserver resync`` (quarantined tables read
again by the running service, or the way out when the source purged the binlog the stream
needs) and ``cdcserver schema forget`` (a table's definition re-learnt from the source)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cdcserver.app import logs
from cdcserver.app.cliargs import existing_data_dir, source_and_store_options, table_name
from cdcserver.app.process import EXIT_FAILED, EXIT_OK
from cdcserver.core import config as cfg
from cdcserver.core.durable import private_files
from cdcserver.core.errors import CdcError, ConfigError
from cdcserver.core.names import TableName
from cdcserver.store import writerlock
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.names import parse_table, table_ref


def add_resync_command(commands: Any) -> None:
    """``resync``: quarantined tables, or the way out of a purged binlog."""
    resync = commands.add_parser(
        "resync", help="with tables: resync quarantined tables now (the running service "
                       "reads each again and releases it); without: the way out when the "
                       "source purged the binlog the stream needs (service stopped)")
    resync.add_argument("tables", nargs="*", metavar="DB.TABLE",
                        help="quarantined tables to resync (as LIST-TABLES names them)")
    source_and_store_options(resync, "source.server_id")
    resync.add_argument("--no-dumps", action="store_true",
                        help="do not dump the tables (take them later with cdcserver dump)")
    resync.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                        help="with tables: how long to wait for the running service to "
                             "release them (default 120; 0: do not wait)")
    resync.set_defaults(handler=cmd_resync)


def add_schema_command(commands: Any) -> None:
    """``schema forget``: the schema history."""
    schema = commands.add_parser("schema", help="the schema history")
    schema_commands = schema.add_subparsers(metavar="ACTION", required=True)
    forget = schema_commands.add_parser("forget", help="forget a table's definition so the "
                                        "service re-learns it from the source (service stopped)")
    forget.add_argument("table", metavar="DB.TABLE", help="the table to forget")
    source_and_store_options(forget)
    forget.set_defaults(handler=cmd_schema_forget)


def cmd_resync(args: argparse.Namespace) -> int:
    from cdcserver.ops.resync import resync

    if args.tables:
        return _resync_tables(args)
    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    private_files(config.store.group_access)
    logs.setup(config.log.level, config.log.format)
    result = resync(config, dump=not args.no_dumps)
    print(f"the source had purged the binlog after '{result.stored}': {result.reason}")
    print(f"the stream continues at '{result.point.gtid_state}' ({result.point.file}:"
          f"{result.point.pos}); a resync version for {len(result.versions)} tables"
          + (f", {len(result.dropped)} dropped meanwhile" if result.dropped else ""))
    for dumped in result.dumps:
        info = dumped.info
        print(f"{info.name}: {info.header.rows} rows at GTID {info.header.gtid or '(none)'}")
    print("start the service: clients following a table see its resync version and reload "
          "it from its dump")
    return EXIT_OK


def _resync_tables(args: argparse.Namespace) -> int:
    """Ask the service to resync quarantined tables (``cdcserver/app/resyncs.py``), and wait
    until it has released them."""
    import time

    from cdcserver.app.resyncs import ask
    from cdcserver.store import checkpoint as ckpt

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    data_dir = existing_data_dir(config.store.data_dir)
    layout = DataDir(data_dir)
    tables = []
    for text in args.tables:
        try:
            ref = parse_table(text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        tables.append(TableName(ref.database, ref.table))
    stored = ckpt.load(layout.checkpoint)
    quarantined = set(stored.quarantined) if stored is not None else set()
    for table in tables:
        if table not in quarantined:
            print(f"{table_ref(table.database, table.table)} is not quarantined: nothing to do")
    wanted = [t for t in tables if t in quarantined]
    for table in wanted:
        ask(data_dir, table)
    if not wanted:
        return EXIT_OK
    if not writerlock.held(layout.writer_lock):
        print("asked; the service resyncs them when it starts")
        return EXIT_OK
    if args.wait <= 0:
        print("asked; the service resyncs them now (`cdcserver status` shows them until then)")
        return EXIT_OK
    deadline = time.monotonic() + args.wait
    while True:
        stored = ckpt.load(layout.checkpoint)
        left = [t for t in wanted if stored is None or t in stored.quarantined]
        for table in wanted:
            if table not in left:
                print(f"{table_ref(table.database, table.table)}: resynced")
        wanted = left
        if not left:
            return EXIT_OK
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for table in left:
        why = stored.quarantined.get(table) if stored is not None else None
        print(f"{table_ref(table.database, table.table)}: still quarantined"
              + (f": {why.cause}" if why else "") + " (the service goes on trying; "
              "`cdcserver status` shows it)", file=sys.stderr)
    return EXIT_FAILED


def cmd_schema_forget(args: argparse.Namespace) -> int:
    import fcntl

    from cdcserver.schema.history import SchemaHistory

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    private_files(config.store.group_access)
    layout = DataDir(existing_data_dir(config.store.data_dir))
    with open(layout.writer_lock, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CdcError("the service is running on this data directory; stop it first") \
                from None
        SchemaHistory(layout.schema_history).forget(
            table_name(args.table))
    print(f"forgot {args.table}; the service will re-learn it from the source")
    return EXIT_OK
