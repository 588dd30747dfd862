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

The commands of the users file (``usercommands.py``), of dumps (``dumpcommands.py``), of
repairs (``repaircommands.py``) and of a running service's admin API (``ctl.py``) each have
a module of their own; the flags they share are in ``cliargs.py``.

A configuration error (an unknown setting, a users file or data directory that cannot be
used, a listen address in use) is one line on stderr and exit code 2; a failure, exit code 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import cdcserver
from cdcserver.app import dumpcommands, logs, repaircommands, usercommands
from cdcserver.app.cliargs import CAPTURE_OPTIONS, source_and_store_options, table_name
from cdcserver.app.process import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_until_signalled
from cdcserver.core import config as cfg
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.durable import private_files
from cdcserver.core.errors import CdcError, ConfigError
from cdcserver.core.names import TableName

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
    for command in (_run_command, _check_command, _status_command,
                    usercommands.add_command, _verify_command,
                    dumpcommands.add_dump_command, dumpcommands.add_dumps_command,
                    repaircommands.add_resync_command, repaircommands.add_schema_command,
                    _ctl_command, _demo_command):
        command(commands)
    return parser


def _run_command(commands: Any) -> None:
    """``run``: replicate and serve."""
    run = commands.add_parser("run", help="replicate and serve")
    cfg.add_config_flag(run)
    cfg.add_arguments(run)
    run.set_defaults(handler=cmd_run)


def _check_command(commands: Any) -> None:
    """``check``: the source's preflight."""
    check = commands.add_parser("check", help="preflight: is the source ready to be "
                                              "captured, and the SQL that fixes what is not")
    source_and_store_options(check, "source.server_id", *CAPTURE_OPTIONS)
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


def _verify_command(commands: Any) -> None:
    """``verify``: tables against their streams."""
    verify = commands.add_parser("verify", help="compare tables with their streams")
    verify.add_argument("tables", nargs="+", metavar="DB.TABLE", help="the tables to compare")
    source_and_store_options(verify, "capture.hash_salt_file")
    verify.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the service to reach the snapshot")
    verify.add_argument("--json", action="store_true", help="one JSON line per table")
    verify.add_argument("--dump", metavar="FILE|newest",
                        help="compare with a dump followed by the stream after it ('newest': "
                             "the table's newest dump)")
    verify.set_defaults(handler=cmd_verify)


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
    from cdcserver.app import recovering

    return run_until_signalled(lambda stop: recovering.serve(config, stop))


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
        table = table_name(text)
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


# -- demo ------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    from cdcserver.app.demo import run_demo

    logs.setup("info")
    return run_demo(args.dir, args.listen, args.mariadb_port, args.trickle)


if __name__ == "__main__":
    sys.exit(main())
