"""The user's seed formats, replayed: the data platform's (seed 002) examples, message for message.

``tests/golden/seed002_examples.json`` holds seed 002's own example messages, as the seed
prints them. The test runs the statements behind them on a real MariaDB, publishes in the
``dip`` format to a real broker and compares each message with its example, every key and
value, except what no replay can reproduce: the times (``es``, ``ts``, ``TIME``), the binlog
file, and ``GLOBAL_ID`` (the seed's source ran without GTIDs; MariaDB always has one). The
positions are checked against ``SHOW BINLOG EVENTS`` instead: ``BINLOG_POS`` is where the
transaction's GTID event starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Source, make_config, start_service
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]

EXAMPLES = json.loads((Path(__file__).parent.parent / "golden" / "seed002_examples.json").read_text(
    encoding="utf-8"))

# The statements behind seed 002's examples, in an order that makes each example's message.
# Setup statements (no example) make the tables the examples change.
SETUP = [
    "DROP DATABASE IF EXISTS inventory", "DROP DATABASE IF EXISTS test",
    'DROP DATABASE IF EXISTS `testDB`',
    "CREATE DATABASE inventory", "CREATE DATABASE test", "CREATE DATABASE `testDB`",
    "CREATE TABLE inventory.customers (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
    "first_name VARCHAR(255) NOT NULL, last_name VARCHAR(255) NOT NULL, "
    "email VARCHAR(255) NOT NULL UNIQUE) AUTO_INCREMENT=1001",
    "CREATE TABLE test.`user` (id INT PRIMARY KEY)",
    "CREATE TABLE `testDB`.test (id INT PRIMARY KEY)",
]
CREATE_DATABASE = EXAMPLES["create database"]["sql"].replace("utf8mb4_0900_ai_ci",
                                                             "utf8mb4_general_ci")
REPLAY = [  # (database to USE, statement, the example it makes)
    ("inventory", "INSERT INTO customers VALUES (1004, 'Anne', 'Kretchmar', "
                  "'annek@noanswer.org')", "insert"),
    ("inventory", "UPDATE customers SET first_name = 'Anne Marie' WHERE id = 1004", "update"),
    ("inventory", "DELETE FROM customers WHERE id = 1004", "delete"),
    # MariaDB has no utf8mb4_0900_ai_ci (a MySQL 8 collation): the one statement run
    # differently from the seed's; its message must then carry this text.
    ("", CREATE_DATABASE, "create database"),
    ("dip_test", EXAMPLES["create table"]["sql"], "create table"),
    ("test", EXAMPLES["alter table"]["sql"], "alter table"),
    ("", EXAMPLES["drop table"]["sql"], "drop table"),
    ("testDB", EXAMPLES["rename table"]["sql"], "rename table"),
    ("", EXAMPLES["drop database"]["sql"], "drop database"),
]
VOLATILE = ("es", "ts", "TIME", "BINLOG_NAME", "BINLOG_POS", "GLOBAL_ID")


def _without(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in VOLATILE}
    if out.get("sql") == EXAMPLES["create database"]["sql"]:
        out["sql"] = CREATE_DATABASE
    return out


def _run(source: Source, database: str, statement: str) -> None:
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            if database:
                cur.execute(f"USE `{database}`")
            cur.execute(statement)
        conn.commit()
    finally:
        conn.close()


async def test_seed_002_examples_replayed_give_the_same_messages(
        tmp_path, source: Source, users_file: str, kafka_broker):
    source.execute("DROP DATABASE IF EXISTS dip_test", *SETUP)
    source.execute("FLUSH BINARY LOGS")  # the seed's first position is on a fresh binlog
    fresh = str(source.query("SHOW MASTER STATUS")[0][0])
    start = source.gtid_state()
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         source={"start_gtid": str(start)},
                         kafka=kafka_section(kafka_broker, source, format="dip", partitions=1,
                                             time_zone="Asia/Shanghai"))
    running = await start_service(config)
    try:
        for database, statement, _ in REPLAY:
            _run(source, database, statement)
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
        source.execute("DROP DATABASE IF EXISTS inventory", "DROP DATABASE IF EXISTS test",
                       "DROP DATABASE IF EXISTS `testDB`")

    topics = {"insert": "inventory.customers", "update": "inventory.customers",
              "delete": "inventory.customers", "create database": "dip_test",
              "create table": "dip_test.customers", "alter table": "test.user",
              "drop table": "dip_test.customers", "rename table": "testDB.t_test",
              "drop database": "dip_test"}
    received: dict[str, list[dict[str, Any]]] = {}
    for topic in sorted(set(topics.values())):
        received[topic] = [json.loads(m.value) for m in await raw_messages(kafka_broker, topic)]
    gtid_events = _gtid_event_starts(source)
    for _, _, example in REPLAY:
        expected = EXAMPLES[example]
        ours = next((m for m in received[topics[example]]
                     if m.get("TYPE", m.get("type")) == expected.get("TYPE", expected.get("type"))
                     and m.get("sql") == _without(expected).get("sql")), None)
        assert ours is not None, (example, json.dumps(received[topics[example]]))
        assert list(ours) == list(expected), example  # the same keys, in the same order
        assert _without(ours) == _without(expected), example
        if "BINLOG_POS" in ours:  # the transaction's start, as SHOW BINLOG EVENTS lists it
            assert (ours["BINLOG_NAME"], ours["BINLOG_POS"]) in gtid_events, example
            assert len(ours["TIME"]) == 14 and ours["GLOBAL_ID"].count("-") == 2
        else:
            assert ours["es"] == ours["ts"] and len(str(ours["es"])) == 10  # seconds
    # The insert is the fresh binlog's first transaction (the seed's 154 on MySQL 5.7).
    first = received["inventory.customers"][0]
    assert (first["BINLOG_NAME"], first["BINLOG_POS"]) == min(
        e for e in gtid_events if e[0] == fresh)


def _gtid_event_starts(source: Source) -> set[tuple[str, int]]:
    starts = set()
    for log in source.query("SHOW BINARY LOGS"):
        starts |= {(log[0], row[1]) for row in source.query(f"SHOW BINLOG EVENTS IN '{log[0]}'")
                   if row[2] == "Gtid"}
    return starts
