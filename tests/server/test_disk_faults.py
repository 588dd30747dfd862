"""The data directory's disk fails under the service (issue 55, items 1 and 4): an ``EIO`` on
write, an ``EIO`` on fsync, the file system turned read-only, and fsyncs that take seconds.

The service runs as a process of its own (``cdcserver run``) with ``tests/diskfault``'s shim
preloaded, which fails its file calls under the data directory on the test's word; the version
files, SQLite's index and the checkpoint alike. A failing disk must pause replication with one
line in the log and ``/health`` saying why, leave the listener serving what is stored, and
once the disk works, start the service over from its checkpoint by itself: the table rebuilt
from the stream by ``tests/oracle.py`` (no code shared with the service) equals ``SELECT``,
and no change comes twice. A slow disk must slow the service without a checkpoint ever
covering bytes not yet synced. The Kafka sink's own state meets the same faults, and a
``read_committed`` consumer still reads every row once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest

from cdcserver.app.embedded import free_port
from cdcserver.store import checkpoint as ckpt
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import version_file
from tests import chaos
from tests.conftest import Source, next_server_id
from tests.diskfault import DiskFaults
from tests.helpers import PASSWORD, USER, RawClient, pace
from tests.integration.test_kafka import raw_messages
from tests.integration.test_kafka_delivery import kafka_file_covers
from tests.integration.test_kafka_snapshot import create_items, differences, rebuild, selected
from tests.kafka_exactly_once import RowWriter, exactly_once_config, items_exactly_once
from tests.oracle import assert_each_change_once

pytestmark = [pytest.mark.mariadb, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAUSED = "replication paused: the data directory's disk failed"


@pytest.fixture
def disk(tmp_path) -> DiskFaults:
    return DiskFaults(str(tmp_path / "data"), str(tmp_path))


@pytest.fixture
def service(tmp_path, source: Source, users_file: str, disk: DiskFaults
            ) -> Iterator[chaos.Service]:
    # the listener on "any free port": a start over keeps the port it got
    args = chaos.service_args(source.url, disk.directory, users_file, next_server_id())
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{free_port()}"
    running = chaos.Service(args, str(tmp_path / "service.log"), env=disk.env())
    running.start()
    running.wait_ready()
    yield running
    if running.exited() is None:
        running.kill()


class Writer:
    """Row changes, one transaction each, in a thread until stopped: inserts, updates of
    what was inserted, deletes, so before-images are checked too."""

    def __init__(self, source: Source, first: int) -> None:
        self.conn = source.server.connect(source.database)
        self.next = first
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.stopped.is_set():
                n = self.next
                cur.execute("INSERT INTO t VALUES (%s, REPEAT('x', 2000))", (n,))
                cur.execute("UPDATE t SET body = CONCAT('u', body) WHERE id = %s", (n - 3,))
                if n % 5 == 0:
                    cur.execute("DELETE FROM t WHERE id = %s", (n - 7,))
                self.next += 1
                time.sleep(0.005)

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join(30)
        self.conn.close()


def _table(source: Source, rows: int) -> None:
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY, body TEXT)",
                   *(f"INSERT INTO `{source.database}`.t VALUES ({i}, 'before')"
                     for i in range(1, rows + 1)))


async def _stored_table(source: Source, service: chaos.Service, disk: DiskFaults) -> None:
    """Table ``t`` with ten rows on the source, the service caught up with it, and its
    checkpoint past them: the store's fsyncs of those rows are done, so that a fault
    injected next meets the next statement's first. (Caught up is applied, not synced: a
    store flush after it met the fault first, and the pause named a version file, not the
    schema history the test was about. A fault scoped to the history's path instead would
    not keep the service paused: its probe of the disk, another file, works.)"""
    _table(source, 10)
    conn = source.server.connect(source.database)
    try:
        assert await asyncio.to_thread(chaos.caught_up, service, conn, 60)
    finally:
        conn.close()
    logged = source.gtid_state()
    await asyncio.to_thread(_until, lambda: _checkpointed(_data_dir(service), disk, logged),
                            60, "the checkpoint past the table's rows, synced")


def _checkpointed(data: DataDir, disk: DiskFaults, state: Any) -> bool:
    """The checkpoint covers ``state``, and its journal is synced as it is now (a line of
    it is read before its fsync returns)."""
    covered = ckpt.covered_state(data.checkpoint)
    if not all(covered.covers(gtid) for gtid in state):
        return False
    journal = os.path.realpath(data.checkpoint_log)
    return not os.path.exists(journal) or \
        disk.synced().get(journal, -1) >= os.path.getsize(journal)


def _data_dir(service: chaos.Service) -> DataDir:
    return DataDir(service.args[service.args.index("--data-dir") + 1])


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _paused_for(service: chaos.Service) -> str:
    return next((p for p in service.health().get("problems", []) if p.startswith(PAUSED)), "")


async def _told_in_one_line_and_healed(service: chaos.Service, disk: DiskFaults,
                                       named: str) -> None:
    """Replication paused for the failing disk in the runner's one line, which names
    ``named``, no traceback or crash in the log; then the disk healed and the service
    starting over from its checkpoint."""
    why = await asyncio.to_thread(_until, lambda: _paused_for(service), 60,
                                  "replication paused for the failing disk")
    assert named in why and "Input/output error" in why, why
    await asyncio.sleep(1)
    text = service.text()
    assert "Traceback" not in text and "crashed" not in text, text[-3000:]
    assert text.count(PAUSED) == 1, text[-3000:]
    disk.heal()
    await asyncio.to_thread(_until, lambda: "starting over from the checkpoint" in
                            service.text(), 60, "the service starting over")


async def _assert_whole(service: chaos.Service, source: Source) -> None:
    conn = source.server.connect(source.database)
    try:
        assert await asyncio.to_thread(chaos.caught_up, service, conn, 120), \
            service.text()[-3000:]
        await assert_each_change_once(service.port, conn, source.database, "t", user=USER,
                                      password=PASSWORD)
    finally:
        conn.close()
    avro = _data_dir(service).avro
    for name in os.listdir(avro):  # no file left half written
        if name.endswith(".avro"):
            with open(os.path.join(avro, name), "rb") as f:
                assert sum(1 for _ in fastavro.reader(f)) > 0, name


@pytest.mark.parametrize("fault", ["eio-write", "eio-fsync", "erofs"])
async def test_a_failing_disk_pauses_and_the_service_starts_over_from_its_checkpoint(
        fault: str, source: Source, disk: DiskFaults, service: chaos.Service):
    await _stored_table(source, service, disk)
    port = service.port

    disk.inject(fault)
    writer = Writer(source, 11)
    try:
        why = await asyncio.to_thread(_until, lambda: _paused_for(service), 60,
                                      f"replication paused for the {fault}")
        # (what fails first says it: a version file's write, or SQLite's index)
        said = {"eio-write": ("Input/output error", "disk I/O error"),
                "eio-fsync": ("fsync of", "disk I/O error"),
                "erofs": ("Read-only file system", "readonly database")}[fault]
        assert any(text in why for text in said), why
        await asyncio.sleep(2)  # a disk failing on: said once, not once a retry
        assert service.text().count(PAUSED) == 1, service.text()[-3000:]
        assert service.exited() is None

        client = await RawClient.connect(port)  # what is stored is served meanwhile
        await client.login()
        await client.send(f"REQUEST-DATA {source.database}.t\n".encode())
        assert (await client.json_line())["table"] == "t"
        assert (await client.json_line())["body"] == "before"
        await client.close()

        disk.heal()
        await asyncio.to_thread(_until, lambda: "starting over from the checkpoint" in
                                service.text(), 60, "the service starting over")
        await asyncio.sleep(1)  # changes while the new start catches up
    finally:
        writer.stop()
    assert service.exited() is None, service.text()[-3000:]
    assert service.port == port  # (wait_ready found it from the log, once)
    await _assert_whole(service, source)


async def test_a_slow_disk_slows_the_service_and_no_checkpoint_passes_what_is_synced(
        source: Source, disk: DiskFaults, service: chaos.Service):
    _table(source, 10)
    data = DataDir(disk.directory)
    assert service.process is not None
    rss_before = rss = _rss(service.process.pid)
    disk.slow_fsync(0.5)
    writer = Writer(source, 11)
    positions = set()
    started = time.monotonic()
    try:
        # 20 s at least; on a loaded machine, until the checkpoint moved 4 times and 100
        # rows were written (2 minutes at most): a rate is not what this test is for
        while (elapsed := time.monotonic() - started) < 20 or \
                (elapsed < 120 and (len(positions - {None}) <= 3 or writer.next - 11 <= 100)):
            positions.add(await asyncio.to_thread(_checkpoint_within_synced, data, disk))
            rss = max(rss, _rss(service.process.pid))
            await asyncio.sleep(0.05)
        rows_written = writer.next - 11
    finally:
        writer.stop()
    disk.heal()
    print(f"\nfsync 0.5 s slower: {len(positions - {None})} checkpoints in {elapsed:.0f} s, "
          f"{rows_written} rows written, RSS grew {(rss - rss_before) >> 20} MiB")
    assert len(positions - {None}) > 3, "the checkpoint hardly moved while fsyncs were slow"
    assert rows_written > 100, "the writer hardly wrote"
    assert rss - rss_before < 200 << 20, f"memory grew by {(rss - rss_before) >> 20} MiB"
    assert service.exited() is None
    await _assert_whole(service, source)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _checkpoint_within_synced(data: DataDir, disk: DiskFaults) -> str | None:
    """The checkpoint's position, once it covers table data, each table's mark checked to be
    within what the shim saw synced of its version file."""
    checkpoint = ckpt.load(data.checkpoint)
    if checkpoint is None or not checkpoint.tables or checkpoint.position is None:
        return None
    synced = disk.synced()
    for table, mark in checkpoint.tables.items():
        path = os.path.join(os.path.realpath(data.avro), version_file(table, mark.version,
                                                                      "avro"))
        assert mark.size <= synced.get(path, -1), \
            f"the checkpoint covers {table} v{mark.version} up to {mark.size} bytes, but " \
            f"only {synced.get(path)} were synced"
    return str(checkpoint.position.gtid_state)


def test_after_a_failed_fsync_the_store_writes_no_checkpoint_even_once_fsyncs_work(
        disk: DiskFaults):
    """The store alone, in a process under the shim (``tests/diskfault/failed_fsync.py``)."""
    done = subprocess.run([sys.executable, "-m", "tests.diskfault.failed_fsync",
                           disk.directory, disk.control], env=disk.env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["damaged", "refused", "refused", "kept"], done.stderr


@pytest.mark.kafka
@pytest.mark.parametrize("fault", ["enospc", "eio-write"])
async def test_the_kafka_sinks_state_on_a_failing_disk_publishes_every_row_once(
        fault: str, tmp_path, source: Source, users_file: str, kafka_broker):
    """Only the Kafka sink's own state file (``state/kafka.json``) meets the fault, for 5 s,
    while rows are written and published exactly once: a full disk pauses replication until
    it takes the file again, a failing one starts the service over from its checkpoints. A
    read_committed consumer reads every row once, in order."""
    disk = DiskFaults(str(tmp_path / "data"), str(tmp_path))
    config = tmp_path / "kafka.toml"
    config.write_text(exactly_once_config(kafka_broker.bootstrap, source))
    args = [*chaos.service_args(source.url, disk.directory, users_file, next_server_id()),
            "--config", str(config)]
    service = chaos.Service(args, str(tmp_path / "service.log"), env=disk.env())
    service.start()
    writer = RowWriter(source)
    try:
        await asyncio.to_thread(service.wait_ready)
        writer.start()
        await pace(2.0)
        disk.inject(fault, only=DataDir(disk.directory).kafka_state)
        said = "replication paused: " if fault == "enospc" else PAUSED
        await asyncio.to_thread(_until, lambda: said in service.text(), 60,
                                f"the {fault} on the Kafka state noticed")
        await pace(3.0)
        disk.heal()
        await pace(2.0)
        writer.stop()
        conn = source.server.connect(source.database)
        try:
            assert await asyncio.to_thread(chaos.caught_up, service, conn, 120), \
                service.text()[-3000:]
        finally:
            conn.close()
        # and Kafka's commits: a commit the fault cut short rewinds the Kafka sink alone,
        # which publishes again after the store has applied everything
        target = source.gtid_state()
        await asyncio.to_thread(_until, lambda: kafka_file_covers(disk.directory, target),
                                120, "Kafka's commits caught up")
        assert service.exited() is None, service.text()[-3000:]
    finally:
        writer.stop()
        code = service.stop()
    assert code == 0, service.text()[-3000:]
    try:
        await items_exactly_once(kafka_broker.bootstrap, source, writer.written)
    except AssertionError as exc:  # what the service said of Kafka, to tell why
        said = [line for line in service.text().splitlines() if "kafka" in line.lower()]
        raise AssertionError("\n".join([str(exc), *said[-60:]])) from exc


@pytest.mark.parametrize("fault", ["enospc", "eio-write"])
async def test_a_repair_whose_views_meet_a_disk_fault_quarantines_nothing(
        fault: str, source: Source, disk: DiskFaults, service: chaos.Service):
    """Rows changed without row events (``ALTER ... ADD COLUMN ... DEFAULT`` fills the
    column of every row) are read again through views the service keeps in its data
    directory (``state/views.sqlite``). Only they meet the fault here: that is no fault of
    the table, so replication pauses (or starts over) and the rows are read again once the
    disk works; before, the table was quarantined."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, body TEXT)",
                   f"INSERT INTO `{db}`.t SELECT seq, REPEAT('r', 300) "
                   f"FROM `{db}`.seq_1_to_5000")
    conn = source.server.connect(db)
    try:
        assert await asyncio.to_thread(chaos.caught_up, service, conn, 60)
        disk.inject(fault, only=DataDir(disk.directory).views)
        source.execute(f"ALTER TABLE `{db}`.t ADD COLUMN x INT NOT NULL DEFAULT 7")
        said = "replication paused: re-reading the rows" if fault == "enospc" else PAUSED
        await asyncio.to_thread(_until, lambda: said in service.text(), 60,
                                f"the {fault} on the views noticed")
        if fault == "enospc":  # (paused, the service serves on; a failing disk starts it over)
            assert not service.health().get("quarantined"), service.health()
        disk.heal()
        source.execute(f"UPDATE `{db}`.t SET x = 8 WHERE id <= 10")
        assert await asyncio.to_thread(chaos.caught_up, service, conn, 120), \
            service.text()[-6000:]
    finally:
        conn.close()
    assert "quarantined" not in service.text(), service.text()[-3000:]
    await _assert_whole(service, source)


async def test_a_schema_statement_on_a_failing_disk_is_told_in_one_line_without_a_traceback(
        source: Source, disk: DiskFaults, service: chaos.Service):
    """The replication thread writes the schema history (a line per schema statement,
    fsynced) before the store sees the statement. A failing disk refused it there, and the
    thread logged a crash with its traceback, 50 times in a 560-fault soak, before the
    runner's one line. Now the runner's line is the one: it names the history."""
    await _stored_table(source, service, disk)
    disk.inject("eio-fsync")
    source.execute(f"ALTER TABLE `{source.database}`.t ADD COLUMN extra INT")
    await _told_in_one_line_and_healed(service, disk, "schema history")
    source.execute(f"INSERT INTO `{source.database}`.t VALUES (11, 'after', 5)")
    assert service.exited() is None, service.text()[-3000:]
    await _assert_whole(service, source)


async def test_an_xa_prepare_on_a_failing_disk_is_told_in_one_line_without_a_traceback(
        source: Source, disk: DiskFaults, service: chaos.Service):
    """The replication thread keeps a prepared XA transaction's events in ``state/xa``,
    fsynced at its ``XA PREPARE``. A failing disk refused that fsync, and the thread logged
    a crash with its traceback before the runner's one line (found in review; the service
    started over all the same). Now the runner's line is the one, and it names the file's
    kind. The transaction, committed once the disk works, reaches the stream whole."""
    await _stored_table(source, service, disk)
    db = source.database
    disk.inject("eio-fsync")
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            for sql in ("XA START 'onfailing'", f"INSERT INTO `{db}`.t VALUES (11, 'xa')",
                        f"UPDATE `{db}`.t SET body = 'xa' WHERE id = 1", "XA END 'onfailing'",
                        "XA PREPARE 'onfailing'"):
                cur.execute(sql)
    finally:
        conn.close()
    await _told_in_one_line_and_healed(service, disk, "replication's state")
    source.execute("XA COMMIT 'onfailing'")
    assert service.exited() is None, service.text()[-3000:]
    await _assert_whole(service, source)


@pytest.mark.kafka
async def test_an_initial_snapshot_whose_position_is_refused_says_so_and_joins_once_it_is_taken(
        tmp_path, source: Source, users_file: str, kafka_broker):
    """The Kafka sink's initial snapshot ends by recording its position (``state/kafka.json``):
    replication goes on from there. A full disk refused that write, and the sink stayed out of
    replication for good, saying nothing (found in review). Now it says so and tries again,
    without taking the snapshot again; once the file is taken, the rows and the changes after
    them rebuild the table as ``SELECT`` reads it."""
    db = source.database
    create_items(source, 3000)
    disk = DiskFaults(str(tmp_path / "data"), str(tmp_path))
    config = tmp_path / "kafka.toml"
    config.write_text(f'[kafka]\nbootstrap = "{kafka_broker.bootstrap}"\nformat = "debezium"\n'
                      f'topic = "{{db}}.{{table}}"\npartitions = 3\nsnapshot = "initial"\n'
                      f'include = "{db}.*"\n')
    args = [*chaos.service_args(source.url, disk.directory, users_file, next_server_id()),
            "--config", str(config)]
    disk.inject("enospc", only=DataDir(disk.directory).kafka_state)
    service = chaos.Service(args, str(tmp_path / "service.log"), env=disk.env())
    service.start()
    try:
        await asyncio.to_thread(service.wait_ready)
        await asyncio.to_thread(_until, lambda: "its position could not be recorded" in
                                service.text(), 120, "the refused position said")
        assert service.text().count("formatted by") == 0  # (3,000 rows: in the service)
        disk.heal()
        await asyncio.to_thread(_until, lambda: os.path.exists(
            DataDir(disk.directory).kafka_state), 60, "the position recorded")
        source.execute(f"UPDATE `{db}`.items SET n = -1 WHERE id <= 10",
                       f"DELETE FROM `{db}`.items WHERE id BETWEEN 11 AND 20",
                       f"INSERT INTO `{db}`.items (id, n) VALUES (9001, 1)")
        target = source.gtid_state()
        await asyncio.to_thread(_until, lambda: kafka_file_covers(disk.directory, target),
                                120, "the changes after the snapshot published")
        assert service.exited() is None, service.text()[-3000:]
    finally:
        code = service.stop()
    assert code == 0, service.text()[-3000:]
    text = service.text()
    assert text.count("publishing an initial snapshot") == 1, text[-3000:]  # not again
    messages = await raw_messages(kafka_broker, f"{db}.items")
    rebuilt, table = rebuild(messages), selected(source)
    assert not differences(rebuilt, table), "\n".join(differences(rebuilt, table))


def test_each_checkpoint_is_synced_after_the_index_rows_it_covers(disk: DiskFaults):
    """The flush's order: the version files, the index, then the checkpoint, so that no
    checkpoint covers what a crash of the machine could take back. The index is SQLite in
    WAL mode, whose commits (``synchronous=NORMAL``) synced the WAL only at SQLite's own
    checkpoints: a power loss could drop index rows a checkpoint covered (found in review).
    From the shim's log of every sync that succeeded: before each write of the checkpoint's
    journal, the WAL was synced since the one before."""
    done = subprocess.run([sys.executable, "-m", "tests.diskfault.flushes", disk.directory],
                          env=disk.env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    layout = DataDir(disk.directory)
    wal, journal = os.path.realpath(layout.index) + "-wal", os.path.realpath(
        layout.checkpoint_log)
    with open(disk.sync_log, encoding="utf-8") as f:
        synced = [line.split(" ")[1] for line in f if line.startswith("sync ")]
    checkpoints = [i for i, path in enumerate(synced) if path == journal]
    assert len(checkpoints) >= 3, synced
    previous = -1
    for at in checkpoints[-3:]:  # (the three flushes with rows; the open's own first)
        assert wal in synced[previous + 1:at], (at, synced)
        previous = at
