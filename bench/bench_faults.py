"""The fault soak (issue 55, item 5): the chaos workload while a seeded scheduler injects
infrastructure faults, then every table against SELECT and a resuming client's ledger.

    .venv/bin/python -m bench.bench_faults [--faults 1000] [--seed 55] [--kinds K,K,...]
        [--check-every 100]

Runs ``tests/faultsoak.py`` (the same soak the suite runs short, in
``tests/integration/test_fault_soak.py``): a MariaDB server in a network namespace of its own
(root, iproute2 and nftables: ``tests/netfault.py``), ``cdcserver run`` reading it over the
namespace's link, and one fault after another drawn from the kinds (default: all of
``faultsoak.KINDS`` and ``KAFKA_KINDS``: the service killed with -9; the link to the source
partitioned, half-open either way, lossy, or slow and reordering (NFQUEUE,
``tests/netdelay.py``) for 2-8 s while the workload goes on; MariaDB
killed with -9 or restarted; the data directory's disk failing with EIO on write or fsync,
turned read-only, full, or syncing a second slower, for 2-8 s, through ``tests/diskfault``'s
shim; the link to the Kafka broker, in a namespace of its own, partitioned, half-open or
slow).
The service publishes every change exactly once to that broker (``--no-kafka``: no broker),
and a read_committed consumer reads the ledger's topic at each check.

Prints the faults by kind, the statements, exits of the service by itself (goal 0), faults
it did not recover from within 180 s (goal 0), checks it did not catch up for within 180 s
(goal 0), tables different from ``SELECT`` (goal 0), stream inconsistencies (goal 0), the
service's peak memory (RSS, the highest of its runs), the duplicates, gaps and out-of-order
records of the ledger table seen by the resuming client and by the Kafka consumer (goal 0),
and the time from each
fault's end until the service had applied everything the source logged (p50/p99/max, and by
kind). The code path measured is printed first (the figures are counts and recovery times).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, announce_code_path, line
from cdcserver.protocol.users import UsersFile
from tests import faultsoak
from tests.apache_kafka import ApacheKafka
from tests.netfault import Host

USER, PASSWORD = "soak", "soak"
# The broker's heap: each renamed table makes a topic, and the long run's thousands ran the
# tests' 256 MB broker out of heap (seeds 84 and 93: OutOfMemoryError, then it stopped).
SOAK_KAFKA_HEAP = "1g"


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
    args = parser.parse_args()
    announce_code_path()
    sys.exit(asyncio.run(soak(args)))


if __name__ == "__main__":
    main()
