"""``cdcserver``: run the service and manage it.

    cdcserver run --source mysql://USER:PASS@HOST:PORT --data-dir DIR --listen HOST:PORT \\
                  --users-file FILE --server-id N [--config FILE]
    cdcserver users add|remove|list NAME --users-file FILE [--password-stdin]
    cdcserver demo        a private MariaDB with sample data, and the service on top of it
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from cdcserver import config as cfg
from cdcserver import logs
from cdcserver.errors import CdcError, ConfigError
from cdcserver.users import UsersFile

log = logging.getLogger("cdcserver")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdcserver", description="MariaDB/MySQL change data "
                                     "capture, served over MaxScale's CDC protocol")
    commands = parser.add_subparsers(metavar="COMMAND")

    run = commands.add_parser("run", help="replicate and serve")
    run.add_argument("--config", help="TOML file with [source], [store], [listener], [log]")
    cfg.add_arguments(run)
    run.set_defaults(handler=cmd_run)

    users = commands.add_parser("users", help="manage the users file")
    users_commands = users.add_subparsers(metavar="ACTION", required=True)
    for action, handler, helptext in (("add", cmd_users_add, "add or replace a user"),
                                      ("remove", cmd_users_remove, "remove a user"),
                                      ("list", cmd_users_list, "list user names")):
        sub = users_commands.add_parser(action, help=helptext)
        if action != "list":
            sub.add_argument("name")
        sub.add_argument("--users-file", default="users/cdcusers")
        if action == "add":
            sub.add_argument("--password-stdin", action="store_true",
                             help="read the password from standard input instead of a prompt")
        sub.set_defaults(handler=handler)

    demo = commands.add_parser("demo", help="a private MariaDB with sample data, and the "
                                            "service on it (the README's first command)")
    demo.add_argument("--dir", default=".cdc-demo", help="where the demo keeps its state")
    demo.add_argument("--listen", default="127.0.0.1:4001")
    demo.add_argument("--mariadb-port", type=int, default=3307)
    demo.add_argument("--trickle", type=float, default=5.0,
                      help="seconds between sample changes while running (0: none)")
    demo.set_defaults(handler=cmd_demo)
    return parser


# -- run -------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    config = cfg.Config.load(args.config, cfg.overrides_from_args(args))
    logs.setup(config.log.level, config.log.format)
    from cdcserver.service import Service

    service = Service(config)
    return run_until_signalled(lambda stop: service.run(stop))


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> int:
    """Run ``main(stop)`` on uvloop (when installed) until it returns or SIGTERM/SIGINT."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(wrapper())
    except CdcError as exc:
        log.error("%s", exc)
        return EXIT_FAILED if not isinstance(exc, ConfigError) else EXIT_USAGE
    return EXIT_OK


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# -- users -----------------------------------------------------------------------------

def cmd_users_add(args: argparse.Namespace) -> int:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {args.name}: ")
        if getpass.getpass("Again: ") != password:
            print("cdcserver: the passwords differ", file=sys.stderr)
            return EXIT_USAGE
    replaced = UsersFile(args.users_file).add(args.name, password)
    print(f"{'replaced' if replaced else 'added'} user {args.name} in {args.users_file}")
    return EXIT_OK


def cmd_users_remove(args: argparse.Namespace) -> int:
    if not UsersFile(args.users_file).remove(args.name):
        print(f"cdcserver: no user {args.name} in {args.users_file}", file=sys.stderr)
        return EXIT_FAILED
    print(f"removed user {args.name} from {args.users_file}")
    return EXIT_OK


def cmd_users_list(args: argparse.Namespace) -> int:
    for name in UsersFile(args.users_file).names():
        print(name)
    return EXIT_OK


# -- demo ------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    from cdcserver.demo import run_demo

    logs.setup("info")
    return run_demo(args.dir, args.listen, args.mariadb_port, args.trickle)


if __name__ == "__main__":
    sys.exit(main())
