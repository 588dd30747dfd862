"""The client library's public API as a Python consumer sees it, beside the raw socket's rate.

    .venv/bin/python bench/bench_library.py [--runs N] [--scale S] [--python]

A private MariaDB under bench/out/library-mariadb holds the standard workload (bench/common.py:
``bench.orders``, 200,000 inserts and 50,000 updates, 300,000 records; ``--scale S``: S times
that). The service runs as its own process (``cdcserver run``, listener on 127.0.0.1 port 0,
bench_listener.py's ``ServiceProcess``), replicates the whole binlog, and is asked for a dump of
the table through the library (``START-DUMP``, then ``LIST-DUMPS`` until it is listed). The
consumers run in this process (and, with ``--python``, in a child process); every figure is
the median of N runs (default 3), each run measuring every line once, in turn, against the same
service and table (the raw AVRO transfer, about 30 ms, is the median of 5 transfers a run).

Before the runs, an untimed pass (also the warm-up) checks what the library delivers:
``SyncCdcClient.stream`` in AVRO and in JSON mode, read until the stream falls idle for 2 s, give
exactly 300,000 records (200,000 inserts, 50,000 update_before and 50,000 update_after; schema
events not counted); a sample of records (every 9,973rd and the last) have the expected Python
types (``int`` id and big, ``str`` name and body, ``Decimal`` amount, ``datetime`` created,
``float`` score) and are equal in both modes; the async client's records at the same places
are the same; the dump has exactly 200,000 insert rows, typed the same, and a row not updated
since equals the stream's insert of it. With ``--python`` the child checks the same and its
samples must equal this process's (the pure-Python decoders give the same values as C).

What it prints, each line a median:
- `service code path`: the service's compiled extensions (bench/common.py ``code_path``); the
  bench refuses a service on the Python path unless ``CDC_PURE_PYTHON=1`` asks for it;
- `client library`: where ``mariadb_cdc_client`` was imported from, and `client decoders`:
  ``mariadb_cdc_client.stream.DECODING`` (records, AVRO and JSON modes) and
  ``mariadb_cdc_client.format.dump.DECODING`` (dump lines), ``C`` or ``Python``; the bench
  measures either (a Python path is printed, not refused);
- `workload`: records in the stream, the ``.avro`` version file's size, the dump's rows and size;
- `correctness`: what the untimed pass checked (a failure stops the bench);
- `login (connect, log in, REGISTER)`: ``SyncCdcClient.connect()``, ms; included in the
  library's stream figures below (they are timed from the call), not in the raw ones;
- `raw JSON mode (ceiling), lines/s`: ``REQUEST-DATA bench.orders`` in ``TYPE=JSON`` (the exact
  dialect, as the library registers), a ``recv_into`` loop into a 1 MiB buffer counting
  newlines from the request until the schema line and every record line have arrived;
- `raw AVRO mode (ceiling), MB/s (records/s)`: ``TYPE=AVRO``, from the request until the
  client holds the ``.avro`` file's size (with several version files: until the stream is
  idle for 1 s, that second not counted), and the records/s that makes;
- `raw dump transfer (ceiling), MB/s (rows/s)`: ``REQUEST-DUMP bench.orders`` from the request
  until the ``OK <size>`` reply and ``size`` bytes have arrived, discarded;
- `SyncCdcClient.stream, AVRO mode` / `JSON mode` / `CdcClient.stream (async), AVRO mode`,
  records/s: ``stream("bench.orders")`` from the call (connect, log in, register, request)
  until a consumer loop (``if isinstance(event, ChangeRecord): n += 1; last = event.values``)
  has had the 300,000th record, then it breaks out (the async client on asyncio's default
  loop);
- `SyncCdcClient.dump(follow=False), rows/s`: from the call until the iterator ends (the
  checksum checked), a loop touching each row of each ``DumpRows``;
- `DumpDecoder over the dump in memory, rows/s`: the same dump's bytes, fetched before and held
  in 1 MiB pieces, fed to a ``DumpDecoder`` with the same loop, then ``finish()``;
- with ``--python``, each library line also shows the same measurement in a child process with
  ``CDC_PURE_PYTHON=1`` (the library's pure-Python decoders; the service is unchanged), and
  how many times faster the compiled path is;
- `AVRO mode: library records/s / 1,000,000 (target >= 1)`, `JSON mode: library / raw JSON
  line rate (target >= 0.5)`, `dump: library rows/s / 1,000,000 (target >= 1)` (and the same
  for DumpDecoder alone), `AVRO mode: library / raw AVRO records/s`: the ratios, from the
  medians above (with ``--python``: the Python path's in brackets);
- `each run`: every run's figures, in the order above, runs separated by ``;``;
- `service log`: the warnings and errors the service logged (bench/out/listener-library.log).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import datetime as dt
import json
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Generator, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_listener import (
    MIB,
    PASSWORD,
    USER,
    USERS,
    ServiceProcess,
    gtid_pos,
    open_session,
    receive,
    report_problems,
)
from bench.common import INSERTS, OUT, RECORDS, UPDATES, code_path, line, load_workload
from bench.common import refuse_python_path as refuse_service_python_path
from cdcserver.app.embedded import EmbeddedMariaDB, kill_leftovers
from cdcserver.core.gtid import GtidState
from cdcserver.core.lifetime import die_with_parent
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client import CdcClient, ChangeRecord, Event, Format, SyncCdcClient
from mariadb_cdc_client.format.dump import DumpDecoder, DumpHeader, DumpRows
from mariadb_cdc_client.format.wire import DumpRequest

HOST, TABLE = "127.0.0.1", "bench.orders"
SAMPLE = 9_973  # every this many records, one is kept for the checks
AVRO_TRANSFERS = 5  # a run's raw AVRO figure: the median of this many transfers
TARGET = 1_000_000  # the target, typed records (or rows) per second
IDLE = 60.0  # the timed streams' idle_timeout: a safety, never reached in a good run
CHILD_MARK = "LIBRARY-FIGURES "
EXPECTED_TYPES = {"id": int, "big": int, "name": str, "amount": Decimal,
                  "created": dt.datetime, "body": str, "score": float}
LIBRARY = ("avro", "async", "json", "dump", "decoder")  # the library's figures, in order


def client_paths() -> tuple[str, str, str]:
    """(stream decoding, dump decoding, where mariadb_cdc_client was imported from)."""
    import mariadb_cdc_client
    import mariadb_cdc_client.format.dump
    import mariadb_cdc_client.stream

    return (getattr(mariadb_cdc_client.stream, "DECODING", "Python"),
            getattr(mariadb_cdc_client.format.dump, "DECODING", "Python"),
            os.path.dirname(os.path.abspath(mariadb_cdc_client.__file__)))


def sync_client(port: int, fmt: Format = Format.JSON) -> SyncCdcClient:
    return SyncCdcClient(HOST, port, USER, PASSWORD, format=fmt, max_retries=0)


# -- the untimed pass: what the library delivers ------------------------------------------

@dataclass
class Seen:
    """What a checked stream delivered: event types counted, the sampled records
    (index -> (event_type, gtid, event_number, values)) and the inserts among them by id."""

    types: collections.Counter[str] = field(default_factory=collections.Counter)
    schemas: int = 0
    samples: dict[int, tuple[str, str, int, dict[str, Any]]] = field(default_factory=dict)

    def record(self, index: int, event: ChangeRecord, total: int) -> None:
        self.types[event.event_type] += 1
        if index % SAMPLE == 0 or index == total - 1:
            check_types(event.values, f"record {index:,}")
            self.samples[index] = (event.event_type, event.gtid, event.event_number,
                                   event.values)

    def inserts_by_id(self) -> dict[int, dict[str, Any]]:
        return {values["id"]: values for kind, _, _, values in self.samples.values()
                if kind == "insert"}


def check_types(values: dict[str, Any], where: str) -> None:
    wrong = {name: type(values.get(name)).__name__ for name, kind in EXPECTED_TYPES.items()
             if type(values.get(name)) is not kind}
    if wrong:
        raise RuntimeError(f"{where}: unexpected types {wrong} in {values}")


def check_sync_stream(port: int, fmt: Format, scale: int) -> Seen:
    """The whole stream until it is idle for 2 s: exactly the workload's records."""
    total, seen = scale * RECORDS, Seen()
    index = 0
    for event in sync_client(port, fmt).stream(TABLE, idle_timeout=2.0):
        if isinstance(event, ChangeRecord):
            seen.record(index, event, total)
            index += 1
        else:
            seen.schemas += 1
    expected = {"insert": scale * INSERTS, "update_before": scale * UPDATES,
                "update_after": scale * UPDATES}
    if index != total or dict(seen.types) != expected or seen.schemas != 1:
        raise RuntimeError(f"{fmt.value} mode: {index:,} records {dict(seen.types)}, "
                           f"{seen.schemas} schemas; expected {total:,} {expected}, 1 schema")
    return seen


def check_async_stream(port: int, scale: int) -> Seen:
    total, seen = scale * RECORDS, Seen()

    async def read() -> None:
        index = 0
        client = CdcClient(HOST, port, USER, PASSWORD, format=Format.AVRO, max_retries=0)
        stream = cast(AsyncGenerator[Event, None], client.stream(TABLE))
        async with asyncio.timeout(600), contextlib.aclosing(stream) as events:
            async for event in events:
                if isinstance(event, ChangeRecord):
                    seen.record(index, event, total)
                    index += 1
                    if index == total:
                        break

    asyncio.run(read())
    return seen


def check_dump(port: int, scale: int, inserts: dict[int, dict[str, Any]]) -> int:
    """The dump: exactly the inserted rows, typed; rows not updated since equal the stream's
    inserts of them. Returns how many rows were compared with the stream."""
    rows = compared = 0
    header: DumpHeader | None = None
    updated = scale * UPDATES  # ids 1..updated were updated after their insert
    for item in sync_client(port).dump(TABLE, follow=False):
        if isinstance(item, DumpHeader):
            header = item
            continue
        if not isinstance(item, DumpRows) or item.action != "insert":
            raise RuntimeError(f"the dump holds {item!r:.200}")
        for row in item.rows:
            if rows % SAMPLE == 0:
                check_types(row, f"dump row {rows:,}")
            expected = inserts.get(row["id"])
            if expected is not None and row["id"] > updated:
                if row != expected:
                    raise RuntimeError(f"dump row {row} differs from the stream's {expected}")
                compared += 1
            rows += 1
    if header is None or rows != scale * INSERTS or header.rows != rows:
        raise RuntimeError(f"the dump gave {rows:,} rows (header: "
                           f"{header.rows if header else None}), expected {scale * INSERTS:,}")
    return compared


@dataclass(frozen=True)
class Checked:
    summary: str
    samples: dict[int, tuple[str, str, int, dict[str, Any]]]


def check_library(port: int, scale: int) -> Checked:
    avro = check_sync_stream(port, Format.AVRO, scale)
    json_mode = check_sync_stream(port, Format.JSON, scale)
    if avro.samples != json_mode.samples:
        differ = [i for i in avro.samples if avro.samples[i] != json_mode.samples.get(i)]
        raise RuntimeError(f"AVRO and JSON modes differ at records {differ[:5]}: "
                           f"{avro.samples[differ[0]]} / {json_mode.samples.get(differ[0])}")
    asynchronous = check_async_stream(port, scale)
    if asynchronous.samples != avro.samples:
        raise RuntimeError("the async client's records differ from the blocking client's")
    compared = check_dump(port, scale, avro.inserts_by_id())
    total = scale * RECORDS
    summary = (f"{total:,} records in AVRO and JSON modes, then idle ({scale * INSERTS:,} "
               f"inserts, {scale * UPDATES:,} update pairs), async AVRO the same; "
               f"{len(avro.samples)} samples typed, equal across modes; dump "
               f"{scale * INSERTS:,} rows, typed, {compared} equal to the stream's inserts")
    return Checked(summary, avro.samples)


# -- the library, timed -------------------------------------------------------------------

def sync_stream_rate(port: int, fmt: Format, total: int) -> float:
    """Records/s from ``stream()`` to the ``total``-th ChangeRecord in a consumer loop."""
    n = 0
    last: dict[str, Any] | None = None
    start = time.perf_counter()
    events = cast(Generator[Event, None, None],  # a generator: closed once left
                  sync_client(port, fmt).stream(TABLE, idle_timeout=IDLE))
    for event in events:
        if isinstance(event, ChangeRecord):
            n += 1
            last = event.values
            if n == total:
                break
    seconds = time.perf_counter() - start
    events.close()
    if n != total or last is None:
        raise RuntimeError(f"{fmt.value} mode: {n:,} records of {total:,}")
    return total / seconds


def async_stream_rate(port: int, total: int) -> float:
    async def read() -> float:
        n = 0
        last: dict[str, Any] | None = None
        async with asyncio.timeout(600):
            start = time.perf_counter()
            client = CdcClient(HOST, port, USER, PASSWORD, format=Format.AVRO, max_retries=0)
            events = cast(AsyncGenerator[Event, None], client.stream(TABLE))
            async for event in events:
                if isinstance(event, ChangeRecord):
                    n += 1
                    last = event.values
                    if n == total:
                        break
            seconds = time.perf_counter() - start
            await events.aclose()
        if n != total or last is None:
            raise RuntimeError(f"async AVRO mode: {n:,} records of {total:,}")
        return total / seconds

    return asyncio.run(read())


def sync_dump_rate(port: int, rows: int) -> float:
    """Rows/s from ``dump()`` until its iterator ends, a loop touching each row."""
    n = 0
    last: dict[str, Any] | None = None
    start = time.perf_counter()
    for item in sync_client(port).dump(TABLE, follow=False):
        if isinstance(item, DumpRows):
            for row in item.rows:
                n += 1
                last = row
    seconds = time.perf_counter() - start
    if n != rows or last is None:
        raise RuntimeError(f"the dump gave {n:,} rows of {rows:,}")
    return rows / seconds


def fetch_dump_bytes(port: int) -> list[bytes]:
    """The newest dump of the table, as the library reads it off the socket (untimed), in
    1 MiB pieces."""
    conn = sync_client(port).connect()
    try:
        size, _ = conn.request_dump(DumpRequest.of(TABLE))
        data = b"".join(conn.read_dump(size))
    finally:
        conn.close()
    return [data[i:i + MIB] for i in range(0, len(data), MIB)]


def decoder_rate(pieces: list[bytes], rows: int) -> float:
    n = 0
    last: dict[str, Any] | None = None
    start = time.perf_counter()
    decoder = DumpDecoder()
    for piece in pieces:
        for item in decoder.feed(piece):
            if isinstance(item, DumpRows):
                for row in item.rows:
                    n += 1
                    last = row
    decoder.finish()
    seconds = time.perf_counter() - start
    if n != rows or last is None:
        raise RuntimeError(f"DumpDecoder gave {n:,} rows of {rows:,}")
    return rows / seconds


def login_ms(port: int, times: int = 5) -> float:
    client = sync_client(port, Format.AVRO)
    spans = []
    for _ in range(times):
        start = time.perf_counter()
        conn = client.connect()
        spans.append(time.perf_counter() - start)
        conn.close()
    return 1000 * statistics.median(spans)


def library_run(port: int, scale: int, pieces: list[bytes]) -> dict[str, float]:
    """One run of every library figure, in LIBRARY's order."""
    total, rows = scale * RECORDS, scale * INSERTS
    return {"avro": sync_stream_rate(port, Format.AVRO, total),
            "async": async_stream_rate(port, total),
            "json": sync_stream_rate(port, Format.JSON, total),
            "dump": sync_dump_rate(port, rows),
            "decoder": decoder_rate(pieces, rows)}


# -- the raw socket: the ceilings ---------------------------------------------------------

def raw_json_rate(port: int, total: int) -> float:
    """Lines/s from the request until the schema line and ``total`` record lines arrived."""
    with open_session(port, "JSON", "EXACT") as sock:
        start = time.perf_counter()
        sock.sendall(f"REQUEST-DATA {TABLE}".encode())
        received = receive(sock, lines=total + 1)
    if received.newlines != total + 1:
        raise RuntimeError(f"raw JSON mode: {received.newlines:,} lines, expected {total + 1:,}")
    return total / (received.last - start)


def raw_avro_rate(port: int, size: int | None) -> tuple[float, int]:
    """(bytes/s, bytes) of the AVRO stream from the request until ``size`` bytes (None: until
    it is idle for 1 s, that second not counted)."""
    with open_session(port, "AVRO") as sock:
        start = time.perf_counter()
        sock.sendall(f"REQUEST-DATA {TABLE}".encode())
        if size is not None:
            received = receive(sock, size=size)
            if received.bytes != size:
                raise RuntimeError(f"AVRO mode sent {received.bytes} bytes, the file has {size}")
            return size / (received.last - start), size
        buf, got, last = bytearray(MIB), 0, start
        sock.settimeout(1.0)
        with contextlib.suppress(TimeoutError):
            while n := sock.recv_into(buf):
                got += n
                last = time.perf_counter()
        return got / (last - start), got


def raw_dump_rate(port: int) -> tuple[float, int]:
    """(bytes/s, bytes) of REQUEST-DUMP from the request until the reply line and the whole
    dump arrived."""
    buf = bytearray(MIB)
    view = memoryview(buf)
    with open_session(port, "JSON", "EXACT") as sock:
        start = time.perf_counter()
        sock.sendall(f"REQUEST-DUMP {TABLE}".encode())
        got = 0
        while (newline := buf.find(b"\n", 0, got)) < 0:
            n = sock.recv_into(view[got:])
            if not n:
                raise RuntimeError(f"REQUEST-DUMP: the connection closed after {buf[:got]!r}")
            got += n
        ok, size_text, _ = bytes(buf[:newline]).split(b" ", 2)
        if ok != b"OK":
            raise RuntimeError(f"REQUEST-DUMP: {bytes(buf[:newline])!r}")
        size, received = int(size_text), got - newline - 1
        while received < size:
            n = sock.recv_into(buf)
            if not n:
                raise RuntimeError(f"the dump ended after {received} of {size} bytes")
            received += n
        seconds = time.perf_counter() - start
    if received != size:
        raise RuntimeError(f"REQUEST-DUMP sent {received} bytes past a {size}-byte dump")
    return size / seconds, size


def raw_run(port: int, scale: int, avro_size: int | None) -> dict[str, float]:
    total = scale * RECORDS
    avro = statistics.median(raw_avro_rate(port, avro_size)[0] for _ in range(AVRO_TRANSFERS))
    return {"raw_json": raw_json_rate(port, total), "raw_avro": avro,
            "raw_dump": raw_dump_rate(port)[0]}


# -- the set-up ---------------------------------------------------------------------------

@contextlib.contextmanager
def private_server(scale: int) -> Iterator[EmbeddedMariaDB]:
    base = os.path.join(OUT, "library-mariadb")
    kill_leftovers(os.path.join(base, "data"))
    shutil.rmtree(base, ignore_errors=True)
    server = EmbeddedMariaDB(base, port=0, die_with_parent=True)
    server.start()
    try:
        load_workload(server, scale)
        yield server
    finally:
        server.stop()


def avro_file_size(service: ServiceProcess) -> tuple[int | None, str]:
    """The table's version file's size (None: several files), and a description."""
    avro = os.path.join(service.data_dir, "avro")
    files = sorted(f for f in os.listdir(avro)
                   if f.startswith(f"{TABLE}.") and f.endswith(".avro"))
    sizes = [os.path.getsize(os.path.join(avro, f)) for f in files]
    if len(files) == 1:
        return sizes[0], f"{files[0]} {sizes[0] / 1e6:.1f} MB"
    return None, f"{len(files)} AVRO files, {sum(sizes) / 1e6:.1f} MB"


def take_dump(port: int, timeout: float = 600) -> dict[str, Any]:
    """START-DUMP of the table through the library; its listing once complete."""
    conn = sync_client(port).connect()
    try:
        conn.start_dumps(TABLE)
        deadline = time.monotonic() + timeout
        while not (dumps := conn.list_dumps(TABLE)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no dump of {TABLE} after {timeout:.0f} s: "
                                   f"{conn.taking(None)}")
            time.sleep(0.2)
        return dumps[-1]
    finally:
        conn.close()


# -- the Python path, in a child process --------------------------------------------------

def child_main(port: int, runs: int, scale: int) -> int:
    """--child-port: the library's figures on this process's path, as one JSON line."""
    stream_path, dump_path, where = client_paths()
    checked = check_library(port, scale)
    pieces = fetch_dump_bytes(port)
    figures = [library_run(port, scale, pieces) for _ in range(runs)]
    print(CHILD_MARK + json.dumps({
        "stream": stream_path, "dump": dump_path, "where": where, "login": login_ms(port),
        "runs": figures,
        "samples": base64.b64encode(pickle.dumps(checked.samples)).decode("ascii")}),
        flush=True)
    return 0


def python_path_figures(port: int, runs: int, scale: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child-port", str(port),
         "--runs", str(runs), "--scale", str(scale)],
        env={**os.environ, "CDC_PURE_PYTHON": "1"}, stdout=subprocess.PIPE,
        preexec_fn=die_with_parent)
    if out.returncode:
        ended = f"signal {signal.Signals(-out.returncode).name}" if out.returncode < 0 \
            else f"status {out.returncode}"
        raise RuntimeError(f"the Python path's child process ended with {ended}")
    for text in reversed(out.stdout.decode().splitlines()):
        if text.startswith(CHILD_MARK):
            result: dict[str, Any] = json.loads(text[len(CHILD_MARK):])
            result["samples"] = pickle.loads(base64.b64decode(result["samples"]))
            return result
    raise RuntimeError(f"the Python path's child printed no figures: {out.stdout[-500:]!r}")


# -- main ---------------------------------------------------------------------------------

def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians shown)")
    parser.add_argument("--scale", type=int, default=1, help="times the standard workload")
    parser.add_argument("--python", action="store_true",
                        help="also the library's pure-Python path (CDC_PURE_PYTHON=1), "
                             "in a child process")
    parser.add_argument("--child-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_port:
        return child_main(args.child_port, args.runs, args.scale)

    service_path = code_path()
    line("service code path", service_path)
    refuse_service_python_path(service_path.startswith("pure"),
                               "the service's compiled extensions are")
    stream_path, dump_path, where = client_paths()
    line("client library", f"mariadb_cdc_client from {where}")
    line("client decoders: stream (AVRO and JSON modes) / dump",
         f"{stream_path} / {dump_path}" + (
             "" if (stream_path, dump_path) == ("C", "C") else
             "  (Python path: not built here, or CDC_PURE_PYTHON set)"))
    os.makedirs(OUT, exist_ok=True)
    UsersFile(USERS).add(USER, PASSWORD)
    total, rows = args.scale * RECORDS, args.scale * INSERTS
    with private_server(args.scale) as server, \
            ServiceProcess(server, "library", 9500) as service:
        service.wait_covers(GtidState.parse(gtid_pos(server)))
        avro_size, avro_files = avro_file_size(service)
        dump = take_dump(service.port)
        line(f"workload: {TABLE}", f"{total:,} records, {avro_files}; dump {rows:,} rows "
                                   f"{int(dump['bytes']) / 1e6:.1f} MB")
        checked = check_library(service.port, args.scale)
        line("correctness (untimed pass before the runs)", checked.summary)
        pieces = fetch_dump_bytes(service.port)
        raw_avro_rate(service.port, avro_size)  # warm-up of the raw paths
        raw_dump_rate(service.port)
        runs = []
        for _ in range(args.runs):
            runs.append({**raw_run(service.port, args.scale, avro_size),
                         **library_run(service.port, args.scale, pieces)})
        login = login_ms(service.port)
        python = python_path_figures(service.port, args.runs, args.scale) \
            if args.python else None
        if python is not None:
            if python["samples"] != checked.samples:
                raise RuntimeError("the pure-Python decoders' records differ from this path's")
            line("--python: a child process with CDC_PURE_PYTHON=1",
                 f"decoders {python['stream']} / {python['dump']}, mariadb_cdc_client from "
                 f"{python['where']}; {len(checked.samples)} samples equal to this path's")
        report(args.scale, runs, python, login, avro_size, int(dump["bytes"]))
    report_problems(service)  # once it has stopped
    return 0


def report(scale: int, runs: list[dict[str, float]], python: dict[str, Any] | None,
           login: float, avro_size: int | None, dump_size: int) -> None:
    total, rows = scale * RECORDS, scale * INSERTS
    py_runs: list[dict[str, float]] = python["runs"] if python is not None else []

    def beside(key: str, of: float = 0.0) -> str:
        """The Python path's median of ``key`` (``of``: as a ratio to it), in brackets."""
        if python is None:
            return ""
        slow = median_of(py_runs, key)
        if of:
            return f"   (Python path {slow / of:.2f})"
        return f"   (Python path {slow:,.0f}: compiled {median_of(runs, key) / slow:.1f}x)"

    raw_json, raw_avro, raw_dump = (median_of(runs, k) for k in ("raw_json", "raw_avro",
                                                                "raw_dump"))
    line("login (connect, log in, REGISTER), ms",
         f"{login:.1f}" + (f"   (Python path {python['login']:.1f})" if python else ""))
    line("raw JSON mode (ceiling), lines/s", f"{raw_json:,.0f}")
    raw_avro_records = raw_avro * total / avro_size if avro_size is not None else 0.0
    if avro_size is not None:
        line("raw AVRO mode (ceiling), MB/s (records/s)",
             f"{raw_avro / 1e6:,.0f} ({raw_avro_records:,.0f})")
    else:
        line("raw AVRO mode (ceiling, until idle), MB/s", f"{raw_avro / 1e6:,.0f}")
    line("raw dump transfer (ceiling), MB/s (rows/s)",
         f"{raw_dump / 1e6:,.0f} ({rows * raw_dump / dump_size:,.0f})")
    labels = {"avro": "SyncCdcClient.stream, AVRO mode, records/s",
              "async": "CdcClient.stream (async), AVRO mode, records/s",
              "json": "SyncCdcClient.stream, JSON mode, records/s",
              "dump": "SyncCdcClient.dump(follow=False), rows/s",
              "decoder": "DumpDecoder over the dump in memory, rows/s"}
    for key in LIBRARY:
        line(labels[key], f"{median_of(runs, key):,.0f}{beside(key)}")
    line(f"AVRO mode: library records/s / {TARGET:,} (target >= 1)",
         f"{median_of(runs, 'avro') / TARGET:.2f}{beside('avro', TARGET)}")
    line("JSON mode: library / raw JSON line rate (target >= 0.5)",
         f"{median_of(runs, 'json') / raw_json:.2f}{beside('json', raw_json)}")
    line(f"dump: library rows/s / {TARGET:,} (target >= 1)",
         f"{median_of(runs, 'dump') / TARGET:.2f}{beside('dump', TARGET)}")
    line(f"dump: DumpDecoder alone rows/s / {TARGET:,}",
         f"{median_of(runs, 'decoder') / TARGET:.2f}{beside('decoder', TARGET)}")
    if avro_size is not None:
        line("AVRO mode: library / raw AVRO records/s",
             f"{median_of(runs, 'avro') / raw_avro_records:.2f}"
             f"{beside('avro', raw_avro_records)}")
    line("each run: raw JSON lines/s, raw AVRO MB/s, raw dump MB/s",
         "; ".join(f"{r['raw_json']:,.0f} / {r['raw_avro'] / 1e6:,.0f} / "
                   f"{r['raw_dump'] / 1e6:,.0f}" for r in runs))
    line("each run: library AVRO / async / JSON / dump / DumpDecoder",
         "; ".join(" / ".join(f"{r[k]:,.0f}" for k in LIBRARY) for r in runs))
    if python is not None:
        line("  the Python path's runs, the same",
             "; ".join(" / ".join(f"{r[k]:,.0f}" for k in LIBRARY) for r in py_runs))


if __name__ == "__main__":
    sys.exit(main())
