"""The chaos soak: random schema migrations and row changes against a real MariaDB, the service
killed with -9 at random points, every table compared with its raw JSON stream after each run.

    .venv/bin/python -m bench.bench_chaos --statements 100000 [--per-run 5000] [--kill-every 60]
        [--sessions]

Runs ``tests/chaos.py`` (the same generator and oracle as ``tests/server/test_chaos.py``) for
``statements / per-run`` seeds in a row, each on a database of its own, a fresh data directory
and a service of its own, and prints per run and in all: statements (and those the source
refused, as an application would see them), kills, quarantines, exits of the service by itself
(goal 0), tables that differ from SELECT (goal 0), stream inconsistencies (goal 0: an
``update_before`` or ``delete`` that is not the row the stream holds for its key, an ``insert``
of a key it holds, counted by ``tests/oracle.py`` as a consumer auditing before-images would),
and how long each resync took. The statement list of a run that failed or found
inconsistencies is written to bench/out/chaos-<seed>.sql to replay it. The code path
measured is printed first (it does not change the figures, which are counts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import time

import pymysql

from bench.common import OUT, announce_code_path, line
from cdcserver.app.embedded import EmbeddedMariaDB, kill_leftovers
from cdcserver.protocol.users import UsersFile
from tests import chaos

USER, PASSWORD = "soak", "soak"


def _drop(server: EmbeddedMariaDB, database: str) -> None:
    """Drop a run's database. What an application session may have left holds locks on it:
    an XA transaction still prepared (rolled back here), a connection still open in a
    transaction (killed). Two soaks stopped at this drop with a lock wait timeout."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("XA RECOVER FORMAT='SQL'")
            for row in cur.fetchall():
                cur.execute(f"XA ROLLBACK {row[3]}")
            cur.execute("SELECT ID FROM information_schema.PROCESSLIST "
                        "WHERE DB = %s AND ID <> CONNECTION_ID()", (database,))
            for (thread,) in cur.fetchall():
                with contextlib.suppress(pymysql.err.MySQLError):  # (gone meanwhile)
                    cur.execute(f"KILL {int(thread)}")
            cur.execute(f"DROP DATABASE {database}")
    finally:
        conn.close()


async def soak(server: EmbeddedMariaDB, args: argparse.Namespace) -> int:
    users = os.path.join(OUT, "chaos-users")
    UsersFile(users).add(USER, PASSWORD)
    runs = max(1, args.statements // args.per_run)
    totals = chaos.Outcome(seed=-1)
    failures = 0
    started = time.monotonic()
    for run in range(runs):
        seed = args.seed + run
        database = f"chaos_{seed}"
        # Each run's service starts from an empty binlog: without this it first replays every
        # earlier run's history, and later runs measure that backlog instead of their own.
        server.execute("RESET MASTER", f"DROP DATABASE IF EXISTS {database}",
                       f"CREATE DATABASE {database}")
        data_dir = os.path.join(OUT, "chaos-data")
        shutil.rmtree(data_dir, ignore_errors=True)
        outcome = await chaos.run(
            server.url(), lambda db=database: server.connect(db), database, data_dir, users,
            USER, PASSWORD, seed=seed, statements=args.per_run, kill_every=args.kill_every,
            log_path=os.path.join(OUT, "chaos-service.log"), sessions=args.sessions)
        line(f"run {run + 1}/{runs} (seed {seed})",
             f"{outcome.statements} statements ({outcome.refused} refused), {outcome.kills} "
             f"kills, {outcome.quarantines} quarantines, {len(outcome.exits)} exits, "
             f"{len(outcome.differences)} tables differ, "
             f"{sum(outcome.inconsistencies.values())} stream inconsistencies")
        for example in outcome.inconsistency_examples[:3]:
            print(f"    e.g. {example}", flush=True)
        if not outcome.exact:  # to replay it
            await asyncio.to_thread(_write, os.path.join(OUT, f"chaos-{seed}.sql"),
                                    outcome.statement_list())
        if not outcome.exact:
            failures += 1
            print(outcome.report(), f"\nstatements: {os.path.join(OUT, f'chaos-{seed}.sql')}",
                  flush=True)
        totals.statements += outcome.statements
        totals.refused += outcome.refused
        totals.kills += outcome.kills
        totals.quarantines += outcome.quarantines
        totals.exits += outcome.exits
        totals.resyncs += outcome.resyncs
        totals.differences.update({f"{seed}:{t}": d for t, d in outcome.differences.items()})
        totals.inconsistencies.update(outcome.inconsistencies)
        await asyncio.to_thread(_drop, server, database)
    elapsed = time.monotonic() - started
    line("statements (refused by the source)", f"{totals.statements:,} ({totals.refused:,})")
    line("kill -9 of the service", f"{totals.kills:,}")
    line("quarantines", f"{totals.quarantines:,}")
    line("exits of the service by itself (goal 0)", f"{len(totals.exits):,}")
    line("tables different from SELECT (goal 0)", f"{len(totals.differences):,}")
    line("stream inconsistencies (goal 0)", f"{sum(totals.inconsistencies.values()):,}")
    for kind, count in totals.inconsistencies.most_common():
        line(f"  {kind}", f"{count:,}")
    if totals.resyncs:
        line("resyncs: count, median, max seconds",
             f"{len(totals.resyncs)}, {statistics.median(totals.resyncs):.2f}, "
             f"{max(totals.resyncs):.2f}")
    else:
        line("resyncs", "none needed")
    line("runs failed", f"{failures} of {runs} ({elapsed / 60:.1f} minutes in all)")
    return 1 if failures else 0


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--statements", type=int, default=100_000)
    parser.add_argument("--per-run", type=int, default=5000)
    parser.add_argument("--kill-every", type=int, default=60,
                        help="a kill -9 about every this many statements (0: none)")
    parser.add_argument("--seed", type=int, default=20261128, help="the first run's seed")
    parser.add_argument("--sessions", action="store_true",
                        help="application sessions too: XA transactions left prepared "
                        "across kills, statement-logged changes, savepoint rollbacks")
    args = parser.parse_args()
    announce_code_path()
    base = os.path.join(OUT, "chaos-mariadb")
    kill_leftovers(os.path.join(base, "data"))
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(OUT, exist_ok=True)
    server = EmbeddedMariaDB(base, port=0, die_with_parent=True)
    server.start()
    try:
        code = asyncio.run(soak(server, args))
    finally:
        server.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
