"""Every GTID MariaDB can write (issue 35, item 4).

A domain and a server id are 32-bit unsigned numbers, a sequence number a 64-bit unsigned one:
``SET gtid_seq_no = 9223372036854775808`` made the index raise OverflowError (SQLite's signed
INTEGER) and the service exit on every restart, and clients asking for such a GTID got
``ERR INTERNAL``. Each place that holds a GTID is checked here with the largest numbers:
the stored records (JSON and AVRO), the index (GTID seeks, QUERY-TRANSACTION, QUERY-RANGE),
the checkpoint across a restart, the grammar, the client library and the Kafka keys.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from cdcserver.core.gtid import Gtid
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client.format.gtid import is_gtid, is_gtid_state, stored_metadata
from mariadb_cdc_client.format.wire import Code, ProtocolError, parse_request_data
from tests.conftest import Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, lines_until
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages

MAX32 = 4294967295
MAX64 = 18446744073709551615
HALF64 = 9223372036854775808  # 2^63: the first number SQLite's INTEGER cannot hold


def test_the_grammar_takes_every_number_mariadb_writes_and_no_larger():
    assert is_gtid(f"{MAX32}-{MAX32}-{MAX64}") and is_gtid_state(f"0-1-2,{MAX32}-1-{MAX64}")
    for bad in (f"{MAX32 + 1}-1-1", f"1-{MAX32 + 1}-1", f"1-1-{MAX64 + 1}", "1-1-٣"):
        assert not is_gtid(bad), bad
        with pytest.raises(ProtocolError) as info:
            parse_request_data(f"db.t {bad}")
        assert info.value.code == Code.BAD_SYNTAX and "not a GTID" in info.value.message
    # leading zeros, as MariaDB takes them (found by attack: 59 of them were refused)
    zeros = "0" * 59
    assert is_gtid(f"{zeros}-{zeros}1-{zeros}{MAX64}") and not is_gtid(f"1-1-{zeros}{MAX64 + 1}")
    assert Gtid.parse(f"{zeros}7-{zeros}1-{zeros}5") == Gtid(7, 1, 5)
    assert stored_metadata(MAX32, MAX32, MAX64) == (-1, -1, -1)
    assert stored_metadata(5, 7, HALF64 - 1) == (5, 7, HALF64 - 1)


def _typed(port: int, name: str) -> list[ChangeRecord]:
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, format="AVRO") as client:
        return [e for e in client.stream(name, idle_timeout=1) if isinstance(e, ChangeRecord)]


async def _command(port: int, line: str) -> bytes:
    client = await RawClient.connect(port)
    try:
        await client.login(dialect="EXACT")
        await client.send(line.encode() + b"\n")
        return await client.line()
    finally:
        await client.close()


async def _json_records(port: int, request: str, source: Source) -> list[dict[str, object]]:
    return [json.loads(line) for line in await lines_until(port, request, source.gtid_state())]


@pytest.mark.mariadb
@pytest.mark.kafka
async def test_the_largest_gtids_are_stored_served_sought_and_published(
        tmp_path, source: Source, users_file: str, kafka_broker):
    t = f"`{source.database}`.t"
    name = f"{source.database}.t"
    kafka = kafka_section(kafka_broker, source, partitions=1)
    config = make_config(str(tmp_path / "data"), source.url, users_file, kafka=kafka)
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)")
        conn = source.server.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION gtid_domain_id = {MAX32}")
                cur.execute(f"SET SESSION server_id = {MAX32}")
                cur.execute(f"SET SESSION gtid_seq_no = {MAX64 - 1}")
                cur.execute(f"INSERT INTO {t} VALUES (1)")  # MAX32-MAX32-(MAX64-1)
                cur.execute(f"INSERT INTO {t} VALUES (2)")  # ... MAX64
                cur.execute("SET SESSION gtid_domain_id = 7")
                cur.execute(f"SET SESSION gtid_seq_no = {HALF64}")
                cur.execute(f"INSERT INTO {t} VALUES (3)")  # 7-MAX32-2^63
        finally:
            conn.close()
        await running.caught_up(source)
        await kafka_caught_up(running, source)
        last = f"{MAX32}-{MAX32}-{MAX64}"
        for attempt in ("running", "restarted"):  # the index and the checkpoint, reloaded
            records = [r for r in await _json_records(running.port, f"REQUEST-DATA {name}", source)
                       if "event_type" in r]
            assert [(r["domain"], r["server_id"], r["sequence"], r["id"])
                    for r in records] == [(MAX32, MAX32, MAX64 - 1, 1), (MAX32, MAX32, MAX64, 2),
                                          (7, MAX32, HALF64, 3)], attempt
            # a GTID seek through the index, in JSON and AVRO modes
            sought = [r["id"] for r in await _json_records(running.port,
                                                           f"REQUEST-DATA {name} {last}", source)
                      if "event_type" in r]
            assert sought == [2, 3], attempt
            typed = await asyncio.to_thread(_typed, running.port, name)
            assert [(e.gtid, e.values["id"]) for e in typed] == [
                (f"{MAX32}-{MAX32}-{MAX64 - 1}", 1), (last, 2), (f"7-{MAX32}-{HALF64}", 3)]
            reply = json.loads(await _command(running.port, f"QUERY-TRANSACTION {last}"))
            assert reply["GTID"] == last and reply["tables"] == [name]
            state = json.loads(await _command(running.port, "QUERY-STATE"))
            assert f"7-{MAX32}-{HALF64}" in json.dumps(state)
            ranged = await _command(
                running.port, f"QUERY-RANGE {name} AFTER {MAX32}-{MAX32}-{MAX64 - 1} LIMIT 10")
            assert not ranged.startswith(b"ERR"), ranged
            if attempt == "running":
                await running.stop()
                running = await start_service(config)
                await running.caught_up(source)
    finally:
        if not running.task.done():
            await running.stop()
    keys = [json.loads(m.key) for m in await raw_messages(kafka_broker, name)]
    assert {k["GTID"] for k in keys} >= {f"{MAX32}-{MAX32}-{MAX64 - 1}", last,
                                         f"7-{MAX32}-{HALF64}"}
