"""Binlog -> durable Avro, beside mariadb-binlog on the same binlog; then JSON to one client.

    .venv/bin/python bench/bench_router.py [--runs N]

Prints, for the standard workload (bench/common.py):
- mariadb-binlog -v rows/s (the C decoder, the reference);
- the service's binlog -> durable Avro rows/s: from service start until every transaction is
  in the Avro files and the checkpoint covering them is fsynced; and its ratio to the reference;
- the JSON rows/s one client receives (REQUEST-DATA from the first record to the last).

With ``--filter`` it measures what ``[capture] exclude`` costs instead: the same rows and
transactions spread over two tables, ``bench.orders`` and ``bench.other``, and in each run
the service over both, then with ``exclude = bench.other``: bench.orders' rows/s in each
case (issue 38 asks that the filtered be at least the unfiltered), and the rows/s of all that
is stored, whose ratio says what an excluded row costs beside a stored one.

With ``--hash`` it measures what ``[capture] columns_hash`` costs: in each run the service
over the standard workload without rules, then with ``bench.orders.name`` hashed (a salted
SHA-256 of every row's VARCHAR), and the ratio of the two rates (issue 38: a hash costs under
10% of the router's rate, a ratio of at least 0.9).
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
from cdcserver.core.captureconfig import CaptureConfig
from cdcserver.core.config import (
    Config,
    ListenerConfig,
    MetricsConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import auth_message


async def service_to_durable_avro(server: EmbeddedMariaDB, data_dir: str,
                                  records: int, exclude: str = "", columns_hash: str = ""
                                  ) -> tuple[float, int]:
    """Seconds from service start until the whole workload is durable; and the JSON rate of
    one client reading ``bench.orders``."""
    shutil.rmtree(data_dir, ignore_errors=True)
    users = os.path.join(OUT, "cdcusers")
    UsersFile(users).add("bench", "bench")
    config = Config(source=SourceConfig(url=server.url(), server_id=9100, start_gtid="oldest"),
                    store=StoreConfig(data_dir=data_dir),
                    listener=ListenerConfig(listen="127.0.0.1:0", users_file=users),
                    metrics=MetricsConfig(listen="127.0.0.1:0"),
                    capture=CaptureConfig(exclude=exclude, columns_hash=columns_hash))
    target = GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
    service = Service(config)
    stop = asyncio.Event()
    start = time.perf_counter()
    task = asyncio.create_task(service.run(stop))
    await service.wait_caught_up(target)
    await service.data.store.flush()
    seconds = time.perf_counter() - start
    durable = service.data.store.durable
    assert durable is not None and durable.gtid_state == target
    rate = await json_client_rate(service, records)
    stop.set()
    await task
    return seconds, rate


async def json_client_rate(service: Service, records: int) -> int:
    """Records/s one JSON client receives for the whole table (counting lines)."""
    assert service.listener.address is not None
    reader, writer = await asyncio.open_connection(*service.listener.address, limit=1 << 24)
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
    parser.add_argument("--hash", action="store_true",
                        help="measure [capture] columns_hash of one column instead")
    args = parser.parse_args()
    announce_code_path()
    changes, records = args.scale * ROW_CHANGES, args.scale * RECORDS
    if args.filter:
        return filtered(args.runs, args.scale, changes, records)
    if args.hash:
        return hashed(args.runs, args.scale, changes, records)
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
    """The rows/s of bench.orders stored with bench.other excluded, beside its rows/s (and
    every row's) without a filter; and what an excluded row costs."""
    with workload_server(scale, ("orders", "other")) as server:
        line("workload", f"{changes:,} row changes over bench.orders and bench.other, "
                         "alternate transactions")
        everything, half = [], []
        for run in range(runs):
            every_seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records // 2))
            everything.append(every_seconds)
            seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records // 2, exclude="bench.other"))
            half.append(seconds)
            line(f"run {run + 1}", f"no filter {every_seconds:.2f} s, bench.other excluded "
                                   f"{seconds:.2f} s")
        every, kept = statistics.median(everything), statistics.median(half)
        line("no filter: rows/s stored (both tables)", f"{changes / every:,.0f}")
        line("no filter: rows/s of bench.orders", f"{changes / 2 / every:,.0f}")
        line("exclude = bench.other: rows/s of bench.orders", f"{changes / 2 / kept:,.0f}")
        line("ratio bench.orders filtered / unfiltered (target >= 1)", f"{every / kept:.3f}")
        line("ratio rows/s stored filtered / unfiltered (1: an excluded row costs nothing)",
             f"{every / (2 * kept):.3f}")
        line("an excluded row costs, of a stored row (service start included)",
             f"{(2 * kept - every) / every:.2f}")
    return 0


def hashed(runs: int, scale: int, changes: int, records: int) -> int:
    """The rows/s stored with one column hashed, beside the rows/s without rules."""
    os.environ["CDCSERVER_HASH_SALT"] = "bench-salt"
    with workload_server(scale) as server:
        line("workload", f"{changes:,} row changes; hashed: bench.orders.name (VARCHAR(64))")
        clear, hashes = [], []
        for run in range(runs):
            seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records))
            clear.append(changes / seconds)
            seconds, _ = asyncio.run(service_to_durable_avro(
                server, os.path.join(OUT, "data"), records, columns_hash="bench.orders.name"))
            hashes.append(changes / seconds)
            line(f"run {run + 1}", f"no rules {clear[-1]:,.0f} rows/s stored, name hashed "
                                   f"{hashes[-1]:,.0f} rows/s stored")
        plain, masked = statistics.median(clear), statistics.median(hashes)
        line("no rules: rows/s stored", f"{plain:,.0f}")
        line("columns_hash = bench.orders.name: rows/s stored", f"{masked:,.0f}")
        line("ratio hashed / clear (target >= 0.9: a hash costs under 10%)",
             f"{masked / plain:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
