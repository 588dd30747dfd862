"""Exactly-once delivery under kill -9: the figures issue 52 asks for.

    .venv/bin/python bench/bench_kafka_exactly_once.py [--kills 100] [--seed 52]

Starts a private MariaDB and Apache Kafka (KRaft, one broker) in bench/out, then runs
``tests/kafka_exactly_once.kill_loop``: the installed ``cdcserver`` (the path printed first)
is started with ``[kafka] delivery = "exactly-once"`` and killed with SIGKILL ``--kills``
times at random instants (0.5 to 2.5 s after each start) while a load writes to the source
(single-row and multi-row transactions, updates, deletes, a big one now and then, one ALTER
half way); then it runs until Kafka's committed position covers the source. A
``read_committed`` consumer reads every topic; each change the Avro store holds must be
there exactly once, each partition in GTID order, and replaying the topics must give the
source's rows (``SELECT``). Prints kills, source transactions, messages, duplicates, gaps and
out-of-order messages; a failure prints its seed. Then (``--outage``) the broker is killed
for a minute while rows are written (``tests/kafka_exactly_once.broker_outage``): every row
must reach a read_committed consumer once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, announce_code_path, fresh_server, line
from cdcserver.protocol.users import UsersFile
from tests.apache_kafka import ApacheKafka
from tests.conftest import Source
from tests.helpers import PASSWORD, USER
from tests.kafka_exactly_once import broker_outage, kill_loop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=52)
    parser.add_argument("--outage", type=float, default=60.0,
                        help="then: seconds the broker stays killed while rows are written "
                             "(0: skip)")
    args = parser.parse_args()
    announce_code_path()
    work = os.path.join(OUT, "exactly-once")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    users = os.path.join(work, "cdcusers")
    UsersFile(users).add(USER, PASSWORD)
    with fresh_server("mariadb-eos") as server:
        server.execute("RESET MASTER", "CREATE DATABASE eos")
        broker = ApacheKafka(os.path.join(work, "kafka"))
        broker.start()
        try:
            figures = asyncio.run(kill_loop(os.path.join(work, "run"), Source(server, "eos"),
                                            users, broker.bootstrap, args.kills, args.seed,
                                            catch_up=1800.0))
        except AssertionError:
            print(f"FAILED with seed {args.seed}", file=sys.stderr)
            raise
        finally:
            broker.close()
        outage = None
        if args.outage:
            # (the outage runs the service in this process: aiokafka's line per failed
            # connection to the killed broker, ten a second, would bury the figures)
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
            server.execute("RESET MASTER", "CREATE DATABASE eos_outage")
            broker = ApacheKafka(os.path.join(work, "kafka-outage"))
            broker.start()
            try:
                outage = asyncio.run(broker_outage(
                    broker, Source(server, "eos_outage"), users,
                    os.path.join(work, "outage"), args.outage))
            finally:
                broker.close()
    line("kills (SIGKILL under load)", f"{figures.kills}")
    line("source transactions", f"{figures.transactions:,}")
    line("messages read (read_committed)", f"{figures.messages:,}")
    line("duplicates", f"{figures.duplicates}")
    line("gaps (stored changes not in Kafka)", f"{figures.missing}")
    line("out of GTID order in a partition", f"{figures.out_of_order}")
    line("seconds", f"{figures.seconds:.0f}")
    if outage is not None:
        line(f"broker killed for {outage.away:.0f} s: rows written",
             f"{outage.written:,} ({outage.messages:,} read once, none twice, none "
             f"missing; {outage.rewinds} rewinds)")
    return 0 if not (figures.duplicates or figures.missing or figures.out_of_order) else 1


if __name__ == "__main__":
    sys.exit(main())
