"""Clients that stop reading a table of big values (issue 49, finding 5): what they cost the
service, in JSON and in AVRO mode.

    .venv/bin/python bench/bench_bigvalues.py [--clients 100] [--mib 64] [--rows 2]

A private MariaDB under bench/out/bigvalues-mariadb (``max_allowed_packet`` 1 GiB) holds
``bench.big (id INT PRIMARY KEY, body LONGTEXT)`` with ``--rows`` rows of ``--mib`` MiB each,
one transaction per row. The service runs as its own process (``cdcserver run``) and
replicates them. Then, per mode, ``--clients`` connections each log in, send
``REQUEST-DATA bench.big`` and read nothing more (a receive buffer of 4 KiB); once the bytes
the service has sent stop growing for 2 s, the service's resident memory (VmRSS) is taken
and the clients hang up. Printed per mode: RSS before, with the stalled clients, and the
growth per client. A reading client first checks that a value arrives whole.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_listener import USERS, ServiceProcess
from bench.bench_repair import rss_mb
from bench.common import announce_code_path, fresh_server, line
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import auth_message

USER = "bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rows", type=int, default=2)
    args = parser.parse_args()
    announce_code_path()
    line("path measured", "cdcserver run (its own process), raw sockets that stop reading")
    with fresh_server("bigvalues-mariadb") as server:
        server.execute("SET GLOBAL max_allowed_packet = 1073741824")
        conn = server.connect()  # a new session: the new max_allowed_packet
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("CREATE TABLE bench.big (id INT PRIMARY KEY, body LONGTEXT)")
            for i in range(1, args.rows + 1):
                cur.execute(f"INSERT INTO bench.big VALUES ({i}, REPEAT('ab\"{{}}é', "
                            f"{args.mib * (1 << 20) // 8}))")
                conn.commit()
        conn.close()
        UsersFile(USERS).add(USER, USER)
        with ServiceProcess(server, "bigvalues", server_id=4343) as service:
            wait_stored(service, args.rows)
            check_one_reader(service.port, args.mib)
            for mode in ("JSON", "AVRO"):
                stalled(service, mode, args.clients)
    return 0


def sent_bytes(service: ServiceProcess) -> float:
    port = re.search(r"metrics and health on http://[\d.]+:(\d+)", service._log())
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port[1]}/metrics", timeout=10) as r:
        found = re.search(r"^cdc_sent_bytes_total (\S+)$", r.read().decode(), re.M)
    return float(found[1]) if found else 0.0


def wait_stored(service: ServiceProcess, rows: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        log = service._log()
        if "bench.big: version 1" in log:
            sock = connect(service.port, "JSON")
            sock.sendall(b"REQUEST-DATA bench.big\n")
            sock.settimeout(30)
            data = b""
            while data.count(b"\n") < rows + 1:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
            sock.close()
            if data.count(b"\n") >= rows + 1:
                return
        time.sleep(1)
    raise RuntimeError("the rows were not stored in 10 minutes")


def connect(port: int, mode: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(auth_message(USER, USER))
    assert sock.recv(64).startswith(b"OK")
    sock.sendall(f"REGISTER UUID=bench, TYPE={mode}\n".encode())
    assert sock.recv(64).startswith(b"OK")
    return sock


def check_one_reader(port: int, mib: int) -> None:
    sock = connect(port, "JSON")
    sock.sendall(b"REQUEST-DATA bench.big\n")
    reader = sock.makefile("rb")
    reader.readline()  # the schema
    record = json.loads(reader.readline())
    assert record["body"] == 'ab"{}é' * (mib * (1 << 20) // 8), "the value did not arrive whole"
    sock.close()
    line("one reading client", f"a {mib} MiB value arrived whole and exact")


def stalled(service: ServiceProcess, mode: str, clients: int) -> None:
    time.sleep(2)
    before = rss_mb(service.pid)
    socks = []
    for _ in range(clients):
        sock = connect(service.port, mode, rcvbuf=4096)
        sock.sendall(b"REQUEST-DATA bench.big\n")
        socks.append(sock)
    sent, still = sent_bytes(service), 0
    while still < 4:
        time.sleep(0.5)
        now = sent_bytes(service)
        still = still + 1 if now == sent else 0
        sent = now
    held = rss_mb(service.pid)
    for sock in socks:
        sock.close()
    line(f"{mode}: RSS before / with {clients} stalled clients",
         f"{before:.0f} MB / {held:.0f} MB ({(held - before) / clients * 1024:.0f} KiB per "
         "client)")


if __name__ == "__main__":
    sys.exit(main())
