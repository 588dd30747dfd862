"""Galera: a three-node cluster of private ``mariadbd`` processes (Debian's galera-4, rsync
state transfer), ``wsrep_gtid_mode=ON`` with one ``wsrep_gtid_domain_id`` and the same
``server_id`` on every node (then every node logs every transaction under the same GTID, in
the same order, and ``gtid_current_pos`` agrees; with distinct ids it does not), and
``log_slave_updates`` so each node's binlog holds the cluster's writes. The service is given
the three nodes; it reads node 1 while a writer commits on node 2; node 1 is killed (-9); the
service moves to a surviving node and the stream holds every transaction exactly once.

Rsync's daemon, started by root for a state transfer, drops to ``nobody`` and cannot write a
private data directory: as root the nodes are given an ``rsync`` that keeps the daemon root
(found out by running it; see the shim below). ``mariadbd`` puts ``/usr//bin`` first on its
PATH unless that exact entry is already there.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator

import pymysql
import pytest

from cdcserver.app.embedded import EmbeddedMariaDB, free_port
from cdcserver.core.gtid import GtidState
from tests.conftest import make_config, start_service
from tests.helpers import PASSWORD, USER, until, wait_until
from tests.oracle import assert_stream_equals_table

pytestmark = pytest.mark.mariadb

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
DOMAIN = 100  # wsrep_gtid_domain_id: every node logs the cluster's writes in it
SHIM = """#!/bin/sh
# keep rsync's daemon (a state transfer's receiver) root when started by root
for a in "$@"; do
  if [ "$a" = "--daemon" ]; then exec /usr/bin/rsync "$@" --dparam=uid=root --dparam=gid=root; fi
done
exec /usr/bin/rsync "$@"
"""


class Cluster:
    def __init__(self, base: str, size: int = 3) -> None:
        galera = [free_port() for _ in range(size)]
        addresses = ",".join(f"127.0.0.1:{p}" for p in galera)
        self.nodes = []
        for i in range(size):
            sst, ist = free_port(), free_port()
            options = (f"gmcast.listen_addr=tcp://127.0.0.1:{galera[i]};base_port={galera[i]};"
                       f"ist.recv_addr=127.0.0.1:{ist};gcache.size=64M;"
                       "evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S")
            args = ["--wsrep-on=ON", f"--wsrep-provider={PROVIDER}",
                    f"--wsrep-cluster-address=gcomm://{addresses}", "--wsrep-cluster-name=cdc",
                    f"--wsrep-node-address=127.0.0.1:{galera[i]}", f"--wsrep-node-name=n{i + 1}",
                    f"--wsrep-provider-options={options}", "--wsrep-sst-method=rsync",
                    f"--wsrep-sst-receive-address=127.0.0.1:{sst}", "--binlog-format=ROW",
                    "--innodb-autoinc-lock-mode=2", "--log-slave-updates=ON",
                    "--wsrep-gtid-mode=ON", f"--wsrep-gtid-domain-id={DOMAIN}",
                    "--gtid-domain-id=0", "--innodb-buffer-pool-size=64M",
                    *(["--wsrep-new-cluster"] if i == 0 else [])]
            self.nodes.append(EmbeddedMariaDB(os.path.join(base, f"n{i + 1}"), port=0,
                                              server_id=1, extra_args=args))

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start(timeout=120)
            wait_until(lambda n=node: _synced(n), 120, "the node to be synced")
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def _status(node: EmbeddedMariaDB, name: str) -> str:
    return str(dict(node.query(f"SHOW STATUS LIKE '{name}'")).get(name, ""))


def _synced(node: EmbeddedMariaDB) -> bool:
    """Whether the node says it is Synced. A joiner that is ready for connections while it
    still applies its incremental state transfer may drop a connection ("Got an error writing
    communication packets", seen beside a loaded suite): not synced yet, unless it exited."""
    try:
        return _status(node, "wsrep_local_state_comment") == "Synced"
    except pymysql.err.OperationalError:
        if node.process is None or node.process.poll() is not None:
            raise
        return False


def _binlog_pos(node: EmbeddedMariaDB) -> str:
    return str(node.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


@pytest.fixture
def cluster(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    if not os.path.exists(PROVIDER):
        pytest.skip("galera-4 is not installed (tests/run.sh installs it)")
    shims = os.path.join(tmp_path, "bin")
    os.makedirs(shims)
    with open(os.path.join(shims, "rsync"), "w") as f:
        f.write(SHIM)
    os.chmod(os.path.join(shims, "rsync"), 0o755)
    monkeypatch.setenv("PATH", f"{shims}:/usr//bin:{os.environ['PATH']}")
    nodes = Cluster(os.path.join(tmp_path, "galera"))
    try:
        yield nodes.start()
    finally:
        nodes.stop()


class Writer(threading.Thread):
    """Transactions on one node, counting the records they make."""

    def __init__(self, node: EmbeddedMariaDB) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.random = random.Random(3)
        self.records = self.transactions = 0
        self.next = 1
        self.halt = threading.Event()

    def run(self) -> None:
        conn = self.node.connect("shop")
        rnd = self.random
        try:
            with conn.cursor() as cur:
                while not self.halt.is_set():
                    cur.execute("BEGIN")
                    made = 0
                    for _ in range(rnd.randint(1, 3)):
                        if rnd.random() < 0.6 or self.next < 5:
                            cur.execute("INSERT INTO orders VALUES (%s, %s)",
                                        (self.next, rnd.randint(1, 999)))
                            self.next += 1
                            made += 1
                        elif rnd.random() < 0.7:
                            made += 2 * cur.execute("UPDATE orders SET v = v + 1 WHERE id = %s",
                                                    (rnd.randrange(1, self.next),))
                        else:
                            made += cur.execute("DELETE FROM orders WHERE id = %s",
                                                (rnd.randrange(1, self.next),))
                    try:
                        cur.execute("COMMIT")
                    except pymysql.err.OperationalError:  # a certification conflict: undone
                        continue
                    self.records += made
                    self.transactions += 1
                    time.sleep(0.002)
        finally:
            conn.close()


async def test_the_service_moves_to_a_surviving_node_exactly_once(
        tmp_path: os.PathLike[str], cluster: Cluster, users_file: str) -> None:
    first, second, third = cluster.nodes
    first.execute("CREATE DATABASE shop",
                  "CREATE TABLE shop.orders (id INT PRIMARY KEY, v INT)")
    wait_until(lambda: _binlog_pos(second) == _binlog_pos(first), 30)
    assert _binlog_pos(first).startswith(f"{DOMAIN}-1-")
    urls = ",".join(node.url() for node in cluster.nodes)
    config = make_config(os.path.join(tmp_path, "data"), urls, users_file,
                         source={"failover_after": 1.0})
    cdc = await start_service(config)
    writer = Writer(second)
    writer.start()
    try:
        await until(lambda: writer.transactions >= 150, timeout=60)
        first.kill()  # the node the service reads
        before = writer.transactions
        await until(lambda: cdc.service.replication.sources.index != 0, timeout=60)
        await until(lambda: writer.transactions >= before + 150, timeout=60)
    finally:
        writer.halt.set()
        writer.join(30)
    try:
        wait_until(lambda: _binlog_pos(third) == _binlog_pos(second), 30)
        await asyncio.wait_for(cdc.service.wait_caught_up(
            GtidState.parse(_binlog_pos(second))), 60)
        conn = second.connect()
        try:
            rebuilt = await assert_stream_equals_table(cdc.port, conn, "shop", "orders",
                                                       user=USER, password=PASSWORD)
        finally:
            conn.close()
        identities = [(r["domain"], r["sequence"], r["event_number"]) for r in rebuilt.records]
        assert len(identities) == len(set(identities)), "a record arrived twice"
        assert len(rebuilt.records) == writer.records
        assert {r["domain"] for r in rebuilt.records} == {DOMAIN}
        assert cdc.service.replication.sources.switches == 1
    finally:
        await cdc.stop()
