"""The hardening figures (issue 8): inputs tried, connections held, faults survived, data lost.

    .venv/bin/python bench/hardening.py [--fuzz-examples 30000] [--socket-scripts 2000]
        [--connections 1000] [--skip-faults]

The listener scenarios (tests/hardening.py) run here at these sizes against a real listener on
127.0.0.1; the fault scenarios that need MariaDB and processes (a full disk, SIGTERM in every
phase, kill -9 under load, a restarted MariaDB, network drops) are their test files, run by
pytest in a subprocess: each test verifies every table against the source afterwards, so a
passing one has lost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import hardening

FAULT_TESTS = ["tests/server/test_disk_full.py", "tests/server/test_shutdown.py",
               "tests/server/test_crash.py"]


def line(label: str, value: str) -> None:
    print(f"{label:<58} {value}", flush=True)


async def listener_figures(args: argparse.Namespace) -> list[hardening.Figures]:
    results = []
    with tempfile.TemporaryDirectory(prefix="cdc-hardening-") as tmp:
        scenarios = [
            ("fuzz", lambda r: asyncio.to_thread(hardening.fuzz_sessions, r,
                                                 args.fuzz_examples), 1.0),
            ("sockets", lambda r: hardening.fuzz_sockets(r, args.socket_scripts), 1.0),
            ("connections", lambda r: hardening.hold_connections(r, args.connections), 5.0),
            ("slow", lambda r: hardening.slow_readers(r, clients=20, megabytes=50), 1.0),
            ("slowloris", lambda r: hardening.slowloris(r, connections=200, auth_timeout=1.0),
             1.0),
            ("oversized", lambda r: hardening.oversized_lines(r, count=20, size=8 << 20), 1.0),
            ("traversal", hardening.path_traversal, 1.0),
        ]  # (name, scenario, authentication timeout)
        for name, scenario, auth_timeout in scenarios:
            running = await hardening.listener(os.path.join(tmp, name),
                                               auth_timeout=auth_timeout)
            started = time.monotonic()
            try:
                figures = await scenario(running)
            finally:
                await running.server.stop()
                running.store.close()
            figures.notes.append(f"{time.monotonic() - started:.1f} s")
            line(figures.scenario, f"{figures.tried:,} tried, {figures.survived:,} survived, "
                 f"data lost {figures.lost} ({'; '.join(figures.notes)})")
            results.append(figures)
    return results


def fault_figures() -> tuple[int, int]:
    """(tests passed, tests run) of the fault scenarios."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                             *FAULT_TESTS], capture_output=True, text=True)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    passed = int(m[1]) if (m := re.search(r"(\d+) passed", summary)) else 0
    failed = int(m[1]) if (m := re.search(r"(\d+) failed", summary)) else 0
    for test in re.findall(r"^(?:PASSED|FAILED) (\S+)", result.stdout, re.M):
        line("  " + test.split("::")[-1][:56], "")
    if failed or result.returncode:
        print(result.stdout[-4000:], file=sys.stderr)
    return passed, passed + failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz-examples", type=int, default=30_000,
                        help="hypothesis examples (about 4 inputs each)")
    parser.add_argument("--socket-scripts", type=int, default=2_000)
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--skip-faults", action="store_true",
                        help="only the listener scenarios (no MariaDB needed)")
    args = parser.parse_args()
    results = asyncio.run(listener_figures(args))
    inputs = sum(f.tried for f in results if "fuzzing" in f.scenario)
    line("protocol inputs tried (fuzzing)", f"{inputs:,}")
    line("most connections held at once", f"{args.connections:,}")
    lost = sum(f.lost for f in results)
    if not args.skip_faults:
        passed, total = fault_figures()
        line("faults survived (full disk, SIGTERM x4, kill -9 x20, ...)",
             f"{passed} of {total} scenarios")
        ok = passed == total
    else:
        ok = True
    line("data lost", str(lost))
    return 0 if ok and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
