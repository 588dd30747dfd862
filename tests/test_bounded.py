"""Bounded reads (``REQUEST-DATA … [AFTER s] UNTIL s`` and ``QUERY-STATE``): the protocol
extension a reader that works in ranges (the Spark source) stands on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import RawClient

pytestmark = pytest.mark.mariadb


async def _state(cdc: RunningService) -> str:
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(b"QUERY-STATE")
    state: str = (await client.json_line())["gtid_state"]
    await client.close()
    return state


async def _bounded(cdc: RunningService, request: str) -> list[dict[str, Any]]:
    """Every line of a bounded read, up to the server closing the connection."""
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(request.encode())
    rest = await client.closed(timeout=30)
    return [json.loads(line) for line in rest.splitlines()]


def _records(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "event_type" in line]


async def test_a_range_holds_exactly_its_transactions_and_ends_with_a_count(
        cdc: RunningService, source: Source):
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {t} VALUES (1, 1)")
    await cdc.caught_up(source)
    first = await _state(cdc)
    assert first == str(source.gtid_state())
    source.execute(f"INSERT INTO {t} VALUES (2, 2)", f"UPDATE {t} SET v = 3 WHERE id = 1",
                   f"ALTER TABLE {t} ADD COLUMN w INT", f"INSERT INTO {t} VALUES (3, 3, 3)")
    await cdc.caught_up(source)
    second = await _state(cdc)
    source.execute(f"INSERT INTO {t} VALUES (4, 4, 4)")  # after the range
    await cdc.caught_up(source)

    head = await _bounded(cdc, f"REQUEST-DATA {source.database}.t UNTIL {first}")
    assert [r["id"] for r in _records(head)] == [1]
    assert head[-1] == {"end": first, "records": 1}

    middle = await _bounded(cdc, f"REQUEST-DATA {source.database}.t AFTER {first} "
                                 f"UNTIL {second}")
    records = _records(middle)
    assert [(r["event_type"], r["id"]) for r in records] == [
        ("insert", 2), ("update_before", 1), ("update_after", 1), ("insert", 3)]
    assert records[-1]["w"] == 3
    schemas = [line for line in middle if "fields" in line]
    assert [s["version"] for s in schemas] == [1, 2]  # the schema change, in band
    assert middle[-1] == {"end": second, "records": 4}

    empty = await _bounded(cdc, f"REQUEST-DATA {source.database}.t AFTER {second} "
                                f"UNTIL {second}")
    assert _records(empty) == [] and empty[-1] == {"end": second, "records": 0}


async def test_a_range_not_yet_stored_is_waited_for(cdc: RunningService, source: Source):
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1)")
    await cdc.caught_up(source)
    now = source.gtid_state()
    domain, server, sequence = str(now).split("-")
    ahead = f"{domain}-{server}-{int(sequence) + 1}"
    reading = asyncio.create_task(
        _bounded(cdc, f"REQUEST-DATA {source.database}.t AFTER {now} UNTIL {ahead}"))
    source.execute(f"INSERT INTO {t} VALUES (2)")
    lines = await reading
    assert [r["id"] for r in _records(lines)] == [2] and lines[-1]["records"] == 1


@pytest.mark.parametrize("request_line, code", [
    ("REQUEST-DATA {db}.t UNTIL nonsense", "BAD-SYNTAX"),
    ("REQUEST-DATA {db}.t AFTER 0-1-1 UNTIL", "BAD-SYNTAX"),
    ("QUERY-STATE now", "BAD-SYNTAX"),
])
async def test_bad_bounded_requests_are_clear_errors(cdc: RunningService, source: Source,
                                                     request_line: str, code: str):
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.t VALUES (1)")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(request_line.format(db=source.database).encode())
    assert (await client.line()).decode().startswith(f"ERR {code} ")
    await client.close()


async def test_until_needs_json(cdc: RunningService, source: Source):
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.t VALUES (1)")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    await client.login("AVRO")
    await client.send(f"REQUEST-DATA {source.database}.t UNTIL {source.gtid_state()}".encode())
    assert (await client.line()).startswith(b"ERR BAD-SYNTAX UNTIL needs TYPE=JSON")
    await client.close()


async def _query(cdc: RunningService, line: str) -> dict[str, Any]:
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(line.encode())
    reply = await client.json_line()
    await client.close()
    return reply


async def test_query_range_plans_ranges_of_at_most_n_events_from_the_transaction_log(
        cdc: RunningService, source: Source):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                   f"CREATE TABLE `{db}`.u (id INT PRIMARY KEY)")
    start = str(source.gtid_state())
    source.execute(f"INSERT INTO `{db}`.t VALUES (1), (2), (3)",  # 3 events
                   f"INSERT INTO `{db}`.u VALUES (1)",  # another table: no events for t
                   f"INSERT INTO `{db}`.t VALUES (4), (5)")  # 2 events
    after_first = f"0-1-{int(start.split('-')[2]) + 1}"
    after_u = f"0-1-{int(start.split('-')[2]) + 2}"
    source.execute(f"INSERT INTO `{db}`.t VALUES " + ",".join(f"({i})" for i in range(6, 16)))
    await cdc.caught_up(source)
    stored = str(source.gtid_state())

    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {start} LIMIT 4") == {
        "end": after_u, "events": 3, "next": {"gtid": _next(after_u), "events": 2}}
    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {start} LIMIT 5") == {
        "end": _next(after_u), "events": 5, "next": {"gtid": stored, "events": 10}}
    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {_next(after_u)} LIMIT 9") == {
        "end": _next(after_u), "events": 0, "next": {"gtid": stored, "events": 10}}
    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {start} LIMIT 100") == {
        "end": stored, "events": 15, "next": None}
    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {start} UNTIL {after_first} "
                             "LIMIT 100") == {"end": after_first, "events": 3, "next": None}
    # a bounded read up to a planned end holds what the plan counted
    lines = await _bounded(cdc, f"REQUEST-DATA {db}.t AFTER {start} UNTIL {_next(after_u)}")
    assert [r["id"] for r in _records(lines)] == [1, 2, 3, 4, 5]


def _next(gtid: str) -> str:
    domain, server, sequence = gtid.split("-")
    return f"{domain}-{server}-{int(sequence) + 1}"


async def test_list_tables_gives_every_version_schema(cdc: RunningService, source: Source):
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1)",
                   f"ALTER TABLE {t} ADD COLUMN v INT", f"INSERT INTO {t} VALUES (2, 2)")
    await cdc.caught_up(source)
    listed = (await _query(cdc, "LIST-TABLES"))["tables"]
    mine = [t for t in listed if t["database"] == source.database]
    assert [(t["table"], [v["version"] for v in t["versions"]]) for t in mine] == \
        [("t", [1, 2])]
    assert [f["name"] for f in mine[0]["versions"][1]["fields"]][-2:] == ["id", "v"]
    assert mine[0]["versions"][1]["primary_key"] == ["id"]


@pytest.mark.parametrize("line", ["QUERY-RANGE db.t LIMIT 0", "QUERY-RANGE db.t LIMIT x",
                                  "QUERY-RANGE db.t AFTER nonsense LIMIT 5",
                                  "QUERY-RANGE db.t AFTER 0-1-1 AFTER 0-1-2 LIMIT 5",
                                  "QUERY-RANGE db.t", "LIST-TABLES db"])
async def test_bad_range_queries_are_clear_errors(cdc: RunningService, line: str):
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(line.encode())
    assert (await client.line()).startswith(b"ERR BAD-SYNTAX ")
    await client.close()
