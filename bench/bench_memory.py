"""Peak memory of the service for a 1,000,000-row transaction and for 16 MB rows.

    .venv/bin/python bench/bench_memory.py

Loads a private MariaDB with (1) one transaction inserting 1,000,000 rows (INSERT ... SELECT
from the SEQUENCE engine) and (2) ten rows of 16 MiB each, then runs ``cdcserver run`` as a
separate process from the oldest binlog until its checkpoint covers everything, and prints the
process's peak resident memory (VmHWM) for each case, beside its baseline with an empty source.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT, announce_code_path, line
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.gtid import GtidState
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from cdcserver.store.checkpoint import covered_state
from tests.helpers import memory_mib

MIB = 1 << 20


def run_service(server: EmbeddedMariaDB, name: str) -> tuple[float, float, int]:
    """(peak RSS in MiB, seconds, bytes stored) for replicating the whole binlog."""
    data_dir = os.path.join(OUT, f"data-{name}")
    shutil.rmtree(data_dir, ignore_errors=True)
    users = os.path.join(OUT, "cdcusers")
    UsersFile(users).add("bench", "bench")
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    target = GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
    start = time.perf_counter()
    process = subprocess.Popen([exe, "run", "--source", server.url(), "--data-dir", data_dir,
                                "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                "--users-file", users,
                                "--server-id", "9200", "--log-level", "warning"],
                               preexec_fn=die_with_parent)  # no service left behind
    checkpoint = os.path.join(data_dir, "state", "checkpoint.json")
    peak = 0.0
    while True:
        peak = max(peak, memory_mib(process.pid, "VmHWM"))
        if _covers(checkpoint, target):
            break
        if process.poll() is not None:
            raise RuntimeError(f"the service exited with {process.returncode}")
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    peak = max(peak, memory_mib(process.pid, "VmHWM"))
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    stored = sum(os.path.getsize(os.path.join(data_dir, "avro", f))
                 for f in os.listdir(os.path.join(data_dir, "avro")))
    return peak, seconds, stored


def _covers(path: str, target: GtidState) -> bool:
    state = covered_state(path)
    return all(state.covers(g) for g in target)


def main() -> int:
    announce_code_path()
    base = os.path.join(OUT, "mariadb-memory")
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(base, port=0, extra_args=("--max-allowed-packet=64M",),
                             die_with_parent=True)
    server.start()
    try:
        server.execute("RESET MASTER", "CREATE DATABASE mem")
        peak, _, _ = run_service(server, "empty")
        line("baseline: service with an empty source, peak RSS", f"{peak:.0f} MiB")

        server.execute("RESET MASTER",
                       "CREATE TABLE mem.big (id INT PRIMARY KEY, a BIGINT, "
                       "b VARCHAR(100), c DECIMAL(12,2))",
                       "INSERT INTO mem.big SELECT seq, seq * 7, CONCAT('row ', seq), seq / 100 "
                       "FROM mem.seq_1_to_1000000")
        binlog = sum(int(r[1]) for r in server.query("SHOW BINARY LOGS")) / MIB
        peak, seconds, stored = run_service(server, "big")
        line("one transaction of 1,000,000 rows: binlog", f"{binlog:.0f} MiB")
        line("  service peak RSS", f"{peak:.0f} MiB")
        line("  time to durable, rows/s", f"{seconds:.1f} s, {1_000_000 / seconds:,.0f}")
        line("  stored Avro", f"{stored / MIB:.0f} MiB")

        server.execute("RESET MASTER",
                       "CREATE TABLE mem.wide (id INT PRIMARY KEY, body LONGBLOB)")
        conn = server.connect()
        with conn.cursor() as cur:
            for i in range(10):
                cur.execute("INSERT INTO mem.wide VALUES (%s, REPEAT(%s, %s))",
                            (i, chr(65 + i), 16 * MIB))
        conn.close()
        binlog = sum(int(r[1]) for r in server.query("SHOW BINARY LOGS")) / MIB
        peak, seconds, stored = run_service(server, "wide")
        line("ten rows of 16 MiB each: binlog", f"{binlog:.0f} MiB")
        line("  service peak RSS", f"{peak:.0f} MiB")
        line("  time to durable", f"{seconds:.1f} s")
        line("  stored Avro", f"{stored / MIB:.0f} MiB")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
