"""End to end against a real MariaDB: rows in, records out, in both formats."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import pytest

from mariadb_cdc_client.stream import AvroStreamDecoder
from tests.conftest import RunningService, Source
from tests.helpers import RawClient, records_only

pytestmark = pytest.mark.mariadb


def _orders(source: Source) -> str:
    table = f"`{source.database}`.orders"
    source.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, customer VARCHAR(40) NOT NULL, "
        "amount DECIMAL(10,2), placed DATETIME(3), note TEXT)")
    return table


async def _json_stream(cdc: RunningService, target: str, count: int,
                       gtid: str | None = None) -> list[dict]:
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(f"REQUEST-DATA {target}{' ' + gtid if gtid else ''}".encode())
    lines = [await client.json_line() for _ in range(count)]
    await client.close()
    return lines


async def test_inserts_updates_deletes_arrive_in_order_with_event_types(cdc: RunningService,
                                                                        source: Source):
    table = _orders(source)
    source.execute(
        f"INSERT INTO {table} VALUES (1, 'ada', 10.50, '2024-01-02 03:04:05.678', 'first')",
        f"INSERT INTO {table} VALUES (2, 'bob', NULL, NULL, NULL)",
        f"UPDATE {table} SET amount = amount * 2 WHERE id = 1",
        f"DELETE FROM {table} WHERE id = 2")
    await cdc.caught_up(source)
    lines = await _json_stream(cdc, f"{source.database}.orders", 6)
    schema, records = lines[0], lines[1:]
    assert schema["namespace"] == "MaxScaleChangeDataSchema.avro"
    assert schema["database"] == source.database and schema["table"] == "orders"
    assert [f["name"] for f in schema["fields"]][:6] == [
        "domain", "server_id", "sequence", "event_number", "timestamp", "event_type"]
    assert [r["event_type"] for r in records] == [
        "insert", "insert", "update_before", "update_after", "delete"]
    assert records[0]["amount"] == 10.5 and records[0]["placed"] == "2024-01-02 03:04:05.678"
    assert records[2]["amount"] == 10.5 and records[3]["amount"] == 21.0
    assert records[4]["id"] == 2 and records[4]["customer"] == "bob"
    assert [r["event_number"] for r in records] == [1, 1, 1, 2, 1]
    sequences = [r["sequence"] for r in records]
    assert sequences == sorted(sequences) and len(set(sequences)) == 4


async def test_multi_statement_transaction_shares_one_gtid(cdc: RunningService, source: Source):
    table = _orders(source)
    conn = source.server.connect()
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} (id, customer) VALUES (1, 'a'), (2, 'b')")
        cur.execute(f"UPDATE {table} SET customer = 'c' WHERE id = 2")
        cur.execute(f"INSERT INTO {table} (id, customer) VALUES (3, 'd')")
        cur.execute("COMMIT")
    conn.close()
    await cdc.caught_up(source)
    records = records_only(await _json_stream(cdc, f"{source.database}.orders", 6))
    assert len({(r["domain"], r["server_id"], r["sequence"]) for r in records}) == 1
    assert [r["event_number"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["event_type"] for r in records] == [
        "insert", "insert", "update_before", "update_after", "insert"]


async def test_alter_creates_version_two_announced_in_band(cdc: RunningService, source: Source):
    table = _orders(source)
    source.execute(f"INSERT INTO {table} (id, customer) VALUES (1, 'a')",
                   f"ALTER TABLE {table} ADD COLUMN vip BOOLEAN NOT NULL DEFAULT 0 AFTER id",
                   f"INSERT INTO {table} (id, customer, vip) VALUES (2, 'b', 1)")
    await cdc.caught_up(source)
    lines = await _json_stream(cdc, f"{source.database}.orders", 4)
    assert lines[0]["version"] == 1 and lines[2]["version"] == 2
    assert "vip" not in [f["name"] for f in lines[0]["fields"]]
    assert [f["name"] for f in lines[2]["fields"]][6:8] == ["id", "vip"]
    assert lines[1]["id"] == 1 and lines[3] | {} == lines[3] and lines[3]["vip"] == 1


async def test_live_tail_pushes_new_commits(cdc: RunningService, source: Source):
    table = _orders(source)
    source.execute(f"INSERT INTO {table} (id, customer) VALUES (1, 'a')")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(f"REQUEST-DATA {source.database}.orders".encode())
    await client.json_line()  # schema
    assert (await client.json_line())["id"] == 1
    source.execute(f"INSERT INTO {table} (id, customer) VALUES (2, 'b')")
    assert (await client.json_line(timeout=10))["id"] == 2
    await client.close()


async def test_gtid_seek_is_inclusive_in_json_mode(cdc: RunningService, source: Source):
    table = _orders(source)
    for i in range(1, 6):
        source.execute(f"INSERT INTO {table} (id, customer) VALUES ({i}, 'c{i}')")
    await cdc.caught_up(source)
    everything = records_only(await _json_stream(cdc, f"{source.database}.orders", 6))
    third = everything[2]
    gtid = f"{third['domain']}-{third['server_id']}-{third['sequence']}"
    lines = await _json_stream(cdc, f"{source.database}.orders", 4, gtid)
    assert "namespace" in lines[0]
    assert [r["id"] for r in lines[1:]] == [3, 4, 5]


async def test_avro_mode_is_a_valid_container_stream(cdc: RunningService, source: Source):
    table = _orders(source)
    source.execute(
        f"INSERT INTO {table} VALUES (1, 'ada', 10.50, '2024-01-02 03:04:05.678', 'x')",
        f"INSERT INTO {table} VALUES (2, 'bob', -3.25, NULL, NULL)")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login("AVRO")
    await client.send(f"REQUEST-DATA {source.database}.orders".encode())
    decoder = AvroStreamDecoder()
    events: list = []
    raw = bytearray()
    while len(events) < 3:
        data = await client.reader.read(65536)
        assert data
        raw += data
        events.extend(decoder.feed(data))
    await client.close()
    # The bytes are exactly an Avro container file: fastavro reads them as one.
    records = list(fastavro.reader(io.BytesIO(bytes(raw))))
    assert [r["id"] for r in records] == [1, 2]
    assert records[0]["amount"] == Decimal("10.50")
    assert records[0]["placed"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678000)
    assert events[1].values == {"id": 1, "customer": "ada", "amount": Decimal("10.50"),
                                "placed": dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "note": "x"}


async def test_avro_gtid_seek_drops_records_before_the_gtid(cdc: RunningService,
                                                           source: Source):
    table = _orders(source)
    conn = source.server.connect()
    with conn.cursor() as cur:  # two transactions in one domain, then a seek to the second
        cur.execute(f"INSERT INTO {table} (id, customer) VALUES (1, 'a'), (2, 'b')")
        cur.execute(f"INSERT INTO {table} (id, customer) VALUES (3, 'c')")
    conn.close()
    await cdc.caught_up(source)
    records = records_only(await _json_stream(cdc, f"{source.database}.orders", 4))
    gtid = f"{records[2]['domain']}-{records[2]['server_id']}-{records[2]['sequence']}"
    client = await RawClient.connect(cdc.port)
    await client.login("AVRO")
    await client.send(f"REQUEST-DATA {source.database}.orders {gtid}".encode())
    decoder = AvroStreamDecoder()
    events: list = []
    while len(events) < 2:
        events.extend(decoder.feed(await client.reader.read(65536)))
    await client.close()
    assert [e.values["id"] for e in events[1:]] == [3]


async def test_query_last_transaction_and_query_transaction(cdc: RunningService,
                                                            source: Source):
    table = _orders(source)
    source.execute(f"INSERT INTO {table} (id, customer) VALUES (1, 'a'), (2, 'b')")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login()
    await client.send(b"QUERY-LAST-TRANSACTION")
    last = await client.json_line()
    assert last["events"] == 2 and last["tables"] == [f"{source.database}.orders"]
    assert last["GTID"] == str(source.gtid_state())
    await client.send(f"QUERY-TRANSACTION {last['GTID']}".encode())
    assert await client.json_line() == last
    await client.send(b"QUERY-TRANSACTION 0-1-999999")
    assert (await client.line()).startswith(b"ERR NO-TRANSACTION")
    await client.close()
    json.dumps(last)
