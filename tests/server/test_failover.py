"""Several sources: a primary and two replicas (private ``mariadbd`` processes, replicas with
``log_slave_updates``), the service given all three. When it loses the server it reads, it
takes the first one that continues its stream exactly, and refuses the others with the reason:
one that is behind, one that diverged. The stream is checked against the table by rebuilding it
from the JSON stream over a raw socket (``tests/oracle.py``), and for exactly-once delivery by
counting the records the writer's statements make and checking that no record repeats.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.ops.metrics import health
from tests.conftest import RunningService, make_config, start_service
from tests.helpers import PASSWORD, USER, until, wait_until
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb

REPLICATION = ("repl", "repl-secret")


class Topology:
    """A primary (server_id 1) and replicas (2, 3, ...) replicating it by GTID."""

    def __init__(self, base: str, replicas: int = 2) -> None:
        args = ["--log-slave-updates", "--report-host=127.0.0.1"]
        self.servers = [EmbeddedMariaDB(os.path.join(base, f"s{i + 1}"), port=0,
                                        server_id=i + 1, extra_args=args)
                        for i in range(replicas + 1)]
        self.primary = self.servers[0]

    def start(self) -> Topology:
        for server in self.servers:
            server.start()
        self.primary.create_replication_user(*REPLICATION)
        for replica in self.servers[1:]:
            self.point(replica, self.primary)
        return self

    def stop(self) -> None:
        for server in self.servers:
            if server.process is not None and server.process.poll() is None:
                server.kill()

    def point(self, replica: EmbeddedMariaDB, primary: EmbeddedMariaDB) -> None:
        user, password = REPLICATION
        replica.execute(
            "STOP SLAVE",
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{user}', MASTER_PASSWORD='{password}', MASTER_USE_GTID=slave_pos, "
            "MASTER_CONNECT_RETRY=1",
            "START SLAVE")

    def promote(self, replica: EmbeddedMariaDB) -> None:
        """What an operator (or MaxScale's monitor) does: the replica stops replicating and
        takes writes; the other replicas follow it."""
        replica.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")
        self.primary = replica
        for other in self.servers:
            if other is not replica and other.process is not None and \
                    other.process.poll() is None:
                self.point(other, replica)

    def wait_replicated(self, timeout: float = 60.0) -> None:
        """Every running replica has applied and logged all the primary has logged."""
        target = gtid_binlog_pos(self.primary)
        for server in self.servers:
            if server is self.primary or server.process is None or \
                    server.process.poll() is not None:
                continue
            wait_until(lambda s=server: gtid_binlog_pos(s) == target, timeout,
                       f"server {server.server_id} at {target}")

    def urls(self) -> str:
        return ",".join(server.url() for server in self.servers)


def gtid_binlog_pos(server: EmbeddedMariaDB) -> str:
    return str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


@pytest.fixture
def topology(tmp_path: os.PathLike[str]) -> Iterator[Topology]:
    topology = Topology(os.path.join(tmp_path, "servers"))
    try:  # a server that failed to start is stopped with the others
        yield topology.start()
    finally:
        topology.stop()


class Writer:
    """Transactions of random inserts, updates and deletes on ``shop.orders`` against
    whichever server is the primary, counting the records they make; paused on demand."""

    def __init__(self, topology: Topology, seed: int = 11) -> None:
        self.topology = topology
        self.random = random.Random(seed)
        self.records = 0
        self.transactions = 0
        self.next_id = 1
        self.stop = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.running.set()
        self.thread.join(30)

    def pause(self) -> None:
        self.running.clear()
        self.idle.clear()
        assert self.idle.wait(30), "the writer did not pause"

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait()
                continue
            try:
                conn = self.topology.primary.connect("shop")
            except pymysql.err.MySQLError:
                time.sleep(0.05)
                continue
            try:
                with conn.cursor() as cur:
                    while self.running.is_set() and not self.stop.is_set():
                        self._transaction(cur)
            except pymysql.err.MySQLError:
                pass  # the primary went away: the next one is connected to
            finally:
                conn.close()

    def _transaction(self, cur: Any) -> None:
        rnd = self.random
        cur.execute("BEGIN")
        made = 0
        for _ in range(rnd.randint(1, 4)):
            action = rnd.random()
            if action < 0.5 or self.next_id < 10:
                cur.execute("INSERT INTO orders (id, note, amount) VALUES (%s, %s, %s)",
                            (self.next_id, f"n{self.next_id}", rnd.randint(1, 10**6)))
                self.next_id += 1
                made += 1
            elif action < 0.8:
                made += 2 * cur.execute("UPDATE orders SET amount = amount + 1, note = %s "
                                        "WHERE id = %s", (f"u{rnd.random():.6f}",
                                                          rnd.randrange(1, self.next_id)))
            else:
                made += cur.execute("DELETE FROM orders WHERE id = %s",
                                    (rnd.randrange(1, self.next_id),))
        cur.execute("COMMIT")
        self.records += made
        self.transactions += 1


def _create_table(topology: Topology) -> None:
    topology.primary.execute(
        "CREATE DATABASE shop",
        "CREATE TABLE shop.orders (id INT PRIMARY KEY, note VARCHAR(40), amount BIGINT)")


async def _service(tmp_path: os.PathLike[str], topology: Topology, users_file: str
                   ) -> RunningService:
    config = make_config(os.path.join(tmp_path, "data"), topology.urls(), users_file,
                         source={"failover_after": 1.0})
    running = await start_service(config)
    await running.replicating()
    return running


async def _caught_up(cdc: RunningService, server: EmbeddedMariaDB) -> None:
    from cdcserver.core.gtid import GtidState

    target = GtidState.parse(gtid_binlog_pos(server))
    await asyncio.wait_for(cdc.service.wait_caught_up(target), 60)


async def _assert_exactly_once(cdc: RunningService, server: EmbeddedMariaDB,
                               writer: Writer) -> Any:
    conn = server.connect()
    try:
        rebuilt = await assert_stream_equals_table(cdc.port, conn, "shop", "orders",
                                                   user=USER, password=PASSWORD)
    finally:
        conn.close()
    identities = [(r["domain"], r["server_id"], r["sequence"], r["event_number"])
                  for r in rebuilt.records]
    assert len(identities) == len(set(identities)), "a record was delivered twice"
    assert len(rebuilt.records) == writer.records, (len(rebuilt.records), writer.records)
    return rebuilt


async def test_a_promotion_under_writes_continues_the_stream_exactly_once(
        tmp_path: os.PathLike[str], topology: Topology, users_file: str) -> None:
    """The primary stops; an operator promotes the first replica and points the second at
    it; the writer goes on against the new primary. The service, given all three, moves to
    the promoted server after ``failover_after`` and the stream holds every transaction
    once, with the GTIDs the servers gave them."""
    _create_table(topology)
    topology.wait_replicated()
    cdc = await _service(tmp_path, topology, users_file)
    try:
        with Writer(topology) as writer:
            await until(lambda: writer.transactions >= 100)
            writer.pause()  # what the replicas have not received would be lost with the
            old = topology.primary  # primary; waiting for them keeps the test exact
            topology.wait_replicated()
            old.stop()
            topology.promote(topology.servers[1])
            writer.running.set()
            before = writer.transactions
            await until(lambda: writer.transactions >= before + 100)
            await until(lambda: cdc.service.replication.sources.index == 1, timeout=60)
            writer.pause()
        await _caught_up(cdc, topology.primary)
        await _assert_exactly_once(cdc, topology.primary, writer)
        assert cdc.service.replication.sources.switches == 1
        refused = {r.address.port: r.reason for r in cdc.service.replication.sources.refusals}
        assert "unreachable" in refused.get(old.port, "unreachable"), refused
    finally:
        await cdc.stop()


async def test_a_replica_behind_the_stream_is_passed_over_and_a_diverged_one_refused(
        tmp_path: os.PathLike[str], topology: Topology, users_file: str) -> None:
    """Both replicas stop replicating; the primary commits five more transactions, which
    the service stores. Replica 2 is then behind the stream; replica 3 takes writes of its
    own (errant transactions numbered past the primary's last, in its place: diverged).
    With the primary gone the service takes neither and says why, naming the GTIDs, in its
    log and /health. Once replica 2 has the missing transactions (the primary back for a
    moment), it is taken when the primary is lost again, and the stream equals its table."""
    _create_table(topology)
    first, second = topology.servers[1], topology.servers[2]
    topology.wait_replicated()
    first.execute("STOP SLAVE")
    second.execute("STOP SLAVE")
    topology.primary.execute(*(f"INSERT INTO shop.orders VALUES ({i}, 'late', {i})"
                               for i in range(1, 6)))
    stored = gtid_binlog_pos(topology.primary)  # 0-1-N: what the service will hold
    last = int(stored.rsplit("-", 1)[1])
    second.execute("RESET SLAVE ALL", "SET GLOBAL read_only = OFF",
                   *(f"INSERT INTO shop.orders VALUES ({i}, 'errant', {i})"
                     for i in range(100, 106)))
    assert gtid_binlog_pos(second) == f"0-3-{last + 1}"
    cdc = await _service(tmp_path, topology, users_file)
    try:
        await _caught_up(cdc, topology.primary)
        topology.primary.stop()

        def refusals() -> dict[int, str]:
            return {r.address.port: r.reason for r in cdc.service.replication.sources.refusals}

        await until(lambda: first.port in refusals() and second.port in refusals(),
                    timeout=60)
        reasons = refusals()
        assert reasons[first.port].startswith("behind"), reasons
        assert f"stored: '{stored}'" in reasons[first.port], reasons
        assert "gtid_slave_pos" in reasons[first.port], reasons  # it is a replica
        assert reasons[second.port].startswith("diverged"), reasons
        assert f"0-1-{last}" in reasons[second.port], reasons
        assert cdc.service.replication.sources.index == 0  # still the lost primary: nothing taken
        healthy, document = health(cdc.service.stats(), 60)
        assert not healthy and any("behind" in t for t in document["source"]["refused"])
        assert any("no source can continue" in p for p in document["problems"]), document

        topology.primary.start()  # the behind replica gets the rest
        first.execute("START SLAVE")
        wait_until(lambda: gtid_binlog_pos(first) == stored, 30)
        topology.primary.kill()
        await until(lambda: cdc.service.replication.sources.index == 1, timeout=60)
        first.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF",
                      "INSERT INTO shop.orders VALUES (200, 'after', 2)")
        await _caught_up(cdc, first)
        conn = first.connect()
        try:
            rebuilt = await assert_stream_equals_table(cdc.port, conn, "shop", "orders",
                                                       user=USER, password=PASSWORD)
        finally:
            conn.close()
        assert {r["note"] for r in rebuilt.records} == {"late", "after"}
    finally:
        await cdc.stop()


async def test_a_chunked_dump_after_a_move_reads_the_new_server_exactly(
        tmp_path: os.PathLike[str], topology: Topology, users_file: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """After the service moved to a replica, a chunked dump of that replica merges only what
    the replica's binlog positions can be compared with (the transactions stored from the
    old primary, whose positions are not the replica's, are behind the dump's GTID floor),
    and equals the table; a dump of a server other than the one the service reads is taken
    in one snapshot, saying why."""
    import logging

    from cdcserver.core.config import DumpConfig, parse_source_url
    from cdcserver.core.names import TableName
    from cdcserver.dump.chunks import service_source
    from cdcserver.dump.dumper import DumpOptions, dump_tables

    _create_table(topology)
    # the primary's binlog rotates (a replica's does not), so that the positions stored from
    # it are past any position of the replica's; a schema change among them is what a dump
    # of the replica must not take for a change made during it
    topology.primary.execute(
        "INSERT INTO shop.orders SELECT seq, CONCAT('n', seq), seq FROM shop.seq_1_to_3000",
        "FLUSH BINARY LOGS", "FLUSH BINARY LOGS",
        "ALTER TABLE shop.orders ADD COLUMN extra INT",
        *(f"UPDATE shop.orders SET amount = amount + {i} WHERE id % 50 = {i}"
          for i in range(50)))
    topology.wait_replicated()
    cdc = await _service(tmp_path, topology, users_file)
    try:
        await _caught_up(cdc, topology.primary)
        topology.primary.stop()
        replica, other = topology.servers[1], topology.servers[2]
        data_dir = cdc.service.config.store.data_dir
        # Reading it, not only chosen: the service records the server it reads when it has
        # connected (state/source.json), which is what a dump compares itself with; its
        # GTID state may cover the replica's before that.
        await until(lambda: (service_source(data_dir) or ("", ""))[1].endswith(
            f":{replica.port}"), timeout=60, what="the service reading the replica")
        await _caught_up(cdc, replica)
        table = TableName("shop", "orders")
        expected = {row[0]: (row[1], row[2]) for row in
                    replica.query("SELECT id, note, amount FROM shop.orders")}
        for server in (replica, other):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="cdcserver.dump"):
                (result,) = await asyncio.to_thread(
                    dump_tables, parse_source_url(server.url()), data_dir, [table],
                    DumpOptions(DumpConfig(readers=2, chunk_rows=200)))
            image: dict[Any, Any] = {}
            from mariadb_cdc_client.dump import DumpRows, apply, read_dump
            for item in read_dump(result.info.path):
                if isinstance(item, DumpRows):
                    apply(image, ["id"], item)
            assert {k[0]: (v["note"], v["amount"]) for k, v in image.items()} == expected
            one_snapshot = "the service reads another server" in caplog.text
            assert one_snapshot == (server is other), caplog.text
    finally:
        await cdc.stop()


async def test_a_replica_is_a_source_only_if_it_logs_what_it_applies(
        tmp_path: os.PathLike[str], topology: Topology, users_file: str) -> None:
    """The recommended set-up: the service reads a replica (log_slave_updates), and the
    stream is the primary's, with its GTIDs. A replica without log_slave_updates would give
    a stream without the primary's writes: the preflight refuses it, with the fix."""
    from cdcserver.core.config import parse_source_url
    from cdcserver.replication.preflight import check_source

    _create_table(topology)
    replica = topology.servers[1]
    topology.wait_replicated()
    config = make_config(os.path.join(tmp_path, "data"), replica.url(), users_file)
    cdc = await start_service(config)
    try:
        with Writer(topology) as writer:
            await until(lambda: writer.transactions >= 100)
            writer.pause()
        topology.wait_replicated()
        await _caught_up(cdc, replica)
        rebuilt = await _assert_exactly_once(cdc, replica, writer)
        assert {r["server_id"] for r in rebuilt.records} == {1}  # the primary's GTIDs
    finally:
        await cdc.stop()

    lone = EmbeddedMariaDB(os.path.join(tmp_path, "lone"), port=0, server_id=9).start()
    try:
        topology.point(lone, topology.primary)
        wait_until(lambda: gtid_binlog_pos(lone) == "" and bool(
            lone.query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA='shop'")),
            30, "the replica without log_slave_updates has the table")
        report = check_source(parse_source_url(lone.url()))
        (finding,) = [f for f in report.fatal if f.check == "replica"]
        assert "without log_slave_updates" in finding.detail
        assert "log_slave_updates = ON" in finding.fix
        report = check_source(parse_source_url(replica.url()))
        assert not report.fatal and any(f.check == "replica" and "logs what it applies" in
                                        f.detail for f in report.findings), report.text()
    finally:
        lone.kill()
