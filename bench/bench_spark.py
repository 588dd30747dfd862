"""The Spark source's rows/s into a ``noop`` sink, beside a trivial Python data source that
yields the very same rows.

    .venv/bin/python bench/bench_spark.py [--runs N] [--partitions P] [--warmup W]

The standard workload (bench/common.py: 300,000 records of ``bench.orders``) is replicated
by the service, which then runs in a thread of this process with its listener on
127.0.0.1. Untimed, the source's own partition reader turns each of P ranges into its rows,
which are pickled to files. Then each run times, on a local[2] Spark session (after
``--warmup`` untimed rounds of the three, 5 by default: the JVM's JIT compiler still spends
100-270 ms of CPU a job during the first rounds, on two cores, whichever source runs, and
that noise is wider than the differences measured):
- ``cdc``: ``spark.read.format("cdc")`` (P partitions, maxRowsPerPartition = records / P)
  written to the ``noop`` sink: planning, P bounded reads from the service (AVRO mode: the
  stored blocks), decoding, Arrow record batches;
- ``trivial``: a Python data source with the same schema and P partitions, each of which
  unpickles its rows and yields them as tuples, the way the Data Source API's examples do;
- ``arrow``: the same, but each partition reads its rows as ready-made Arrow record batches
  (an Arrow IPC file of the batches the cdc source made, untimed) and yields them: the
  fastest a Python data source can hand rows to Spark;
- ``arrow over a socket``: the same batches as an Arrow IPC stream, received over a TCP
  connection to 127.0.0.1 from a server in a thread of this process that only sends a file
  with ``sendfile`` (length first, then the stream), received into one buffer and yielded
  without a copy: a service that sent Arrow instead of Avro, at no cost to make it, and
  executors that decode nothing. The cdc source gets its rows from another process too;
  this is how fast that design could at most be.
Prints the four rates (medians) and the ratios between them (and each round's own ratio: its
median and range), each job's median wall time and the CPU time each side spent on it (the
Spark JVM, its Python workers, the service's thread, the rest of this process, where the
socket source's sender runs: from /proc, for the cdc source and the two Arrow sources), after
the code paths measured:
the service's, and the decoder of the source's executors (the compiled Avro to Arrow
decoder, or with ``CDC_PURE_PYTHON=1`` the Python one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import shutil
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (
    OUT,
    RECORDS,
    announce_code_path,
    line,
    refuse_python_path,
    workload_server,
)
from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.app.service import Service
from cdcserver.core.config import Config, ListenerConfig, MetricsConfig, SourceConfig, StoreConfig
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile

USER = PASSWORD = "bench"


class ServiceThread:
    """The service in a thread of its own, caught up with the workload."""

    def __init__(self, server: EmbeddedMariaDB, data_dir: str) -> None:
        shutil.rmtree(data_dir, ignore_errors=True)
        users = os.path.join(OUT, "cdcusers")
        UsersFile(users).add(USER, PASSWORD)
        self.config = Config(
            source=SourceConfig(url=server.url(), server_id=9300, start_gtid="oldest"),
            store=StoreConfig(data_dir=data_dir),
            listener=ListenerConfig(listen="127.0.0.1:0", users_file=users),
            metrics=MetricsConfig(listen="127.0.0.1:0"))
        self.target = GtidState.parse(str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
        self.ready = threading.Event()
        self.port = 0
        self.tid = 0  # the service thread's (for its CPU time)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        service = Service(self.config)
        self._stop = asyncio.Event()
        task = asyncio.create_task(service.run(self._stop))
        await service.wait_caught_up(self.target)
        await service.data.store.flush()
        assert service.listener.address is not None
        self.port = service.listener.address[1]
        self.tid = threading.get_native_id()
        self.ready.set()
        await task

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        if not self.ready.wait(600):
            raise TimeoutError("the service did not catch up with the workload")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def file_source(name: str, schema: Any, arrow: bool) -> Any:
    """A Python data source named ``name``, one partition per file of its ``files`` option:
    rows pickled as tuples, or (``arrow``) Arrow record batches in an Arrow IPC file."""
    from pyspark.sql.datasource import DataSourceReader, InputPartition

    class FilePartition(InputPartition):
        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.path = path

    class Reader(DataSourceReader):
        def __init__(self, paths: list[str]) -> None:
            self.paths = paths

        def partitions(self) -> list[InputPartition]:
            return [FilePartition(p) for p in self.paths]

        def read(self, partition: Any) -> Iterator[Any]:
            if not arrow:
                with open(partition.path, "rb") as f:
                    yield from pickle.load(f)
                return
            import pyarrow as pa

            with pa.memory_map(partition.path) as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    return named_source(name, schema, lambda options: Reader(options["files"].split(",")))


def named_source(name: str, schema: Any, reader: Callable[[dict[str, str]], Any]) -> Any:
    """A Python data source class named ``name`` with a fixed ``schema``, whose reader is
    ``reader(options)``."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class NamedSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> Any:
            return schema

        def reader(self, schema: Any) -> DataSourceReader:
            made: DataSourceReader = reader(self.options)
            return made

    return NamedSource


class ArrowStreamServer:
    """Sends a partition's Arrow IPC stream file to whoever asks for it by number: an 8-byte
    length, then the file with ``sendfile`` (from the page cache, as the service sends
    stored blocks), a thread per connection."""

    def __init__(self, streams: list[str]) -> None:
        self.streams = streams
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with open(self.streams[int(conn.recv(16))], "rb") as stream:
                conn.sendall(os.fstat(stream.fileno()).st_size.to_bytes(8, "big"))
                conn.sendfile(stream)


def ipc_streams(arrow_files: list[str]) -> list[str]:
    """Each partition's IPC file as an IPC stream file of the same batches (untimed)."""
    import pyarrow as pa

    streams = []
    for path in arrow_files:
        streams.append(path.replace(".arrow", ".arrows"))
        with pa.memory_map(path) as source, pa.OSFile(streams[-1], "wb") as sink:
            reader = pa.ipc.open_file(source)
            with pa.ipc.new_stream(sink, reader.schema) as writer:
                for i in range(reader.num_record_batches):
                    writer.write_batch(reader.get_batch(i))
    return streams


def socket_source(name: str, schema: Any) -> Any:
    """A Python data source named ``name`` whose partitions receive their batches from an
    :class:`ArrowStreamServer` (options ``port`` and ``partitions``)."""
    from pyspark.sql.datasource import DataSourceReader, InputPartition

    class StreamPartition(InputPartition):
        def __init__(self, number: int) -> None:
            super().__init__(number)
            self.number = number

    class Reader(DataSourceReader):
        def __init__(self, port: int, count: int) -> None:
            self.port, self.count = port, count

        def partitions(self) -> list[InputPartition]:
            return [StreamPartition(n) for n in range(self.count)]

        def read(self, partition: Any) -> Iterator[Any]:
            import socket as sockets

            import pyarrow as pa

            with sockets.create_connection(("127.0.0.1", self.port)) as conn:
                conn.sendall(str(partition.number).encode())
                head = bytearray(8)
                view = memoryview(head)
                while view:
                    view = view[conn.recv_into(view):]
                buf = bytearray(int.from_bytes(head, "big"))
                view = memoryview(buf)
                while view:
                    got = conn.recv_into(view, min(len(view), 4 << 20))
                    if not got:
                        raise EOFError("the stream ended early")
                    view = view[got:]
            yield from pa.ipc.open_stream(pa.py_buffer(buf))

    return named_source(name, schema, lambda options: Reader(int(options["port"]),
                                                               int(options["partitions"])))


def pickle_partitions(options: dict[str, str], directory: str
                      ) -> tuple[Any, list[str], list[str], int]:
    """The cdc source's schema, and each partition's rows pickled to a file and its Arrow
    batches to an IPC file (untimed)."""
    from mariadb_cdc_client.spark import plan
    from mariadb_cdc_client.spark.source import CdcBatchReader, CdcDataSource, read_partition

    schema = CdcDataSource(options).schema()
    parsed = plan.Options.parse(options, streaming=False)
    parts = CdcBatchReader(parsed, schema).partitions()
    import pyarrow as pa

    files, arrow_files, total = [], [], 0
    os.makedirs(directory, exist_ok=True)
    for i, part in enumerate(parts):
        assert isinstance(part, plan.RangePartition)
        batches = list(read_partition(parsed, schema, part))
        rows = [tuple(row.values()) for batch in batches for row in batch.to_pylist()]
        total += len(rows)
        files.append(os.path.join(directory, f"part-{i}.pickle"))
        with open(files[-1], "wb") as f:
            pickle.dump(rows, f, protocol=pickle.HIGHEST_PROTOCOL)
        arrow_files.append(os.path.join(directory, f"part-{i}.arrow"))
        with pa.OSFile(arrow_files[-1], "wb") as sink, \
                pa.ipc.new_file(sink, batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    return schema, files, arrow_files, total


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> tuple[str, float]:
    """A process's command name and CPU-seconds, its reaped children's included."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    name = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
    fields = stat[stat.rindex(b")") + 2:].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return name, (utime + stime + cutime + cstime) / CLOCK_TICKS


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = []
        try:  # a process started by any of the parent's threads (the JVM's are many)
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children += [int(c) for c in f.read().split()]
            except OSError:
                continue
        out += children
        todo += children
    return out


def cpu_by_side(service_tid: int) -> dict[str, float]:
    """CPU-seconds so far of each side of a job: the Spark JVM, its Python workers, the
    service (its event loop's thread in this process) and the rest of this process (the
    driver's Python, the service's worker threads)."""
    sides = {"jvm": 0.0, "python workers": 0.0, "service": 0.0, "driver": 0.0}
    for pid in _descendants(os.getpid()):
        try:
            name, seconds = _process_cpu(pid)
        except OSError:
            continue
        sides["jvm" if name == "java" else "python workers"] += seconds
    try:
        with open(f"/proc/self/task/{service_tid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        sides["service"] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except OSError:
        pass
    _, own = _process_cpu(os.getpid())
    sides["driver"] = own - sides["service"]
    return sides


def timed_noop(spark: Any, fmt: str, options: dict[str, str],
               cpu: dict[str, list[float]] | None = None, service_tid: int = 0) -> float:
    """The job's wall time; with ``cpu``, each side's CPU-seconds for it appended there."""
    before = cpu_by_side(service_tid) if cpu is not None else {}
    start = time.perf_counter()
    spark.read.format(fmt).options(**options).load().write.format("noop") \
        .mode("overwrite").save()
    seconds = time.perf_counter() - start
    if cpu is not None:
        after = cpu_by_side(service_tid)
        for side, value in after.items():
            cpu.setdefault(side, []).append(value - before[side])
    return seconds


def announce_decoder_path() -> str:
    """Print the decoder the cdc source's executors run (Spark's Python workers run this
    interpreter, in this environment); refuse the Python one unless ``CDC_PURE_PYTHON=1``
    asks for it, as announce_code_path does for the service's."""
    from mariadb_cdc_client.arrow import decoder_path

    path = decoder_path()
    line("spark decoder measured (cdc source's executors)", path)
    refuse_python_path(path.startswith("Python"), "the compiled Avro-to-Arrow decoder is")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    args = parser.parse_args()
    announce_code_path()
    announce_decoder_path()
    from mariadb_cdc_client.spark import register

    with workload_server() as server, \
            ServiceThread(server, os.path.join(OUT, "spark-data")) as service:
        options = {"host": "127.0.0.1", "port": str(service.port), "user": USER,
                   "password": PASSWORD, "tables": "bench.orders",
                   "maxRowsPerPartition": str(-(-RECORDS // args.partitions))}
        schema, files, arrow_files, total = pickle_partitions(
            options, os.path.join(OUT, "spark-rows"))
        assert total == RECORDS, f"{total} rows, expected {RECORDS}"
        spark = spark_session()
        register(spark)
        spark.dataSource.register(file_source("trivial", schema, arrow=False))
        spark.dataSource.register(file_source("arrowref", schema, arrow=True))
        spark.dataSource.register(socket_source("arrowsocket", schema))
        trivial = {"files": ",".join(files)}
        arrow = {"files": ",".join(arrow_files)}
        sender = ArrowStreamServer(ipc_streams(arrow_files))
        over_socket = {"port": str(sender.port), "partitions": str(len(arrow_files))}
        for _ in range(args.warmup):  # the JVM's JIT, Python workers: see the docstring
            timed_noop(spark, "cdc", options)
            timed_noop(spark, "trivial", trivial)
            timed_noop(spark, "arrowref", arrow)
            timed_noop(spark, "arrowsocket", over_socket)
        cdc_times, trivial_times, arrow_times, socket_times = [], [], [], []
        cdc_cpu: dict[str, list[float]] = {}
        arrow_cpu: dict[str, list[float]] = {}
        socket_cpu: dict[str, list[float]] = {}
        for _ in range(args.runs):
            cdc_times.append(timed_noop(spark, "cdc", options, cdc_cpu, service.tid))
            trivial_times.append(timed_noop(spark, "trivial", trivial))
            arrow_times.append(timed_noop(spark, "arrowref", arrow, arrow_cpu, service.tid))
            socket_times.append(timed_noop(spark, "arrowsocket", over_socket, socket_cpu,
                                           service.tid))
        spark.stop()
    cdc_rate = RECORDS / statistics.median(cdc_times)
    trivial_rate = RECORDS / statistics.median(trivial_times)
    arrow_rate = RECORDS / statistics.median(arrow_times)
    line(f"rows: {RECORDS:,} in {len(files)} partitions, local[2], runs: {args.runs}", "")
    line("cdc source -> noop (rows/s)", f"{cdc_rate:,.0f}")
    line("trivial Python source yielding tuples -> noop (rows/s)", f"{trivial_rate:,.0f}")
    line("trivial Python source yielding Arrow batches (rows/s)", f"{arrow_rate:,.0f}")
    line("ratio cdc / tuples (issue 6 target: >= 0.7)", f"{cdc_rate / trivial_rate:.2f}")
    socket_rate = RECORDS / statistics.median(socket_times)
    line("ratio cdc / Arrow batches (issue 54 target: >= 1.0)", f"{cdc_rate / arrow_rate:.2f}")
    _paired(cdc_times, arrow_times)
    line("Arrow batches over a socket, from a server that only sends (rows/s)",
         f"{socket_rate:,.0f}")
    line("ratio Arrow over a socket / Arrow batches (a service sending Arrow, made at no "
         "cost)", f"{socket_rate / arrow_rate:.2f}")
    _paired(socket_times, arrow_times)
    line("ratio cdc / Arrow over a socket", f"{cdc_rate / socket_rate:.2f}")
    _paired(cdc_times, socket_times)
    line("median wall time a job, ms: cdc / Arrow batches / Arrow over a socket",
         " / ".join(f"{statistics.median(t) * 1000:.0f}"
                    for t in (cdc_times, arrow_times, socket_times)))
    for side in cdc_cpu:
        line(f"  CPU ms a job, {side}: cdc / Arrow batches / Arrow over a socket",
             " / ".join(f"{statistics.median(c[side]) * 1000:.0f}"
                        for c in (cdc_cpu, arrow_cpu, socket_cpu)))


def _paired(times: list[float], reference: list[float]) -> None:
    """Each round's own ratio: the rounds run the sources one after the other, so a drift of
    the machine (the JIT, the page cache, a noisy neighbour) weighs on both sides of it."""
    paired = sorted(r / t for t, r in zip(times, reference, strict=True))
    line("  the same, round by round: median (lowest-highest)",
         f"{statistics.median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f})")


if __name__ == "__main__":
    main()
