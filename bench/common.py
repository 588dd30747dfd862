"""Shared benchmark set-up: a private MariaDB holding the standard workload.

The standard workload (``../shared/reference/environment.md`` §3): table ``bench.orders`` with
8 mixed columns (INT, BIGINT, VARCHAR(64), DECIMAL(12,2), DATETIME, TEXT ~110 chars, DOUBLE,
JSON); 200,000 rows inserted in 200 transactions of 1,000, then 50,000 updated in 50
transactions of 1,000. That is 250,000 row changes (300,000 records: an update has a before
and an after image) in 257 GTIDs, about 120 MB of binlog.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cdcserver.app.embedded import EmbeddedMariaDB, kill_leftovers

# where benches keep their MariaDB and data (CDC_BENCH_OUT: another, for two benches at once:
# each kills a MariaDB left running in its own)
OUT = os.environ.get("CDC_BENCH_OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "out")
INSERTS, UPDATES, BATCH = 200_000, 50_000, 1_000
ROW_CHANGES = INSERTS + UPDATES
RECORDS = INSERTS + 2 * UPDATES

CREATE = """CREATE TABLE bench.orders (
    id INT AUTO_INCREMENT PRIMARY KEY, big BIGINT, name VARCHAR(64), amount DECIMAL(12,2),
    created DATETIME, body TEXT, score DOUBLE, attrs JSON)"""


@contextlib.contextmanager
def fresh_server(name: str) -> Iterator[EmbeddedMariaDB]:
    """A private MariaDB in bench/out/``name``, started empty, stopped after (killed with
    this process, however it ends)."""
    base = os.path.join(OUT, name)
    kill_leftovers(os.path.join(base, "data"))  # a bench killed by a timeout left it running
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(base, port=0, die_with_parent=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def workload_server(scale: int = 1, tables: tuple[str, ...] = ("orders",)
                    ) -> Iterator[EmbeddedMariaDB]:
    """A fresh MariaDB in bench/out with the standard workload (``scale`` times its rows) as
    its whole binlog (``tables``: spread over these tables of ``bench``, batch by batch)."""
    with fresh_server("mariadb") as server:
        load_workload(server, scale, tables)
        yield server


def load_workload(server: EmbeddedMariaDB, scale: int = 1,
                  tables: tuple[str, ...] = ("orders",), *, inserts: int | None = None,
                  database: str = "bench", reset: bool = True) -> int:
    """``scale`` times the standard workload: ``scale * INSERTS`` rows inserted, then
    ``scale * UPDATES`` updated, in transactions of ``BATCH`` (with several ``tables``, each
    batch goes to the next table in turn: the same rows and transactions, spread).
    ``inserts``: that many rows instead, and a quarter of them updated, as the standard
    workload's ratio (the last transaction of each kind smaller when they are not a multiple
    of ``BATCH``); ``database``: created for the tables, after ``RESET MASTER`` unless not
    ``reset``. Returns the row changes written."""
    rows = scale * INSERTS if inserts is None else inserts
    updates = scale * UPDATES if inserts is None else inserts // 4
    rng = random.Random(20261121)
    server.execute(*(["RESET MASTER"] if reset else []), f"CREATE DATABASE {database}",
                   *(CREATE.replace("bench.orders", f"{database}.{t}") for t in tables))
    conn = server.connect()
    conn.autocommit(False)
    with conn.cursor() as cur:
        for batch in range(-(-rows // BATCH)):
            values = [(rng.randint(-10**15, 10**15), f"customer-{batch}-{i}",
                       f"{rng.randint(0, 10**10) / 100:.2f}",
                       f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} 12:34:56",
                       "lorem ipsum dolor sit amet " * 4, rng.random() * 1000,
                       f'{{"k": {i}, "tag": "t{batch % 7}"}}')
                      for i in range(min(BATCH, rows - batch * BATCH))]
            cur.executemany(f"INSERT INTO {database}.{tables[batch % len(tables)]} (big, "
                            "name, amount, created, body, score, attrs) VALUES (%s, %s, %s, "
                            "%s, %s, %s, %s)", values)
            conn.commit()
        for batch in range(-(-updates // BATCH)):
            table, first = tables[batch % len(tables)], batch // len(tables) * BATCH + 1
            last = first + min(BATCH, updates - batch * BATCH) - 1
            cur.execute(f"UPDATE {database}.{table} SET score = score + 1, name = CONCAT(name, "
                        "'*') WHERE id BETWEEN %s AND %s", (first, last))
            conn.commit()
    conn.close()
    return rows + updates


def mariadb_binlog_rate(server: EmbeddedMariaDB) -> tuple[float, int]:
    """The C reference: ``mariadb-binlog --read-from-remote-server -v`` over the same binlog,
    output discarded. Returns (seconds, row changes it printed)."""
    logs = [row[0] for row in server.query("SHOW BINARY LOGS")]
    cmd = ["mariadb-binlog", "--no-defaults", "--read-from-remote-server", "-h127.0.0.1",
           f"-P{server.port}", "-uroot", "--base64-output=decode-rows", "-v", *logs]
    output = subprocess.run(cmd, capture_output=True, check=True).stdout  # to count, untimed
    rows = output.count(b"\n### INSERT") + output.count(b"\n### UPDATE") + \
        output.count(b"\n### DELETE")
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)  # timed, as environment.md ran it
    return time.perf_counter() - start, rows


def raw_transfer_seconds(server: EmbeddedMariaDB) -> float:
    """The transport ceiling: ``mariadb-binlog --read-from-remote-server --raw`` copying the
    same binlog to files in bench/out, no decoding. Seconds."""
    logs = [row[0] for row in server.query("SHOW BINARY LOGS")]
    target = os.path.join(OUT, "raw") + os.sep
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    start = time.perf_counter()
    subprocess.run(["mariadb-binlog", "--no-defaults", "--read-from-remote-server", "--raw",
                    "-h127.0.0.1", f"-P{server.port}", "-uroot", f"--result-file={target}",
                    *logs], stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(target, ignore_errors=True)
    return seconds


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def require_tools(bench: str, **packages: str) -> None:
    """The reference tools a bench runs beside the service (command -> Debian package):
    installed with apt when missing and running as root, else one line saying what to
    install, before any work is done."""
    from cdcserver.app.embedded import install_missing

    missing = install_missing(*(f"{command}={package}" for command, package in
                                packages.items()))
    if missing:
        sys.exit(f"{bench} needs {', '.join(missing)}: apt-get install {' '.join(missing)} "
                 "(as root), then run it again")


def process_cpu(pid: int, children: bool = False) -> float:
    """CPU-seconds a process used so far, user and system (with ``children``: and its
    children's that it has reaped), from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def line(label: str, value: str) -> None:
    print(f"{label:<58} {value}", flush=True)


def code_path() -> str:
    """Which path the service measured runs: the compiled extensions (the JSON block renderer
    and the transcoder) or the pure-Python fallbacks, and where the package was loaded from."""
    import cdcserver
    from cdcserver.protocol import render
    from cdcserver.store import transcoder

    where = os.path.dirname(cdcserver.__file__)
    if render._jsonlines is not None and transcoder.available():
        return f"compiled extensions (C JSON renderer, transcoder), from {where}"
    return f"pure Python (extensions not built or CDC_PURE_PYTHON set), from {where}"


def announce_code_path() -> str:
    """Print the code path measured; refuse a comparison on the pure-Python path unless
    ``CDC_PURE_PYTHON=1`` asks for it (a checkout whose extensions were built elsewhere)."""
    path = code_path()
    line("code path measured", path)
    refuse_python_path(path.startswith("pure"), "the compiled extensions are")
    return path


def refuse_python_path(python: bool, compiled: str) -> None:
    """Stop a comparison that would measure a Python path unless ``CDC_PURE_PYTHON=1`` asks
    for it; ``compiled`` names what is not built."""
    if python and not os.environ.get("CDC_PURE_PYTHON"):
        sys.exit(f"{compiled} not built here (pip install -e .): this would measure the Python "
                 "path; set CDC_PURE_PYTHON=1 to measure it on purpose")
