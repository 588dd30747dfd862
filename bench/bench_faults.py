"""The fault soak (issue 55, item 5): the chaos workload while a seeded scheduler injects
infrastructure faults, then every table against SELECT and a resuming client's ledger.

    .venv/bin/python -m bench.bench_faults [--faults 1000] [--seed 55] [--kinds K,K,...]
        [--check-every 100] [--steps-between 10,40] [--pace 0] [--fault-seconds 2,8]
        [--min-available-mib 1024]

Runs ``tests/faultsoak.py`` (the same soak the suite runs short, in
``tests/integration/test_fault_soak.py``): a MariaDB server in a network namespace of its own
(root, iproute2 and nftables: ``tests/netfault.py``), ``cdcserver run`` reading it over the
namespace's link, and one fault after another drawn from the kinds (default: all of
``faultsoak.KINDS`` and ``KAFKA_KINDS``: the service killed with -9; the link to the source
partitioned, half-open either way, lossy, or slow and reordering (NFQUEUE,
``tests/netdelay.py``) for 2-8 s (``--fault-seconds``) while the workload goes on; MariaDB
killed with -9 or restarted; the data directory's disk failing with EIO on write or fsync,
turned read-only, full, or syncing a second slower, for 2-8 s, through ``tests/diskfault``'s
shim; the link to the Kafka broker, in a namespace of its own, partitioned, half-open or
slow).
The service publishes every change exactly once to that broker, one topic for the database
(``--no-kafka``: no broker), and a read_committed consumer reads the ledger's rows from it at
each check.

Between faults the workload takes 10 to 40 steps (``--steps-between``), and during a fault as
many as the source takes (about 700 a fault: seed 106's first 50 faults ran 33,442 steps), or
``--pace`` a second. Each check rebuilds every table from its stream, through every rename the
migrations made since the start, so its time and memory grow with the statements run (9 GB and
12 minutes at 168,548 statements, seeds 103 and 104): a long run of 1,000 faults takes
``--steps-between 3,10 --pace 25``, about 130 steps a fault. The run stops, its last check's
figures printed, if the machine's available memory falls below ``--min-available-mib`` (a check
past the machine's memory would have the kernel kill whatever it picks).

Prints the faults by kind, the statements, exits of the service by itself (goal 0), faults it
did not recover from within 180 s (goal 0), checks it did not catch up for within 180 s (goal
0), tables different from ``SELECT`` (goal 0), stream inconsistencies (goal 0), the service's
peak memory (RSS, the highest of its runs), the duplicates, gaps and out-of-order records of
the ledger table seen by the resuming client and by the Kafka consumer (goal 0), and the time
from each fault's end until the service had applied everything the source logged (p50/p99/max,
and by kind). The code path measured is printed first (the figures are counts and recovery
times).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, announce_code_path, line
from cdcserver.protocol.users import UsersFile
from tests import faultsoak
from tests.apache_kafka import ApacheKafka
from tests.netfault import Host

USER, PASSWORD = "soak", "soak"
# The broker's heap: when each renamed table made a topic, the long run's thousands ran the
# tests' 256 MB broker out of heap (seeds 84 and 93: OutOfMemoryError, then it stopped).
SOAK_KAFKA_HEAP = "1g"
MEMORY_LOOK = 2.0  # seconds between the watchdog's looks at MemAvailable


def _available_mib() -> int:
    with open("/proc/meminfo") as f:
        for text in f:
            if text.startswith("MemAvailable:"):
                return int(text.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _watch_memory(least_mib: int) -> None:
    """Interrupts the run (as Ctrl-C does: every process it started is stopped) once the
    machine has less than ``least_mib`` MiB available."""
    def watch() -> None:
        while True:
            available = _available_mib()
            if available < least_mib:
                print(f"  stopping: {available} MiB of memory available, under "
                      f"--min-available-mib {least_mib}", flush=True)
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(MEMORY_LOOK)

    threading.Thread(target=watch, name="memory watchdog", daemon=True).start()


async def soak(args: argparse.Namespace) -> int:
    os.makedirs(OUT, exist_ok=True)
    users = os.path.join(OUT, "faults-users")
    UsersFile(users).add(USER, PASSWORD)
    base = os.path.join(OUT, "faults-mariadb")
    data_dir = os.path.join(OUT, "faults-data")
    for path in (base, data_dir):
        shutil.rmtree(path, ignore_errors=True)
    known = (*faultsoak.KINDS, *faultsoak.KAFKA_KINDS) if args.kafka else faultsoak.KINDS
    kinds = tuple(args.kinds.split(",")) if args.kinds else known
    unknown = set(kinds) - set(known)
    if unknown:
        raise SystemExit(f"unknown fault kinds {sorted(unknown)}; known: {known}")
    kafka_dir = os.path.join(OUT, "faults-kafka")
    shutil.rmtree(kafka_dir, ignore_errors=True)
    with Host() as host, Host() as kafka_host:
        server = faultsoak.source_in(host, base)
        kafka = ApacheKafka(kafka_dir, host=kafka_host, heap=SOAK_KAFKA_HEAP) \
            if args.kafka else None
        try:
            if kafka is not None:
                await asyncio.to_thread(kafka.start)
            server.execute("CREATE DATABASE soak")
            figures = await faultsoak.run(
                server, host, "soak", data_dir, users, USER, PASSWORD, seed=args.seed,
                faults=args.faults, kinds=kinds, check_every=args.check_every,
                steps_between=args.steps_between, pace=args.pace,
                fault_seconds=args.fault_seconds,
                kafka=kafka, kafka_host=kafka_host if kafka is not None else None,
                log_path=os.path.join(OUT, "faults-service.log"),
                progress=lambda text: print(f"  ... {text}", flush=True),
                checked=_print_checked)
        finally:
            server.stop()
            if kafka is not None:
                await asyncio.to_thread(kafka.close)
    for label, value in faultsoak.describe(figures):
        line(label, value)
    if not figures.exact:
        print(figures.report(), flush=True)
    return 0 if figures.exact else 1



def _print_checked(figures: faultsoak.Figures) -> None:
    """The figures of a check during the run (a run cut short keeps the last ones)."""
    print(f"  checked after {figures.checked_after:,} faults:", flush=True)
    for label, value in faultsoak.describe(figures):
        print(f"    {label}: {value}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=55)
    parser.add_argument("--check-every", type=int, default=100,
                        help="faults between the checks (tables, stream, ledger) during the "
                             "run; 0: only at the end")
    parser.add_argument("--kinds", default="", help="comma-separated, of " +
                        ", ".join((*faultsoak.KINDS, *faultsoak.KAFKA_KINDS)))
    parser.add_argument("--no-kafka", dest="kafka", action="store_false",
                        help="no Kafka broker: the service publishes nowhere, no Kafka faults")
    parser.add_argument("--steps-between", type=_steps, default=(10, 40),
                        help="LO,HI: the workload's steps before each fault, drawn between")
    parser.add_argument("--fault-seconds", type=_seconds, default=(2.0, 8.0),
                        help="LO,HI: how long each fault lasts, drawn between (a kill and "
                             "restart takes what it takes)")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="the workload's steps per second during a fault at most "
                             "(0: as fast as the source takes them)")
    parser.add_argument("--min-available-mib", type=int, default=1024,
                        help="stop the run when the machine has less memory available")
    args = parser.parse_args()
    # Ctrl-C's way to stop, for a run started in the background too (a shell starts a
    # background job with SIGINT ignored, and Python then leaves it so: the watchdog's
    # interrupt, and a `kill -INT`, did nothing)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    announce_code_path()
    during = f"at most {args.pace:g} a second" if args.pace else "as fast as the source takes them"
    print(f"  workload: {args.steps_between[0]} to {args.steps_between[1]} steps before each "
          f"fault, and during it {during}; faults of {args.fault_seconds[0]:g} to "
          f"{args.fault_seconds[1]:g} s", flush=True)
    _watch_memory(args.min_available_mib)
    sys.exit(asyncio.run(soak(args)))


def _steps(text: str) -> tuple[int, int]:
    low, _, high = text.partition(",")
    steps = (int(low), int(high or low))
    if not 0 <= steps[0] <= steps[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: LO,HI with 0 <= LO <= HI")
    return steps


def _seconds(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    seconds = (float(low), float(high or low))
    if not 0 < seconds[0] <= seconds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: LO,HI with 0 < LO <= HI")
    return seconds


if __name__ == "__main__":
    main()
