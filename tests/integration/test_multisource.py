"""GTID domains from multi-source replication: the source is a primary that also replicates
two other masters (MariaDB's named connections), each in its own GTID domain, so its binlog
interleaves three domains, all writing one table. The service must store and serve that
stream exactly: through a restart (checkpoints per domain), in a chunked dump taken during
the writes and the stream after it (the dump's point per domain, ``AFTER``), and in bounded
reads (``AFTER s UNTIL u``: exactly the transactions between the two states, per domain).

Oracles: the table on the primary (``SELECT``), rebuilt from the JSON stream over a raw
socket (``tests/oracle.py``); the writers' own record counts; and, for ``UNTIL``, the full
stream's records filtered by GTID here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import re
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpOptions, dump_tables
from tests.conftest import make_config, start_service
from tests.helpers import PASSWORD, USER, until, wait_until
from tests.oracle import assert_stream_equals_table, read_stream

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]

TABLE = "CREATE TABLE IF NOT EXISTS shop.orders (id INT PRIMARY KEY, note VARCHAR(30), " \
        "amount DECIMAL(12,2))"


class MultiSource:
    """Masters 11 (domain 1) and 12 (domain 2); the primary 1 (domain 0) replicates both
    (named connections 'east' and 'west') and logs what it applies."""

    def __init__(self, base: str) -> None:
        self.masters = [EmbeddedMariaDB(os.path.join(base, f"m{d}"), port=0, server_id=10 + d,
                                        extra_args=[f"--gtid-domain-id={d}"]) for d in (1, 2)]
        self.primary = EmbeddedMariaDB(os.path.join(base, "p"), port=0, server_id=1,
                                       extra_args=["--log-slave-updates"])

    def start(self) -> MultiSource:
        for server in (*self.masters, self.primary):
            server.start()
        for master in self.masters:
            master.create_replication_user("repl", "repl-secret")
            master.execute("CREATE DATABASE IF NOT EXISTS shop", TABLE)
        for name, master in zip(("east", "west"), self.masters, strict=True):
            self.primary.execute(
                f"CHANGE MASTER '{name}' TO MASTER_HOST='127.0.0.1', "
                f"MASTER_PORT={master.port}, MASTER_USER='repl', "
                "MASTER_PASSWORD='repl-secret', MASTER_USE_GTID=slave_pos",
                f"START SLAVE '{name}'")
        self.caught_up()
        self.primary.execute(TABLE)  # a no-op here: both masters made it
        return self

    def caught_up(self, timeout: float = 60.0) -> None:
        """The primary has applied everything both masters logged (a statement that
        changes nothing there, CREATE TABLE IF NOT EXISTS of a table it has, is applied but
        not logged again: gtid_slave_pos, not gtid_binlog_pos, says what it applied)."""
        for master in self.masters:
            target = GtidState.parse(_binlog_pos(master))
            wait_until(lambda t=target: all(GtidState.parse(str(self.primary.query(
                "SELECT @@GLOBAL.gtid_slave_pos")[0][0] or "")).covers(g) for g in t),
                timeout, "the primary has the masters' transactions")

    def stop(self) -> None:
        for server in (self.primary, *self.masters):
            server.kill()


def _binlog_pos(server: EmbeddedMariaDB) -> str:
    return str(server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


@pytest.fixture
def servers(tmp_path: os.PathLike[str]) -> Iterator[MultiSource]:
    topology = MultiSource(os.path.join(tmp_path, "servers"))
    try:  # a server that failed to start is stopped with the others
        yield topology.start()
    finally:
        topology.stop()


class Writer(threading.Thread):
    """Transactions of inserts, updates and deletes in its own id range on one server."""

    def __init__(self, server: EmbeddedMariaDB, base: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.server, self.base = server, base
        self.random = random.Random(seed)
        self.records = 0
        self.transactions = 0
        self.next = base
        self.halt = threading.Event()

    def run(self) -> None:
        conn = self.server.connect("shop")
        rnd = self.random
        try:
            with conn.cursor() as cur:
                while not self.halt.is_set():
                    self._transaction(cur, rnd)
        finally:
            conn.close()

    def _transaction(self, cur: Any, rnd: random.Random) -> None:
        cur.execute("BEGIN")
        made = 0
        for _ in range(rnd.randint(1, 3)):
            action = rnd.random()
            if action < 0.55 or self.next - self.base < 5:
                cur.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                            (self.next, f"d{self.base}", Decimal(rnd.randint(1, 9999)) / 100))
                self.next += 1
                made += 1
            elif action < 0.85:
                made += 2 * cur.execute("UPDATE orders SET amount = amount + 1 WHERE id = %s",
                                        (rnd.randrange(self.base, self.next),))
            else:
                made += cur.execute("DELETE FROM orders WHERE id = %s",
                                    (rnd.randrange(self.base, self.next),))
        cur.execute("COMMIT")
        self.records += made
        self.transactions += 1


async def _written(writers: list[Writer], transactions: int) -> None:
    """Until every writer has committed ``transactions`` transactions."""
    await until(lambda: min(w.transactions for w in writers) >= transactions, timeout=60)


async def test_three_domains_through_a_restart_a_chunked_dump_and_bounded_reads(
        tmp_path: os.PathLike[str], servers: MultiSource, users_file: str,
        caplog: pytest.LogCaptureFixture, spark: Any) -> None:
    data_dir = os.path.join(tmp_path, "data")
    config = make_config(data_dir, servers.primary.url(), users_file)
    cdc = await start_service(config)
    writers = [Writer(servers.masters[0], 1_000_000, 1), Writer(servers.masters[1], 2_000_000, 2),
               Writer(servers.primary, 3_000_000, 3)]
    for writer in writers:
        writer.start()
    try:
        await _written(writers, 100)
        await cdc.stop()  # a restart in the middle: it continues in every domain
        cdc = await start_service(config)
        await _written(writers, 200)
        # a chunked dump while all three domains write (many chunks, two readers)
        with caplog.at_level(logging.INFO, logger="cdcserver.dump"):
            (dumped,) = await asyncio.to_thread(
                dump_tables, parse_source_url(servers.primary.url()), data_dir,
                [TableName("shop", "orders")], DumpOptions(DumpConfig(readers=2, chunk_rows=100)))
        merged = re.search(r"dumped shop\.orders: \d+ rows in (\d+) chunks, (\d+) changes "
                           r"merged", caplog.text)
        assert merged and int(merged[1]) > 5 and int(merged[2]) > 0, caplog.text
        await _written(writers, 300)
    finally:
        for writer in writers:
            writer.halt.set()
        for writer in writers:
            writer.join(30)
    try:
        servers.caught_up()
        end = GtidState.parse(_binlog_pos(servers.primary))
        assert sorted(g.domain for g in end) == [0, 1, 2]
        await asyncio.wait_for(cdc.service.wait_caught_up(end), 60)

        # the stream is the table, every record once, in every domain
        conn = servers.primary.connect()
        try:
            rebuilt = await assert_stream_equals_table(cdc.port, conn, "shop", "orders",
                                                       user=USER, password=PASSWORD)
        finally:
            conn.close()
        identities = [(r["domain"], r["sequence"], r["event_number"]) for r in rebuilt.records]
        assert len(identities) == len(set(identities))
        assert len(rebuilt.records) == sum(w.records for w in writers)
        assert {r["domain"] for r in rebuilt.records} == {0, 1, 2}

        # the dump plus what follows it is the table
        header = dumped.info.header
        point = GtidState.parse(header.gtid)
        assert sorted(g.domain for g in point) == [0, 1, 2]
        image = _dump_rows(dumped.info.path)
        after = await read_stream(cdc.port, "shop.orders", user=USER, password=PASSWORD,
                                  request=f"REQUEST-DATA shop.orders AFTER {header.gtid}")
        for line in after:
            if "fields" in line:
                continue
            key = line["id"]
            if line["event_type"] in ("insert", "update_after"):
                image[key] = (line["note"], Decimal(str(line["amount"])))
            else:
                image.pop(key, None)
        table = {row[0]: (row[1], row[2]) for row in
                 servers.primary.query("SELECT id, note, amount FROM shop.orders")}
        assert image == table
        # AFTER is exact per domain: the records after the point, none before it
        records = [r for r in rebuilt.records]
        expected_after = [r for r in records if not _covers(point, r)]
        assert len([line for line in after if "fields" not in line]) == len(expected_after)

        # a bounded read: exactly the transactions after s up to u, per domain
        middle = [r for r in records if _covers(point, r)]
        start = _state_of(middle[: len(middle) // 3])
        stop = _state_of(middle[: 2 * len(middle) // 3])
        bounded = await read_stream(
            cdc.port, "shop.orders", user=USER, password=PASSWORD,
            request=f"REQUEST-DATA shop.orders AFTER {start} UNTIL {stop}")
        assert "end" in bounded[-1], bounded[-1]
        got = [(r["domain"], r["sequence"], r["event_number"]) for r in bounded
               if "fields" not in r and "end" not in r]
        want = [(r["domain"], r["sequence"], r["event_number"]) for r in records
                if _covers(GtidState.parse(stop), r) and not _covers(GtidState.parse(start), r)]
        assert got == want and bounded[-1]["records"] == len(want)

        # an inclusive GTID seek in one domain starts at that transaction and sends every
        # record stored after it, of every domain
        target = next(r for r in middle[len(middle) // 2:] if r["domain"] == 2)
        seek = f"{target['domain']}-{target['server_id']}-{target['sequence']}"
        sought = await read_stream(cdc.port, "shop.orders", user=USER, password=PASSWORD,
                                   request=f"REQUEST-DATA shop.orders {seek}")
        at = next(i for i, r in enumerate(records) if (r["domain"], r["sequence"]) ==
                  (target["domain"], target["sequence"]))
        assert [(r["domain"], r["sequence"], r["event_number"]) for r in sought
                if "fields" not in r] == \
            [(r["domain"], r["sequence"], r["event_number"]) for r in records[at:]]

        # the Spark source's offsets are such states: a batch read between the two holds
        # exactly those records, in every domain
        options = {"host": "127.0.0.1", "port": str(cdc.port), "user": USER,
                   "password": PASSWORD, "tables": "shop.orders", "startingPosition": start,
                   "endingPosition": stop}
        rows = await asyncio.to_thread(
            lambda: spark.read.format("cdc").options(**options).load()
            .select("domain", "sequence", "event_number").collect())
        assert sorted((r["domain"], r["sequence"], r["event_number"]) for r in rows) == \
            sorted(want)
    finally:
        await cdc.stop()


def _dump_rows(path: str) -> dict[int, tuple[str, Decimal]]:
    rows: dict[int, tuple[str, Decimal]] = {}
    with open(path, "rb") as f:
        f.readline()  # the header
        for line in f:
            operation = json.loads(line)
            assert operation["action"] == "insert"
            for row in operation["rows"]:
                values = [None if v is None else base64.b64decode(v).decode() for v in row]
                rows[int(values[0])] = (values[1], Decimal(values[2]))
    return rows


def _covers(state: GtidState, record: dict[str, Any]) -> bool:
    seen = state.get(record["domain"])
    return seen is not None and record["sequence"] <= seen.sequence


def _state_of(records: list[dict[str, Any]]) -> str:
    last: dict[int, dict[str, Any]] = {}
    for record in records:
        last[record["domain"]] = record
    return ",".join(f"{d}-{r['server_id']}-{r['sequence']}" for d, r in sorted(last.items()))
