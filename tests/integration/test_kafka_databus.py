"""mysql-databus's messages (seed 001), read by a consumer built only from the seed's structs.

The service runs with ``--kafka-format databus`` and nothing else about Kafka but the broker:
the default layout must be what mysql-databus's SDK reads (one topic, partition 0). The
strict consumer (``tests/databus_consumer.py``, Go's encoding/json rules) decodes every
message, rebuilds the table the way the seed's ``Do()`` applies RowsEvents, and the result
must equal ``SELECT`` on the source, value for value in go-mysql's text (ENUM as its index,
SET as its bitmask, DECIMAL at its scale). Each key's ``Pos`` must be where its transaction
starts: what ``SHOW MASTER STATUS`` said before it, a GTID event in ``SHOW BINLOG EVENTS``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.names import TableName
from cdcserver.dump.databus import NoDefinition, databus_lines
from cdcserver.dump.dumper import DumpOptions, dump_tables
from cdcserver.sinks.kafka.sink import KafkaSink
from mariadb_cdc_client.kafka import KafkaChangeReader
from tests import databus_consumer as databus
from tests.conftest import Source, make_config, start_service
from tests.helpers import RawClient
from tests.integration.test_kafka import kafka_caught_up, raw_messages

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


def _event_starts(source: Source) -> dict[tuple[str, int], str]:
    starts = {}
    for log in source.query("SHOW BINARY LOGS"):
        for row in source.query(f"SHOW BINLOG EVENTS IN '{log[0]}'"):
            starts[(str(log[0]), int(row[1]))] = str(row[2])
    return starts


async def test_a_databus_consumer_rebuilds_the_table_from_the_default_topic(
        tmp_path, source: Source, users_file: str, kafka_broker):
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka={"bootstrap": kafka_broker.bootstrap, "format": "databus",
                                "schema_topic": f"{db}.schemas",
                                "state_topic": f"{db}.state"})
    running = await start_service(config)
    t = f"`{db}`.items"
    # Each transaction's GTID -> where SHOW MASTER STATUS said the binlog was before it: the
    # position mysql-databus's SDK is given and searches the keys for.
    master_before: dict[str, tuple[str, int]] = {}
    try:
        for statements in (
                [f"CREATE TABLE {t} (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(20), "
                 "price DECIMAL(8,2), size ENUM('s','m','l'), tags SET('new','sale','eco'), "
                 "at DATETIME(3), raw BLOB, UNIQUE KEY (name), KEY by_size (size, price))"],
                [f"INSERT INTO {t} VALUES (1, 'pen', 1.50, 'm', 'new,eco', "
                 "'2024-01-02 03:04:05.6', x'00ff'), (2, 'ink', 12.00, 's', '', NULL, NULL), "
                 "(3, 'pad', NULL, NULL, 'sale', NULL, '')"],
                [f"UPDATE {t} SET price = price * 2, tags = 'sale,eco' WHERE id IN (1, 2)"],
                [f"DELETE FROM {t} WHERE id = 3"],
                [f"ALTER TABLE {t} ADD COLUMN note TEXT"],
                [f"USE `{db}`", "CREATE INDEX ix_at ON items (at)"],
                [f"INSERT INTO {t} (id, name, note) VALUES (4, 'cup', 'après')"],
                [f"RENAME TABLE {t} TO `{db}`.goods"], [f"RENAME TABLE `{db}`.goods TO {t}"],
                [f"CREATE DATABASE `{db}_other`"], [f"DROP DATABASE `{db}_other`"]):
            file, pos = source.query("SHOW MASTER STATUS")[0][:2]
            source.execute(*statements)
            gtid = str(source.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
            master_before[gtid] = (str(file), int(pos))
        await kafka_caught_up(running, source)
    finally:
        await running.stop()

    messages = await raw_messages(kafka_broker, "databus")
    assert {m.partition for m in messages} == {0}  # one topic, partition 0
    starts = _event_starts(source)
    replica = databus.Replica()
    ours = checked = 0
    mine = []
    for m in messages:
        key = databus.decode_key(m.key)
        value_table = (databus.decode_query_event(m.value) if key.action == "DDL"
                       else databus.decode_rows_event(m.value)).table
        assert value_table is not None  # never null: the SDK reads Table.Schema
        if not value_table.schema.startswith(db):
            continue  # another test's messages on the shared topic
        ours += 1
        # Pos is where the transaction starts (its GTID event), as SHOW MASTER STATUS said
        # (the fixture's CREATE DATABASE ran before this test could ask)
        before = master_before.get(json.loads(m.key)["GTID"])
        assert before is None or (key.pos.name, key.pos.pos) == before
        checked += before is not None
        assert starts[(key.pos.name, key.pos.pos)] == "Gtid"
        replica.apply(key, m.value)
        mine.append((m.key, m.value))
    # One message per row event: the 3-row insert and the 2-row update are one each.
    # and CREATE TABLE, ALTER TABLE, CREATE INDEX, two RENAMEs, CREATE/DROP DATABASE (the
    # consumers refuse an Action that is not one of mysql-databus's: a RENAME is an "alter")
    assert replica.events == 4 and ours == 4 + 8 and checked == ours - 1
    assert any(s.startswith("ALTER TABLE") for s in replica.statements)
    assert sum(s.startswith("RENAME TABLE") for s in replica.statements) == 2
    # Query runs as it is: the table it names carries its database ("schema wrapped in").
    assert f"CREATE INDEX ix_at ON `{db}`.items (at)" in replica.statements
    rows = source.query(f"SELECT CAST(id AS CHAR), name, CAST(price AS CHAR), size + 0, "
                        f"tags + 0, CAST(at AS CHAR), raw, note FROM {t}")
    expected = {(row[0],): [None if v is None else v if isinstance(v, bytes) else str(v)
                            for v in row] for row in rows}
    # Rows written before the ALTER have no note: the QueryEvent, run on the target, adds
    # the column as NULL.
    rebuilt = {k: [v.encode("utf-8", "surrogateescape") if i == 6 and v is not None else v
                   for i, v in enumerate(row)] + [None] * (8 - len(row))
               for k, row in replica.rows.items()}
    assert rebuilt == expected
    go_rows, go_events = _go_consumer(tmp_path, mine)
    assert go_events == 4
    assert go_rows == [[None if v is None else v.encode("utf-8", "surrogateescape").hex()
                        for v in row] for _, row in sorted(replica.rows.items())]

    # The table as go-mysql's schema.Table describes it, read from the server itself:
    # SHOW FULL COLUMNS' Type and Extra, SHOW INDEX's keys in order.
    table = replica.table
    assert table is not None
    columns = source.query(f"SHOW FULL COLUMNS FROM {t}")
    assert [(c.name, c.raw_type, c.is_auto) for c in table.columns] == [
        (str(c[0]), str(c[1]), str(c[6]) == "auto_increment") for c in columns]
    assert [c.type for c in table.columns] == [databus.go_mysql_type(str(c[1]))
                                               for c in columns]
    assert [c.type for c in table.columns] == [1, 5, 2, 3, 4, 6, 5, 5]
    shown: list[tuple[str, list[str]]] = []
    for row in source.query(f"SHOW INDEX FROM {t}"):
        if not shown or shown[-1][0] != row[2]:
            shown.append((str(row[2]), []))
        shown[-1][1].append(str(row[4]))
    assert [(i.name, i.columns) for i in table.indexes] == shown
    assert shown == [("PRIMARY", ["id"]), ("name", ["name"]), ("by_size", ["size", "price"]),
                     ("ix_at", ["at"])]
    assert table.pk_columns == [0]


async def test_a_databus_consumer_loads_the_dump_then_kafka_after_its_position(
        tmp_path, source: Source, users_file: str, kafka_broker):
    """The seed's initial load: the dump, served in the seed's layout (every line a RowsEvent
    with its Table), then the Kafka messages from the dump's binlog position on."""
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka={"bootstrap": kafka_broker.bootstrap, "format": "databus",
                                "schema_topic": f"{db}.schemas",
                                "state_topic": f"{db}.state"})
    running = await start_service(config)
    t = f"`{db}`.items"
    try:
        source.execute(
            f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(8,2), "
            "size ENUM('s','m','l'), tags SET('new','sale','eco'), raw BLOB)",
            *(f"INSERT INTO {t} VALUES ({i}, 'n{i}', {i}.5, '{'sml'[i % 3]}', "
              f"'{['', 'new', 'sale,eco'][i % 3]}', x'{i:02x}00')" for i in range(1, 8)))
        await kafka_caught_up(running, source)
        (result,) = await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                                            config.store.data_dir, [TableName(db, "items")],
                                            DumpOptions(DumpConfig(batch_rows=3)))
        source.execute(f"UPDATE {t} SET size = 'l', tags = 'new,eco' WHERE id <= 2",
                       f"DELETE FROM {t} WHERE id = 3",
                       f"INSERT INTO {t} VALUES (9, 'late', 0.10, 'm', 'sale', NULL)")
        await kafka_caught_up(running, source)
        client = await RawClient.connect(running.port)
        await client.login()
        await client.send(f"REQUEST-DUMP {db}.items DATABUS FOLLOW\n".encode())
        assert (await client.line()).startswith(b"ERR BAD-SYNTAX DATABUS and FOLLOW")
        await client.send(b"LIST-DUMPS\n")
        (listed,) = (await client.json_line())["dumps"]
        await client.send(f"REQUEST-DUMP {db}.items DATABUS\n".encode())
        ok, size, name = (await client.line()).split()
        assert ok == b"OK" and name.decode() == listed["name"]
        dump = await client.read_exactly(int(size))
        await client.close()
    finally:
        await running.stop()

    replica = databus.Replica()
    lines = dump.splitlines()
    assert len(lines) == 3  # 7 rows in batches of 3: every line a RowsEvent, no header
    for line in lines:
        event = databus.decode_rows_event(line)
        assert event.table is not None and event.table.name == "items"
        assert event.action == "insert"
        replica.apply(databus.KafkaKey(databus.Position("", 0), "DML"), line)
    after = (listed["binlog"]["file"], listed["binlog"]["pos"])
    followed = []
    for m in await raw_messages(kafka_broker, "databus"):
        key = databus.decode_key(m.key)
        event = (databus.decode_query_event(m.value) if key.action == "DDL"
                 else databus.decode_rows_event(m.value))
        assert event.table is not None
        if event.table.schema == db and (key.pos.name, key.pos.pos) >= after:
            replica.apply(key, m.value)
            followed.append((m.key, m.value))
    assert replica.events == 3 + 3  # the dump's lines, then UPDATE, DELETE and INSERT
    # The first transaction after the dump starts where the dump's snapshot is: the SDK
    # finds it by an exact match of the dump's position.
    first = databus.decode_key(followed[0][0])
    assert (first.pos.name, first.pos.pos) == after
    rows = source.query(f"SELECT CAST(id AS CHAR), name, CAST(price AS CHAR), size + 0, "
                        f"tags + 0, raw FROM {t}")
    expected = {(row[0],): [None if v is None else v if isinstance(v, bytes) else str(v)
                            for v in row] for row in rows}
    rebuilt = {k: [v.encode("utf-8", "surrogateescape") if i == 5 and v is not None else v
                   for i, v in enumerate(row)] for k, row in replica.rows.items()}
    assert rebuilt == expected

    # The same, by a consumer in Go (tests/databus_go: seed 001's structs, encoding/json).
    go_rows, go_events = _go_consumer(tmp_path, [(b"", line) for line in lines] + followed)
    assert go_events == 3 + 3
    assert go_rows == sorted([[None if v is None else (v if isinstance(v, bytes) else
                                                       v.encode()).hex() for v in row]
                              for row in expected.values()],
                             key=lambda row: bytes.fromhex(row[0]).decode())

    # A dump from before dumps recorded their table's definition: a clear refusal.
    with open(result.info.path, "rb") as f:
        header = json.loads(f.readline())
        rest = f.read()
    del header["definition"]
    old = tmp_path / "old.dump"
    old.write_bytes(json.dumps(header).encode() + b"\n" + rest)
    with open(old, "rb") as f, pytest.raises(NoDefinition, match="take a new dump"):
        list(databus_lines(f))

    # With the sink's databus_labels, a dump's ENUM and SET values are labels, as in its
    # messages.
    with open(result.info.path, "rb") as f:
        labelled = [row for line in databus_lines(f, labels=True)
                    for row in json.loads(line)["Rows"]]
    text = [tuple(base64.b64decode(row[k]).decode() for k in (0, 3, 4)) for row in labelled]
    assert sorted(text) == [(str(i), "sml"[i % 3], ["", "new", "sale,eco"][i % 3])
                            for i in range(1, 8)]  # values are []byte: base64 in JSON


async def test_labels_that_are_numbers_read_back_as_labels(tmp_path, source: Source,
                                                          users_file: str, kafka_broker):
    """With ``databus_labels`` a message says its ENUM and SET values are labels (header
    ``values: labels``): the reader does not take a label '2' for the second one."""
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka={"bootstrap": kafka_broker.bootstrap, "format": "databus",
                                "schema_topic": "",
                                "state_topic": f"{db}.state", "topic": f"{db}.bus",
                                "databus_labels": True})
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE `{db}`.n (id INT PRIMARY KEY, e ENUM('2','1','x'),"
                       " s SET('4','1','2'))",
                       f"INSERT INTO `{db}`.n VALUES (1, '1', '1,2'), (2, '2', '4'),"
                       " (3, 'x', '')")
        await kafka_caught_up(running, source)
    finally:
        await running.stop()
    (message,) = [m for m in await raw_messages(kafka_broker, f"{db}.bus")
                  if b'"Rows"' in m.value]
    assert (b"values", b"labels") in [(k.encode(), v) for k, v in message.headers]
    reader = KafkaChangeReader(kafka_broker.bootstrap, [f"{db}.bus"], format="databus",
                               schema_topic="")
    rows = [c.after async for c in reader.changes(to_end=True) if c.after]
    expected = source.query(f"SELECT id, e, s FROM `{db}`.n ORDER BY id")
    assert [(r["id"], r["e"], r["s"]) for r in rows] == [tuple(r) for r in expected]


def test_a_table_topic_sends_statements_to_its_database_part(tmp_path) -> None:
    """databus sends statements to its one topic; a topic naming the table does not make a
    topic literally named after the placeholder."""
    for topic, ddl in (("cdc.{db}.{table}", "cdc.{db}"), ("{db}_{table}", "{db}"),
                       ("{table}", "{db}"), ("bus", "bus")):
        sink = KafkaSink(KafkaConfig(bootstrap="127.0.0.1:1", format="databus", topic=topic),
                         str(tmp_path), "x")
        assert sink.router.ddl_topic == ddl, topic


def _go_consumer(tmp_path, messages: list[tuple[bytes, bytes]]) -> tuple[list[Any], int]:
    """Run the Go consumer on (key, value) pairs (an empty key: a dump line); the rows it
    rebuilt (values hex, ordered by primary key) and the RowsEvents it applied. Go is
    Debian's golang-go, which tests/run.sh installs; nothing is downloaded."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("the Go consumer needs Debian's golang-go (tests/run.sh installs it)")
    env = {**os.environ, "GOCACHE": str(tmp_path / "gocache"), "GOPROXY": "off",
           "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GO111MODULE": "on"}
    stdin = b"".join(key.hex().encode() + b" " + value.hex().encode() + b"\n"
                     for key, value in messages)
    done = subprocess.run([go, "run", "."], input=stdin, capture_output=True, env=env,
                          cwd=Path(__file__).parent.parent / "databus_go", timeout=300, check=False)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    return out["Rows"], out["Events"]
