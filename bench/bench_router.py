"""Binlog -> durable Avro, beside mariadb-binlog on the same binlog; then JSON to one client.

    .venv/bin/python bench/bench_router.py [--runs N]

Prints, for the standard workload (bench/common.py):
- mariadb-binlog -v rows/s (the C decoder, the reference);
- the service's binlog -> durable Avro rows/s: from service start until every transaction is
  in the Avro files and the checkpoint covering them is fsynced; and its ratio to the reference;
- the JSON rows/s one client receives (REQUEST-DATA from the first record to the last).

With ``--filter`` it measures what ``[capture] exclude`` costs instead: the same rows and
transactions spread over two tables, ``bench.orders`` and ``bench.other``, and in each run
the service over both, then with ``exclude = bench.other``: the rows/s of what is stored in
each case, and their ratio (issue 38 asks that the filtered rate be at least the unfiltered).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (
    OUT,
    RECORDS,
    ROW_CHANGES,
    announce_code_path,
    line,
    mariadb_binlog_rate,
    peak_rss_mb,
    raw_transfer_seconds,
    workload_server,
)
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.app.service import Service
from cdcserver.core.config import (
    CaptureConfig,
    Config,
    ListenerConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import auth_message


async def service_to_durable_avro(server: EmbeddedMariaDB, data_dir: str,
                                  records: int, exclude: str = "") -> tuple[float, int]:
    """Seconds from service start until the whole workload is durable; and the JSON rate of
    one client reading ``bench.orders``."""
    shutil.rmtree(data_dir, ignore_errors=True)
    users = os.path.join(OUT, "cdcusers")
    UsersFile(users).add("bench", "bench")
    config = Config(source=SourceConfig(url=server.url(), server_id=9100, start_gtid="oldest"),
                    store=StoreConfig(data_dir=data_dir),
                    listener=ListenerConfig(listen="127.0.0.1:0", users_file=users),
                    capture=CaptureConfig(exclude=exclude))
    target = GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
    service = Service(config)
    stop = asyncio.Event()
    start = time.perf_counter()
    task = asyncio.create_task(service.run(stop))
    await service.wait_caught_up(target)
    await service.store.flush()
    seconds = time.perf_counter() - start
    assert service.store.durable is not None and service.store.durable.gtid_state == target
    rate = await json_client_rate(service, records)
    stop.set()
    await task
    return seconds, rate


async def json_client_rate(service: Service, records: int) -> int:
    """Records/s one JSON client receives for the whole table (counting lines)."""
    assert service.address is not None
    reader, writer = await asyncio.open_connection(*service.address, limit=1 << 24)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    for command in (auth_message("bench", "bench"), b"REGISTER UUID=bench, TYPE=JSON"):
        writer.write(command)
        await writer.drain()
        assert await reader.readline() == b"OK\n"
    start = time.perf_counter()
    writer.write(b"REQUEST-DATA bench.orders")
    lines = 0
    while lines < records + 1:  # the schema line, then every record
        data = await reader.read(1 << 20)
        assert data, "the stream ended early"
        lines += data.count(b"\n")
    seconds = time.perf_counter() - start
    writer.close()
    return int(records / seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="repetitions (the median is shown)")
    parser.add_argument("--scale", type=int, default=1,
                        help="times the standard workload (4: 1,000,000 row changes)")
    parser.add_argument("--filter", action="store_true",
                        help="measure [capture] exclude over two tables instead")
    args = parser.parse_args()
    announce_code_path()
    changes, records = args.scale * ROW_CHANGES, args.scale * RECORDS
    if args.filter:
        return filtered(args.runs, args.scale, changes, records)
    with workload_server(args.scale) as server:
        binlog_mb = sum(int(r[1]) for r in server.query("SHOW BINARY LOGS")) / 1e6
        line("workload", f"{changes:,} row changes ({records:,} records), "
                         f"{binlog_mb:.0f} MB of binlog")
        references, raws, services, clients = [], [], [], []
        for run in range(args.runs):
            ref_seconds, ref_rows = mariadb_binlog_rate(server)
            assert ref_rows == changes, ref_rows
            raws.append(changes / raw_transfer_seconds(server))
            seconds, client_rate = asyncio.run(
                service_to_durable_avro(server, os.path.join(OUT, "data"), records))
            references.append(changes / ref_seconds)
            services.append(changes / seconds)
            clients.append(client_rate)
            line(f"run {run + 1}", f"mariadb-binlog {references[-1]:,.0f} rows/s, raw "
                                   f"{raws[-1]:,.0f}, service {services[-1]:,.0f} rows/s, "
                                   f"JSON client {clients[-1]:,.0f} rows/s")
        ref, svc = statistics.median(references), statistics.median(services)
        raw = statistics.median(raws)
        line("mariadb-binlog -v (C reference), rows/s", f"{ref:,.0f}")
        line("mariadb-binlog --raw (transport ceiling), rows/s",
             f"{raw:,.0f} ({raw * binlog_mb / changes:,.0f} MB/s)")
        line("binlog -> durable Avro, rows/s", f"{svc:,.0f}")
        line("ratio service / mariadb-binlog", f"{svc / ref:.3f}")
        line("fraction of the transport ceiling", f"{svc / raw:.3f}")
        line("JSON rows/s to one client", f"{statistics.median(clients):,.0f}")
        line("peak RSS of this process (service + client), MB", f"{peak_rss_mb():.0f}")
    return 0


def filtered(runs: int, scale: int, changes: int, records: int) -> int:
    """The rows/s stored with half the tables excluded, beside the rows/s without a filter."""
    with workload_server(scale, ("orders", "other")) as server:
        line("workload", f"{changes:,} row changes over bench.orders and bench.other, "
                         "alternate transactions")
        everything, half = [], []
        for run in range(runs):
            seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records // 2))
            everything.append(changes / seconds)
            seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records // 2, exclude="bench.other"))
            half.append(changes / 2 / seconds)
            line(f"run {run + 1}", f"no filter {everything[-1]:,.0f} rows/s stored, "
                                   f"bench.other excluded {half[-1]:,.0f} rows/s stored")
        every, kept = statistics.median(everything), statistics.median(half)
        line("no filter: rows/s stored (both tables)", f"{every:,.0f}")
        line("exclude = bench.other: rows/s stored (bench.orders)", f"{kept:,.0f}")
        line("ratio filtered / unfiltered (target >= 1)", f"{kept / every:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
