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
