"""``cdcserver dump`` (consistent dumps of tables, with a progress bar per table) and
``cdcserver dumps`` (the complete ones)."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from typing import Any

from cdcserver.app import logs
from cdcserver.app.cliargs import (
    CAPTURE_OPTIONS,
    existing_data_dir,
    source_and_store_options,
    table_name,
)
from cdcserver.app.process import EXIT_OK
from cdcserver.core import config as cfg
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.durable import private_files
from cdcserver.core.errors import CdcError
from cdcserver.core.names import TableName


def add_dump_command(commands: Any) -> None:
    """``dump``: consistent dumps of tables."""
    dump = commands.add_parser("dump", help="take consistent dumps of tables (resumes an "
                                            "interrupted one)")
    dump.add_argument("tables", nargs="+", metavar="DB.TABLE|DB.*",
                      help="the tables to dump (DB.*: every table of DB)")
    source_and_store_options(dump, "dump.chunk_rows", "dump.readers", "dump.sync_interval",
                              *CAPTURE_OPTIONS)
    dump.add_argument("--restart", action="store_true",
                      help="discard an interrupted dump instead of continuing it")
    dump.add_argument("--json", action="store_true", help="one JSON line per dump")
    dump.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="show rows, rate and time left per table on stderr (default: "
                           "when stderr is a terminal)")
    dump.set_defaults(handler=cmd_dump)


def add_dumps_command(commands: Any) -> None:
    """``dumps``: the complete dumps."""
    dumps = commands.add_parser("dumps", help="list the complete dumps")
    dumps.add_argument("table", nargs="?", metavar="DB.TABLE",
                       help="only this table's dumps (default: every table's)")
    source_and_store_options(dumps)
    dumps.set_defaults(handler=cmd_dumps)


def cmd_dump(args: argparse.Namespace) -> int:
    import json

    from cdcserver.dump.dumper import DumpOptions, dump_tables, resolve_tables

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    private_files(config.store.group_access)
    logs.setup(config.log.level, config.log.format)
    address = config.source.address()
    capture = CaptureFilter.of(config.capture)
    tables = resolve_tables(address, args.tables, capture)
    if not tables:
        raise CdcError(f"no tables match {' '.join(args.tables)}")
    options = DumpOptions(config.dump, restart=args.restart)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    with _DumpProgress(address, tables, show) as progressed:
        results = dump_tables(address, config.store.data_dir, tables, options,
                              progressed=progressed, capture=capture)
    for result in results:
        info = result.info
        if args.json:
            print(json.dumps({**info.summary(), "resumed": result.resumed,
                              "seconds": round(result.seconds, 3)}))
        else:
            print(f"{info.name}: {info.header.rows} rows, {info.size} bytes, at GTID "
                  f"{info.header.gtid or '(none)'} ({result.seconds:.1f}s"
                  f"{', resumed' if result.resumed else ''})")
    return EXIT_OK


class _DumpProgress:
    """A progress bar per table on stderr: rows written of the rows the source estimates,
    the rate, the time left."""

    def __init__(self, address: cfg.SourceAddress, tables: list[TableName], show: bool
                 ) -> None:
        self.address, self.tables, self.show = address, tables, show
        self.bars: dict[TableName, Any] = {}
        self.estimates: dict[TableName, int] = {}
        self.lock = threading.Lock()  # readers report from their threads

    def __enter__(self) -> Callable[[TableName, int], None] | None:
        if not self.show:
            return None
        from cdcserver.dump.dumper import estimate_rows

        self.estimates = estimate_rows(self.address, self.tables)
        return self.progressed

    def progressed(self, table: TableName, rows: int) -> None:
        from tqdm import tqdm

        with self.lock:
            bar = self.bars.get(table)
            if bar is None:
                # The rows of the first report count from the start, not into the rate: the
                # bar appears only now, so they would make the first rate look far too high.
                bar = self.bars[table] = tqdm(total=self.estimates.get(table) or None,
                                              initial=rows, desc=str(table), unit=" rows",
                                              unit_scale=True, file=sys.stderr)
            if bar.total is not None and rows > bar.total:
                bar.total = rows  # the estimate was low
            bar.update(rows - bar.n)

    def __exit__(self, *exc: object) -> None:
        for bar in self.bars.values():
            bar.close()


def cmd_dumps(args: argparse.Namespace) -> int:
    from cdcserver.dump.files import list_dumps

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    table = table_name(args.table) if args.table else None
    for info in list_dumps(existing_data_dir(config.store.data_dir), table):
        h = info.header
        print(f"{info.name}  {h.rows} rows  {info.size} bytes  GTID {h.gtid or '-'}  "
              f"stream version {h.stream_version}")
    return EXIT_OK
