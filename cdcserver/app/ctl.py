"""``cdcserver ctl``: the admin API (docs/admin.md) from a terminal, as ``maxctrl`` is MaxScale's.

    cdcserver ctl [--url URL] [--token-file FILE] [--cacert FILE] [--json] [--timeout S]
                  [--config FILE] COMMAND
      replication                 the replication's state, source, position, lag, problems
      clients                     the connections, and how far behind each stream is
      tables                      the stored tables, their versions, sizes and state
      dumps                       the complete dumps, and those being taken
      dump DB.TABLE|DB.* [...] [--progress]   take dumps (follow them to the end)
      resync DB.TABLE [...]       resync quarantined tables now
      kick ID                     disconnect a client
      reload-users                read the users file again now

The API's address is ``--url``, else ``[admin] listen`` of the configuration (HTTPS when it
has a ``tls_cert``); the token is ``--token-file``'s, else ``CDCSERVER_ADMIN_TOKEN``'s, else
``[admin] token_file``'s. Tables are printed for a person; ``--json`` prints the API's JSON.
Standard library HTTP only (urllib): nothing more to install. Exit 0 on success, 1 when the
API refuses or cannot be reached, 2 when there is no token or the configuration is unusable.

This module is the command line and the short actions; the API client is ``ctlapi.py``,
following dumps to their end ``ctldumps.py``, and the tables printed ``ctlformat.py``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from cdcserver.app.ctlapi import PROG, TIMEOUT, TOKEN_VARIABLE, Api, CtlError, table_path
from cdcserver.app.ctldumps import take_dumps
from cdcserver.app.ctlformat import (
    err,
    out,
    print_json,
    render_clients,
    render_dumps,
    render_replication,
    render_tables,
    thousands,
)
from cdcserver.app.process import EXIT_OK, EXIT_USAGE
from cdcserver.core.errors import ConfigError

RESYNC_PATH = "/api/v1/tables/{table}/resync"  # the table percent-encoded


# -- the command line ----------------------------------------------------------------------

def add_command(commands: Any) -> None:
    """``ctl`` and its actions, under ``cdcserver``'s subcommands."""
    ctl = commands.add_parser("ctl", help="a running service's admin API from the terminal "
                                          "(clients, tables, dumps, resync, kick; docs/admin.md)",
                              description="The admin API of a running service (docs/admin.md), as "
                                          "maxctrl is MaxScale's: tables for a person, --json "
                                          "for a script.")
    _common_options(ctl)
    ctl.set_defaults(**_COMMON_DEFAULTS)
    actions = ctl.add_subparsers(metavar="ACTION", required=True)

    def action(name: str, handler: Callable[[Api, argparse.Namespace], int], helptext: str
               ) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=helptext, description=helptext)
        _common_options(sub)  # the options may follow the action too
        sub.set_defaults(handler=lambda args: run(args, handler))
        return sub

    action("replication", show_replication, "the replication: state, source, position, lag, "
                                            "problems, quarantined tables")
    action("clients", show_clients, "the connected clients, what each reads and how far "
                                    "behind it is")
    action("tables", show_tables, "the stored tables: versions, records, size, state")
    action("dumps", show_dumps, "the complete dumps and their readers, and the dumps being "
                                "taken")
    dump = action("dump", take_dumps, "take dumps of tables now, without stopping replication")
    dump.add_argument("tables", nargs="+", metavar="DB.TABLE|DB.*",
                      help="the tables to dump (DB.*: every table of DB)")
    dump.add_argument("--progress", action="store_true",
                      help="follow the dumps until they are complete, with a progress bar "
                           "each (exit 1 if one fails)")
    resync = action("resync", resync_tables, "resync quarantined tables now")
    resync.add_argument("tables", nargs="+", metavar="DB.TABLE",
                        help="quarantined tables (as `cdcserver ctl tables` names them)")
    kick = action("kick", kick_client, "disconnect a client (it gets ERR FORBIDDEN)")
    kick.add_argument("id", type=int, metavar="ID", help="the client's id (`cdcserver ctl "
                                                         "clients`)")
    action("reload-users", reload_users, "read the users file again now (ends the sessions "
                                         "of removed users)")


_COMMON_DEFAULTS: dict[str, Any] = {"url": None, "token_file": None, "cacert": None,
                                    "json": False, "timeout": TIMEOUT, "config": None}


def _common_options(parser: argparse.ArgumentParser) -> None:
    """ctl's options, on ``ctl`` and on each action: given before or after the action. Their
    defaults are ``ctl``'s (:data:`_COMMON_DEFAULTS`); an action's own parser sets only what
    was given to it, so it does not undo what was given before it."""
    default = argparse.SUPPRESS
    parser.add_argument("--url", default=default, metavar="URL",
                        help="the admin API, http://HOST:PORT or https://HOST:PORT (default: "
                             "from [admin] listen and tls_cert of the configuration)")
    parser.add_argument("--token-file", default=default, metavar="FILE",
                        help=f"the file holding the admin token (default: ${TOKEN_VARIABLE}, "
                             "else [admin] token_file of the configuration)")
    parser.add_argument("--cacert", default=default, metavar="FILE",
                        help="trust the certificate authorities in this PEM file for HTTPS "
                             "(e.g. a self-signed admin.tls_cert)")
    parser.add_argument("--json", action="store_true", default=default,
                        help="print the API's JSON as it is (for scripts)")
    parser.add_argument("--timeout", type=float, default=default, metavar="SECONDS",
                        help=f"seconds to wait for each answer (default {TIMEOUT:g})")
    parser.add_argument("--config", default=default, metavar="FILE",
                        help="the service's TOML file (its [admin] section is read)")


def run(args: argparse.Namespace,
        handler: Callable[[Api, argparse.Namespace], int]) -> int:
    """Run one action; its failure is one line on stderr."""
    try:
        return handler(Api.of(args), args)
    except CtlError as exc:
        err(f"{PROG}: {exc}")
        return exc.status
    except ConfigError as exc:
        err(f"{PROG}: {exc}")
        return EXIT_USAGE


# -- the actions -----------------------------------------------------------------------------

def listing(path: str, render: Callable[[Any], str]) -> Callable[[Api, argparse.Namespace], int]:
    """An action that prints what ``GET path`` answers: ``render``'s table, or the JSON."""
    def show(api: Api, args: argparse.Namespace) -> int:
        document = api.get(path)
        out(json.dumps(document, indent=1, ensure_ascii=False) if args.json
            else render(document))
        return EXIT_OK
    return show


show_replication = listing("/api/v1/replication", render_replication)
show_clients = listing("/api/v1/clients", lambda d: render_clients(d["clients"]))
show_tables = listing("/api/v1/tables", lambda d: render_tables(d["tables"]))
show_dumps = listing("/api/v1/dumps", render_dumps)


def resync_tables(api: Api, args: argparse.Namespace) -> int:
    status = EXIT_OK
    answers = []
    for text in args.tables:
        try:
            answer = api.call("POST", RESYNC_PATH.format(table=table_path(text)))
        except CtlError as exc:
            err(f"{PROG}: {exc}")
            status = max(status, exc.status)
            continue
        answers.append(answer)
        if not args.json:
            out(f"resyncing {answer.get('resyncing', text)} (`{PROG} tables` shows when it "
                "is released)")
    if args.json and answers:
        print_json(answers[0] if len(answers) == 1 else answers)
    return status


def kick_client(api: Api, args: argparse.Namespace) -> int:
    answer = api.call("DELETE", f"/api/v1/clients/{args.id}")
    if args.json:
        print_json(answer)
    else:
        out(f"disconnected client {answer.get('disconnected', args.id)}")
    return EXIT_OK


def reload_users(api: Api, args: argparse.Namespace) -> int:
    answer = api.call("POST", "/api/v1/users/reload")
    if args.json:
        print_json(answer)
    else:
        users = answer.get("users")
        out(f"read the users file again: {thousands(users)} "
            f"{'user' if users == 1 else 'users'}")
    return EXIT_OK
