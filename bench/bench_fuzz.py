"""Fuzzing at scale (issue 36): generated inputs through the session core and over real
sockets, the issue's own inputs replayed, memory measured, a normal client served after.

    .venv/bin/python -m bench.bench_fuzz [--core 1000000] [--sockets 100000] [--seed 36]

The generator and checks are tests/fuzzing.py's (tests/unit/test_fuzzing.py runs them at CI's
size). A failure prints its seed and input. Prints, per part: inputs, sessions or
connections, the process's RSS before and after (the listener runs in this process), and
the time taken; exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from bench.common import announce_code_path, line
from cdcserver.protocol.users import UsersFile
from tests import fuzzing, hardening


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="cdc-fuzz-") as tmp:
        for part in ("core", "sockets", "regression"):
            directory = os.path.join(tmp, part)
            os.makedirs(directory)
            running = await hardening.listener(directory, auth_timeout=2.0, idle_timeout=5.0)
            UsersFile(os.path.join(directory, "cdcusers")).add(
                fuzzing.VICTIM, fuzzing.VICTIM_PASSWORD, "shop.other")
            started = time.monotonic()
            try:
                if part == "core":
                    figures = await asyncio.to_thread(fuzzing.fuzz_core, running, args.core,
                                                      args.seed)
                    text = figures.line()
                elif part == "sockets":
                    figures = await fuzzing.fuzz_sockets(running, args.sockets, args.seed)
                    text = figures.line()
                else:
                    before = fuzzing.rss_mib()
                    sent = await fuzzing.replay_regression(running)
                    text = (f"{len(fuzzing.regression())} cases, {sent:,} inputs, nothing "
                            f"leaked; RSS {before:.0f} -> {fuzzing.rss_mib():.0f} MiB")
                await fuzzing.served_afterwards(running, records=2)
            finally:
                await running.server.stop()
                running.store.close()
            line(f"{part}: {time.monotonic() - started:.0f} s", text)
            line("  then a normal client", "served both records, in order")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--core", type=int, default=1_000_000,
                        help="inputs through the session state machine")
    parser.add_argument("--sockets", type=int, default=100_000,
                        help="inputs over real connections to the listener")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    announce_code_path()
    hardening.raise_fd_limit(4096)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
