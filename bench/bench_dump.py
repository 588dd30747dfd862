"""Dump rows/s beside ``mariadb-dump --single-transaction`` and ``mydumper``, same table, same run.

    .venv/bin/python bench/bench_dump.py [--runs N] [--readers 2] [--big 10000000]

Prints, for ``bench.orders`` of the standard workload (bench/common.py), best of N runs each:
- mariadb-dump --single-transaction rows/s (the C reference; SQL text to /dev/null);
- mydumper rows/s with as many threads as the dump has readers, the table split in chunks
  (``--rows``; Debian's package; files to a directory), the parallel C reference;
- ``cdcserver dump`` in one snapshot (``readers = 0``) and chunked (``readers = N``: short reads
  over key ranges, the changes between them merged in from the store), each a durable dump
  file renamed into place, with their ratios to both references. The service replicates into
  the same data directory meanwhile (its own process), as it does in production: chunked
  dumps take the changes between chunks from its store;
- serving that dump to a client (REQUEST-DUMP: sendfile to a socket that discards it), MB/s;
- the client library decoding it back to typed rows (DumpDecoder), rows/s.
With ``--big N``: the same for a table of N rows (``bench.big``, made with the sequence engine),
with the dump's peak RSS. The first line says which row path was measured (the compiled one,
cdcserver/dump/_rawrows.pyx, or pure Python); the script refuses to compare on a path other
than the installed one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import INSERTS, OUT, line, process_cpu, require_tools, workload_server
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import DumpConfig, SourceAddress
from cdcserver.core.lifetime import die_with_parent
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.dump.files import DumpInfo
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.server import CdcServer
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from mariadb_cdc_client.format.dump import DumpDecoder, DumpRows
from mariadb_cdc_client.format.wire import auth_message

TABLE = TableName("bench", "orders")
T = TypeVar("T")


def mariadb_dump_seconds(server: EmbeddedMariaDB, table: TableName, to_file: bool = False
                         ) -> float:
    """mariadb-dump's SQL to /dev/null, or (``to_file``) to a file in bench/out that is
    then fsynced, as a dump kept on disk is (ours is durable before it is listed)."""
    cmd = ["mariadb-dump", "--no-defaults", "-h127.0.0.1", f"-P{server.port}", "-uroot",
           "--single-transaction", table.database, table.table]
    path = os.path.join(OUT, "mariadb-dump.sql")
    start = time.perf_counter()
    if not to_file:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - start
    with open(path, "wb") as out:
        subprocess.run(cmd, stdout=out, check=True)
        os.fsync(out.fileno())
    seconds = time.perf_counter() - start
    os.unlink(path)
    return seconds


def mydumper_seconds(server: EmbeddedMariaDB, table: TableName, threads: int,
                     rows: int) -> float:
    out = os.path.join(OUT, "mydumper")
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mydumper", "-h", "127.0.0.1", "-P", str(server.port), "-u", "root",
           "-B", table.database, "-T", table.table,
           "-t", str(threads), "--rows", str(max(rows // (threads * 4), 1000)), "-o", out]
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - start
    written = [name for name in os.listdir(out) if name.startswith(f"{table.database}."
                                                                   f"{table.table}.")]
    assert len(written) > 1, f"mydumper wrote no chunks of {table}: {os.listdir(out)}"
    shutil.rmtree(out, ignore_errors=True)
    return seconds


@contextlib.contextmanager
def service_replicating(server: EmbeddedMariaDB, data_dir: str, listen: str = "127.0.0.1:0",
                        server_id: int = 9300) -> Iterator[int]:
    """``cdcserver run`` into ``data_dir`` (its own process group, killed however this
    ends), its listener on ``listen`` (its users file beside the data directory: user and
    password ``bench``), caught up with the source; yields its pid."""
    from cdcserver.core.gtid import GtidState
    from cdcserver.store.reader import wait_for_checkpoint

    shutil.rmtree(data_dir, ignore_errors=True)
    users = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "cdcusers")
    os.makedirs(os.path.dirname(users), exist_ok=True)
    UsersFile(users).add("bench", "bench")
    cdcserver = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    process = subprocess.Popen(
        [cdcserver, "run", "--source", server.url(), "--data-dir", data_dir, "--listen",
         listen, "--metrics-listen", "127.0.0.1:0", "--users-file", users,
         "--server-id", str(server_id), "--start-gtid", "oldest", "--log-level", "warning"],
        start_new_session=True, preexec_fn=die_with_parent)  # no service left behind
    try:
        file, pos = server.query("SHOW MASTER STATUS")[0][:2]
        state = GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
        wait_for_checkpoint(data_dir, str(file), int(pos), 600, state)
        yield process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def our_dump(server: EmbeddedMariaDB, data_dir: str, table: TableName, readers: int,
             rows: int) -> tuple[float, DumpInfo]:
    shutil.rmtree(os.path.join(data_dir, "dump"), ignore_errors=True)
    address = SourceAddress(host="127.0.0.1", port=server.port, user="root", password="")
    start = time.perf_counter()
    (result,) = dump_tables(address, data_dir, [table], DumpOptions(DumpConfig(readers=readers)))
    seconds = time.perf_counter() - start
    assert result.info.header.rows == rows, result.info.header.rows
    return seconds, result.info


def row_path() -> str:
    from cdcserver.dump import rawrows

    where = os.path.dirname(rawrows.__file__)
    if rawrows.compiled is not None:
        return f"compiled (cdcserver/dump/_rawrows.pyx), from {where}"
    return f"pure Python (cdcserver/dump/rawrows.py), from {where}"


def big_table(server: EmbeddedMariaDB, rows: int) -> TableName:
    server.execute(  # not in the binlog: gigabytes of it would measure the service instead
        "SET SESSION sql_log_bin = 0",
        "DROP TABLE IF EXISTS bench.big", "CREATE TABLE bench.big LIKE bench.orders",
        "INSERT INTO bench.big (id, big, name, amount, created, body, score, attrs) "
        "SELECT seq, seq * 7919, CONCAT('customer-', seq), seq % 100000 / 100, "
        "'2024-05-06 12:34:56', REPEAT('lorem ipsum ', 9), seq / 3, "
        f"CONCAT('{{\"k\": ', seq, '}}') FROM bench.seq_1_to_{int(rows)}",
        "ANALYZE TABLE bench.big")
    return TableName("bench", "big")


def _own_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def with_cpu(server: EmbeddedMariaDB, who: int, run: Callable[[], T]
             ) -> tuple[T, float, float]:
    """``run()``, and the CPU-seconds it cost: the dumper's (``who``: this process, or its
    children for a reference tool) and mariadbd's."""
    assert server.process is not None
    mine, theirs = _own_cpu(who), process_cpu(server.process.pid)
    result = run()
    return result, _own_cpu(who) - mine, process_cpu(server.process.pid) - theirs


def compare(server: EmbeddedMariaDB, data_dir: str, table: TableName, rows: int, runs: int,
            readers: int) -> DumpInfo:
    """One table: both references and both of ours, best of ``runs`` each, printed; with
    the CPU-seconds per dump of the parallel ones (median; the wall clock of a shared
    machine is noisy, the CPU they cost much less)."""
    reference = min(mariadb_dump_seconds(server, table) for _ in range(runs))
    to_file = min(mariadb_dump_seconds(server, table, to_file=True) for _ in range(runs))
    parallel_runs = [with_cpu(server, resource.RUSAGE_CHILDREN, lambda: mydumper_seconds(
        server, table, readers, rows)) for _ in range(runs)]
    parallel = min(s for s, _, _ in parallel_runs)
    single = min(our_dump(server, data_dir, table, 0, rows)[0] for _ in range(runs))
    chunked_cpu = [with_cpu(server, resource.RUSAGE_SELF, lambda: our_dump(
        server, data_dir, table, readers, rows)) for _ in range(runs)]
    chunked_runs = [run for run, _, _ in chunked_cpu]
    chunked = min(s for s, _ in chunked_runs)
    line(f"table {table}", f"{rows:,} rows, dump file {chunked_runs[-1][1].size / 1e6:.1f} MB")
    line("mariadb-dump --single-transaction (reference)", f"{rows / reference:,.0f} rows/s")
    line("  the same to a file, fsynced", f"{rows / to_file:,.0f} rows/s")
    line(f"mydumper -t {readers} --rows (parallel reference)", f"{rows / parallel:,.0f} rows/s")
    line("cdcserver dump, one snapshot (readers = 0)", f"{rows / single:,.0f} rows/s")
    line(f"cdcserver dump, chunked (readers = {readers})", f"{rows / chunked:,.0f} rows/s")
    line("  chunked / mariadb-dump (target >= 1.0)", f"{reference / chunked:.2f}")
    line("  chunked / mariadb-dump to a file, fsynced", f"{to_file / chunked:.2f}")
    line(f"  chunked / mydumper -t {readers} (target >= 1.0)", f"{parallel / chunked:.2f}")
    line("  one snapshot / mariadb-dump", f"{reference / single:.2f}")
    for name, measured in ((f"mydumper -t {readers}", parallel_runs),
                           (f"chunked (readers = {readers})", chunked_cpu)):
        line(f"  CPU-s per dump, {name}",
             f"{statistics.median(c for _, c, _ in measured):.3f} dumper, "
             f"{statistics.median(m for _, _, m in measured):.3f} mariadbd")
    return chunked_runs[-1][1]


async def transfer_seconds(data_dir: str, dump: DumpInfo) -> float:
    users = os.path.join(OUT, "cdcusers")
    UsersFile(users).add("bench", "bench")
    catalog = Catalog(os.path.join(data_dir, "avro"))
    users_file = UsersFile(users)
    users_file.load()
    server = CdcServer(SessionContext(catalog, users_file, lambda: None, data_dir))
    _, port = await server.start("127.0.0.1", 0)
    try:
        return await asyncio.to_thread(_receive, port, dump)
    finally:
        await server.stop()


def _receive(port: int, dump: DumpInfo) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    reader = sock.makefile("rb")
    sock.sendall(auth_message("bench", "bench"))
    assert reader.readline() == b"OK\n"
    sock.sendall(b"REGISTER UUID=bench, TYPE=JSON")
    assert reader.readline() == b"OK\n"
    start = time.perf_counter()
    sock.sendall(f"REQUEST-DUMP {dump.name}\n".encode())
    size = int(reader.readline().split()[1])
    received = 0
    while received < size:
        data = reader.read1(1 << 20)
        assert data
        received += len(data)
    seconds = time.perf_counter() - start
    assert received == size == dump.size
    sock.close()
    return seconds


def decode_seconds(dump: DumpInfo) -> float:
    decoder = DumpDecoder()
    rows = 0
    start = time.perf_counter()
    with open(dump.path, "rb") as f:
        while data := f.read(1 << 20):
            for item in decoder.feed(data):
                if isinstance(item, DumpRows):
                    rows += len(item.rows)
    decoder.finish()
    seconds = time.perf_counter() - start
    assert rows == INSERTS
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--big", type=int, default=0, metavar="ROWS",
                        help="also a table of this many rows (e.g. 10000000)")
    args = parser.parse_args()
    require_tools("bench_dump.py", **{"mariadb-dump": "mariadb-client", "mydumper": "mydumper"})
    line("row path measured", row_path())
    if os.environ.get("CDC_PURE_PYTHON") is None:
        from cdcserver.dump import rawrows

        if rawrows.compiled is None:
            sys.exit("the compiled row path is not built here (pip install -e .); set "
                     "CDC_PURE_PYTHON=1 to measure the pure-Python path on purpose")
    data_dir = os.path.join(OUT, "dump-data")
    with workload_server() as server, service_replicating(server, data_dir):
        dump = compare(server, data_dir, TABLE, INSERTS, args.runs, args.readers)
        sent = min(asyncio.run(transfer_seconds(data_dir, dump)) for _ in range(args.runs))
        decoded = min(decode_seconds(dump) for _ in range(args.runs))
        line("REQUEST-DUMP transfer to a client (sendfile)",
             f"{dump.size / sent / 1e6:,.0f} MB/s ({INSERTS / sent:,.0f} rows/s)")
        line("client DumpDecoder (bytes -> typed rows)", f"{INSERTS / decoded:,.0f} rows/s")
        if args.big:
            table = big_table(server, args.big)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            compare(server, data_dir, table, args.big, 1, args.readers)
            line("  peak RSS of the dumping process",
                 f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB "
                 f"(before the big table: {before:,.0f} MB)")


if __name__ == "__main__":
    main()
