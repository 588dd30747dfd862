"""``cdcserver``: run the service and manage it.

    cdcserver run --source mysql://USER:PASS@HOST:PORT --data-dir DIR --listen HOST:PORT \\
                  --users-file FILE --server-id N [--config FILE]
    cdcserver users add|remove|list NAME --users-file FILE [--password-stdin] [--legacy no]
    cdcserver verify DB.TABLE [...] --source URL --data-dir DIR [--dump FILE|newest]
    cdcserver dump DB.TABLE|DB.* [...] --source URL --data-dir DIR [--restart]
    cdcserver dumps [DB.TABLE] --data-dir DIR
    cdcserver schema forget DB.TABLE --data-dir DIR
    cdcserver resync DB.TABLE [...] --data-dir DIR   a quarantined table, read again
    cdcserver resync --source URL --data-dir DIR     after the source purged the binlog it needed
    cdcserver ctl replication|clients|tables|dumps|dump|resync|kick|reload-users [--url URL]
                  [--token-file FILE] [--json]   a running service's admin API (docs/admin.md)
    cdcserver demo        a private MariaDB with sample data, and the service on top of it
    cdcserver --version

A configuration error (an unknown setting, a users file or data directory that cannot be
used, a listen address in use) is one line on stderr and exit code 2; a failure, exit code 1.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import cdcserver
from cdcserver.app import logs
from cdcserver.app.process import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_until_signalled
from cdcserver.app.startup import check_users_file
from cdcserver.core import config as cfg
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.durable import private_files
from cdcserver.core.errors import CdcError, ConfigError
from cdcserver.core.names import TableName
from cdcserver.protocol.users import UsersFile
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.names import BadTableRef, parse_table, table_ref
from mariadb_cdc_client.format.wire import Dialect

log = logging.getLogger("cdcserver")


def main(argv: list[str] | None = None) -> int:
    private_files()  # what a command writes is its user's (the configuration may add a group)
    if argv is None:
        _hide_secrets_from_process_title(sys.argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        result: int = args.handler(args)
        return result
    except ConfigError as exc:
        print(f"cdcserver: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CdcError as exc:
        print(f"cdcserver: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED


def _hide_secrets_from_process_title(argv: list[str]) -> None:
    """A password in a source URL on the command line would show in ``ps`` to every user of
    the machine: rewrite the process title (what /proc/PID/cmdline shows) without it."""
    masked = [logs.mask_secrets(arg) for arg in argv]
    if masked != argv:
        import setproctitle

        setproctitle.setproctitle(" ".join(["cdcserver", *masked[1:]]))
        print("cdcserver: warning: a password on the command line can be read by every user "
              "of this machine until it is hidden here, and stays in the shell's history: "
              "give it with --source-password-file FILE or the CDCSERVER_SOURCE_PASSWORD "
              "environment variable", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdcserver", description="MariaDB/MySQL change data "
                                     "capture, served over MaxScale's CDC protocol")
    parser.add_argument("--version", action="version",
                        version=f"cdcserver {cdcserver.__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(metavar="COMMAND")
    for command in (_run_command, _check_command, _status_command, _users_command,
                    _verify_command, _dump_command, _dumps_command, _resync_command,
                    _schema_command, _ctl_command, _demo_command):
        command(commands)
    return parser


def _run_command(commands: Any) -> None:
    """``run``: replicate and serve."""
    run = commands.add_parser("run", help="replicate and serve")
    cfg.add_config_flag(run)
    cfg.add_arguments(run)
    run.set_defaults(handler=cmd_run)


CAPTURE_OPTIONS = ("capture.include", "capture.exclude", "capture.system_tables",
                   "capture.columns_exclude", "capture.columns_hash", "capture.columns_mask",
                   "capture.hash_salt_file")


def _check_command(commands: Any) -> None:
    """``check``: the source's preflight."""
    check = commands.add_parser("check", help="preflight: is the source ready to be "
                                              "captured, and the SQL that fixes what is not")
    _source_and_store_options(check, "source.server_id", *CAPTURE_OPTIONS)
    check.set_defaults(handler=cmd_check)


def _status_command(commands: Any) -> None:
    """``status``: a running service's /health."""
    status = commands.add_parser("status", help="how a running service is doing (from its "
                                                "/health endpoint)")
    cfg.add_config_flag(status, "its metrics.listen is asked")
    status.add_argument("--metrics-url", help="the service's monitoring endpoint, e.g. "
                        "http://127.0.0.1:4002 (default: from metrics.listen)")
    status.add_argument("--json", action="store_true", help="print the health document as is")
    status.set_defaults(handler=cmd_status)


def _users_command(commands: Any) -> None:
    """``users add|remove|list|check``: the users file."""
    users = commands.add_parser("users", help="manage the users file")
    users_commands = users.add_subparsers(metavar="ACTION", required=True)
    for action, handler, helptext in (("add", cmd_users_add, "add or replace a user"),
                                      ("remove", cmd_users_remove, "remove a user"),
                                      ("list", cmd_users_list, "list user names"),
                                      ("check", cmd_users_check, "report the lines of a users "
                                       "file the service skips (exit 1 if any)")):
        sub = users_commands.add_parser(action, help=helptext)
        if action in ("add", "remove"):
            sub.add_argument("name", metavar="NAME", help="the user's name (1-43 characters, "
                             "no ':' or spaces)")
        if action == "check":
            sub.add_argument("file", nargs="?", metavar="FILE",
                             help="the users file (default: --users-file, else the "
                                  "configuration's)")
        cfg.add_arguments(sub, ["listener.users_file"])
        if action == "add":
            sub.add_argument("--password-stdin", action="store_true",
                             help="read the password from standard input instead of a prompt")
            sub.add_argument("--tables", metavar="LIST",
                             help="the tables the user may read, comma-separated db.table, "
                                  "db.* or * (default: every table for a new user, unchanged "
                                  "for an existing one)")
            sub.add_argument("--json", choices=[d.value for d in Dialect], metavar="DIALECT",
                             help="the JSON dialect of this user's clients when they do not "
                                  "ask for one: exact or maxscale (default: the listener's "
                                  "json_dialect; unchanged for an existing user)")
            sub.add_argument("--legacy", choices=["yes", "no"],
                             help="whether the user may log in with MaxScale's replayable "
                                  "login besides SCRAM-SHA-256 (default: yes for a new user, "
                                  "unchanged for an existing one)")
        sub.set_defaults(handler=handler)


def _verify_command(commands: Any) -> None:
    """``verify``: tables against their streams."""
    verify = commands.add_parser("verify", help="compare tables with their streams")
    verify.add_argument("tables", nargs="+", metavar="DB.TABLE", help="the tables to compare")
    _source_and_store_options(verify, "capture.hash_salt_file")
    verify.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the service to reach the snapshot")
    verify.add_argument("--json", action="store_true", help="one JSON line per table")
    verify.add_argument("--dump", metavar="FILE|newest",
                        help="compare with a dump followed by the stream after it ('newest': "
                             "the table's newest dump)")
    verify.set_defaults(handler=cmd_verify)


def _dump_command(commands: Any) -> None:
    """``dump``: consistent dumps of tables."""
    dump = commands.add_parser("dump", help="take consistent dumps of tables (resumes an "
                                            "interrupted one)")
    dump.add_argument("tables", nargs="+", metavar="DB.TABLE|DB.*",
                      help="the tables to dump (DB.*: every table of DB)")
    _source_and_store_options(dump, "dump.chunk_rows", "dump.readers", "dump.sync_interval",
                              *CAPTURE_OPTIONS)
    dump.add_argument("--restart", action="store_true",
                      help="discard an interrupted dump instead of continuing it")
    dump.add_argument("--json", action="store_true", help="one JSON line per dump")
    dump.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="show rows, rate and time left per table on stderr (default: "
                           "when stderr is a terminal)")
    dump.set_defaults(handler=cmd_dump)


def _dumps_command(commands: Any) -> None:
    """``dumps``: the complete dumps."""
    dumps = commands.add_parser("dumps", help="list the complete dumps")
    dumps.add_argument("table", nargs="?", metavar="DB.TABLE",
                       help="only this table's dumps (default: every table's)")
    _source_and_store_options(dumps)
    dumps.set_defaults(handler=cmd_dumps)


def _resync_command(commands: Any) -> None:
    """``resync``: quarantined tables, or the way out of a purged binlog."""
    resync = commands.add_parser(
        "resync", help="with tables: resync quarantined tables now (the running service "
                       "reads each again and releases it); without: the way out when the "
                       "source purged the binlog the stream needs (service stopped)")
    resync.add_argument("tables", nargs="*", metavar="DB.TABLE",
                        help="quarantined tables to resync (as LIST-TABLES names them)")
    _source_and_store_options(resync, "source.server_id")
    resync.add_argument("--no-dumps", action="store_true",
                        help="do not dump the tables (take them later with cdcserver dump)")
    resync.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                        help="with tables: how long to wait for the running service to "
                             "release them (default 120; 0: do not wait)")
    resync.set_defaults(handler=cmd_resync)


def _schema_command(commands: Any) -> None:
    """``schema forget``: the schema history."""
    schema = commands.add_parser("schema", help="the schema history")
    schema_commands = schema.add_subparsers(metavar="ACTION", required=True)
    forget = schema_commands.add_parser("forget", help="forget a table's definition so the "
                                        "service re-learns it from the source (service stopped)")
    forget.add_argument("table", metavar="DB.TABLE", help="the table to forget")
    _source_and_store_options(forget)
    forget.set_defaults(handler=cmd_schema_forget)


def _ctl_command(commands: Any) -> None:
    """``ctl``: a running service's admin API (``cdcserver/app/ctl.py``)."""
    from cdcserver.app import ctl

    ctl.add_command(commands)


def _demo_command(commands: Any) -> None:
    """``demo``: the README's first command."""
    demo = commands.add_parser("demo", help="a private MariaDB with sample data, and the "
                                            "service on it (the README's first command)")
    demo.add_argument("--dir", default=".cdc-demo", help="where the demo keeps its state")
    demo.add_argument("--listen", default="127.0.0.1:4001",
                      help="HOST:PORT of the service's CDC listener (taken: any free port)")
    demo.add_argument("--mariadb-port", type=int, default=3307,
                      help="TCP port of the demo's MariaDB (taken: any free port)")
    demo.add_argument("--trickle", type=float, default=5.0,
                      help="seconds between sample changes while running (0: none)")
    demo.set_defaults(handler=cmd_demo)


# -- run -------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    logs.setup(config.log.level, config.log.format)
    from cdcserver.app.service import Service

    service = Service(config)
    return run_until_signalled(lambda stop: service.run(stop))


def _source_and_store_options(parser: argparse.ArgumentParser, *more: str) -> None:
    """--config, and the flags of the source and data directory settings (and ``more``), as
    config.py declares them."""
    cfg.add_config_flag(parser)
    cfg.add_arguments(parser, ["source.url", "source.password_file", "store.data_dir", *more])


def _existing_data_dir(path: str) -> str:
    """A data directory a command reads: a missing one is a mistyped path, not an empty
    directory."""
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"store.data_dir {os.path.abspath(path)} {what}: give the service's "
                          "data directory (--data-dir, or data_dir in [store] of --config)")
    return path


def _table_name(text: str) -> TableName:
    """``db.table`` as protocol.md's names grammar reads it (```my.db`.t``)."""
    try:
        ref = parse_table(text)
    except (BadTableRef, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return TableName(ref.database, ref.table)


# -- check -----------------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when the source is ready (warnings included), 1 on a fatal finding."""
    from cdcserver.replication.preflight import check_source
    from cdcserver.replication.selection import capture_selection

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    report = check_source(config.source.address(), config.source.server_id)
    print(report.text())
    if report.fatal:
        return EXIT_FAILED
    print(capture_selection(config.source.address(), CaptureFilter.of(config.capture)).text())
    return EXIT_OK


# -- status ----------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 when healthy, 1 when degraded or unreachable."""
    from cdcserver.ops.status import fetch_health, render_health

    url = args.metrics_url
    if not url:
        where = cfg.Config.load(args.config).metrics.host_port()
        if where is None:
            raise ConfigError("metrics.listen is off: give --metrics-url")
        host = "127.0.0.1" if where[0] in ("0.0.0.0", "::") else where[0]
        url = f"http://{host}:{where[1]}"
    healthy, document = fetch_health(url)
    print(json.dumps(document, indent=1) if args.json else render_health(url, document))
    return EXIT_OK if healthy else EXIT_FAILED


# -- verify, schema ------------------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from cdcserver.ops.verify import format_json, verify_table

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    address = config.source.address()
    ok = True
    for text in args.tables:
        table = _table_name(text)
        report = verify_table(address, config.store.data_dir, table, args.timeout,
                              _dump_path(config.store.data_dir, table, args.dump),
                              salt=config.capture.hash_salt())
        ok &= report.ok
        print(format_json(report) if args.json else "\n".join(report.lines()))
    return EXIT_OK if ok else EXIT_FAILED


def _dump_path(data_dir: str, table: TableName, given: str | None) -> str | None:
    if given != "newest":
        return given
    from cdcserver.dump.files import list_dumps

    found = list_dumps(data_dir, table)
    if not found:
        raise CdcError(f"no dump of {table} in {data_dir}")
    return found[-1].path


# -- dumps -----------------------------------------------------------------------------------

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
    table = _table_name(args.table) if args.table else None
    for info in list_dumps(_existing_data_dir(config.store.data_dir), table):
        h = info.header
        print(f"{info.name}  {h.rows} rows  {info.size} bytes  GTID {h.gtid or '-'}  "
              f"stream version {h.stream_version}")
    return EXIT_OK


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
    data_dir = _existing_data_dir(config.store.data_dir)
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
    if not _service_runs(layout):
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


def _service_runs(layout: DataDir) -> bool:
    """Whether a service holds the data directory's writer lock."""
    import fcntl

    try:
        fd = os.open(layout.writer_lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def cmd_schema_forget(args: argparse.Namespace) -> int:
    import fcntl

    from cdcserver.schema.history import SchemaHistory

    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    private_files(config.store.group_access)
    layout = DataDir(_existing_data_dir(config.store.data_dir))
    with open(layout.writer_lock, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CdcError("the service is running on this data directory; stop it first") \
                from None
        SchemaHistory(layout.schema_history).forget(
            _table_name(args.table))
    print(f"forgot {args.table}; the service will re-learn it from the source")
    return EXIT_OK


# -- users -----------------------------------------------------------------------------

def _users_file(args: argparse.Namespace) -> str:
    """--users-file, else the environment's, else the default (config.py)."""
    return str(cfg.Config.load(None, cfg.overrides_from_args(args)).listener.users_file)


def cmd_users_add(args: argparse.Namespace) -> int:
    args.users_file = _users_file(args)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        try:
            password = getpass.getpass(f"Password for {args.name}: ")
            again = getpass.getpass("Again: ")
        except EOFError:  # no terminal, and nothing on standard input
            print("\ncdcserver: no password was typed: give it at the prompt, or on standard "
                  "input with --password-stdin", file=sys.stderr)
            return EXIT_USAGE
        if again != password:
            print("cdcserver: the passwords differ", file=sys.stderr)
            return EXIT_USAGE
    dialect = Dialect(args.json) if args.json else None
    legacy = None if args.legacy is None else args.legacy == "yes"
    replaced = UsersFile(args.users_file).add(args.name, password, args.tables, dialect, legacy)
    print(f"{'replaced' if replaced else 'added'} user {args.name} in {args.users_file}")
    return EXIT_OK


def cmd_users_remove(args: argparse.Namespace) -> int:
    args.users_file = _users_file(args)
    check_users_file(args.users_file)
    if not UsersFile(args.users_file).remove(args.name):
        print(f"cdcserver: no user {args.name} in {args.users_file}", file=sys.stderr)
        return EXIT_FAILED
    print(f"removed user {args.name} from {args.users_file}")
    return EXIT_OK


def cmd_users_check(args: argparse.Namespace) -> int:
    path = args.file or _users_file(args)
    check_users_file(path)
    users, problems = UsersFile(path).check()
    for problem in problems:
        print(problem)
    print(f"{path}: {len(users)} users, {len(problems)} "
          f"{'problem' if len(problems) == 1 else 'problems'}")
    return EXIT_FAILED if problems else EXIT_OK


def cmd_users_list(args: argparse.Namespace) -> int:
    path = _users_file(args)
    check_users_file(path)
    for name, account in sorted(UsersFile(path).load().items()):
        logins = ",".join(login for login, has in (("maxscale", account.hash is not None),
                                                    ("scram", account.scram is not None)) if has)
        print(f"{name}  {account.tables.text() if account.tables else '*'}  {logins}")
    return EXIT_OK


# -- demo ------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    from cdcserver.app.demo import run_demo

    logs.setup("info")
    return run_demo(args.dir, args.listen, args.mariadb_port, args.trickle)


if __name__ == "__main__":
    sys.exit(main())
