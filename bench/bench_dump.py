"""Dump rows/s beside ``mariadb-dump --single-transaction``, on the same 200,000-row table.

    .venv/bin/python bench/bench_dump.py [--runs N]

Prints, for ``bench.orders`` of the standard workload (bench/common.py), best of N runs each:
- mariadb-dump --single-transaction rows/s (the C reference; SQL text to /dev/null);
- ``cdcserver dump`` rows/s (snapshot, chunked read, base64 rows, fsynced file renamed into
  place) and its ratio to the reference;
- serving that dump to a client (REQUEST-DUMP: sendfile to a socket that discards it), MB/s;
- the client library decoding it back to typed rows (DumpDecoder), rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import INSERTS, OUT, line, workload_server
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import SourceAddress
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.dump.files import DumpInfo
from cdcserver.protocol.server import CdcServer
from cdcserver.protocol.session import SessionContext
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.naming import TableName
from client.format.dump import DumpDecoder, DumpRows
from client.format.wire import auth_message

TABLE = TableName("bench", "orders")


def mariadb_dump_seconds(server: EmbeddedMariaDB) -> float:
    cmd = ["mariadb-dump", "--no-defaults", "-h127.0.0.1", f"-P{server.port}", "-uroot",
           "--single-transaction", "bench", "orders"]
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def our_dump(server: EmbeddedMariaDB, data_dir: str) -> tuple[float, DumpInfo]:
    shutil.rmtree(data_dir, ignore_errors=True)
    address = SourceAddress(host="127.0.0.1", port=server.port, user="root", password="")
    start = time.perf_counter()
    (result,) = dump_tables(address, data_dir, [TABLE], DumpOptions())
    seconds = time.perf_counter() - start
    assert result.info.header.rows == INSERTS, result.info.header.rows
    return seconds, result.info


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
    args = parser.parse_args()
    data_dir = os.path.join(OUT, "dump-data")
    with workload_server() as server:
        reference = min(mariadb_dump_seconds(server) for _ in range(args.runs))
        ours_runs = [our_dump(server, data_dir) for _ in range(args.runs)]
        ours = min(s for s, _ in ours_runs)
        dump = ours_runs[-1][1]
        sent = min(asyncio.run(transfer_seconds(data_dir, dump)) for _ in range(args.runs))
        decoded = min(decode_seconds(dump) for _ in range(args.runs))
    line("table", f"bench.orders, {INSERTS:,} rows, dump file {dump.size / 1e6:.1f} MB")
    line("mariadb-dump --single-transaction (reference)", f"{INSERTS / reference:,.0f} rows/s")
    line("cdcserver dump (snapshot -> durable dump file)", f"{INSERTS / ours:,.0f} rows/s")
    line("  ratio to mariadb-dump (target >= 0.25)", f"{reference / ours:.2f}")
    line("REQUEST-DUMP transfer to a client (sendfile)",
         f"{dump.size / sent / 1e6:,.0f} MB/s ({INSERTS / sent:,.0f} rows/s)")
    line("client DumpDecoder (bytes -> typed rows)", f"{INSERTS / decoded:,.0f} rows/s")


if __name__ == "__main__":
    main()
