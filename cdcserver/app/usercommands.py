"""``cdcserver users add|remove|list|check``: the users file (``protocol/users.py``)."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from cdcserver.app.process import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cdcserver.app.startup import check_users_file
from cdcserver.core import config as cfg
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import Dialect


def add_command(commands: Any) -> None:
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
