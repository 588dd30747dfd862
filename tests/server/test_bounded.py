"""Bounded reads (``REQUEST-DATA … [AFTER s] UNTIL s`` and ``QUERY-STATE``): the protocol
extension a reader that works in ranges (the Spark source) stands on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mariadb_cdc_client import ranges
from mariadb_cdc_client.sync import SyncCdcConnection
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, eventually
from tests.oracle import read_stream

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


@pytest.mark.parametrize("empty", ["TRUNCATE TABLE {t}", "RENAME TABLE {t} TO {t}2",
                                   "ALTER TABLE {t} ADD COLUMN x INT"])
async def test_a_version_with_no_records_does_not_end_the_range(
        cdc: RunningService, source: Source, empty: str):
    """A table whose first versions hold no record (created, then truncated, renamed away
    and back, or altered before its first row): a bounded read sends every version and the
    records after them, as the unbounded stream does. (The running service indexes a block
    for each of these versions; the next test is the index a restart leaves, which ended
    the range.)"""
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)", empty.format(t=t))
    if "RENAME" in empty:
        source.execute(f"RENAME TABLE {t}2 TO {t}")
    source.execute(f"ALTER TABLE {t} ADD COLUMN w INT", f"INSERT INTO {t} (id, v) VALUES (2, 2)")
    await cdc.caught_up(source)
    state = await _state(cdc)
    bounded = await _bounded(cdc, f"REQUEST-DATA {source.database}.t UNTIL {state}")
    whole = await read_stream(cdc.port, f"{source.database}.t", user=USER, password=PASSWORD)

    def outline(lines: list[dict[str, Any]]) -> list[Any]:
        return [line["version"] if "fields" in line else (line["event_type"], line["id"])
                for line in lines]

    assert outline(bounded[:-1]) == outline(whole)
    assert outline(whole)[-1] == ("insert", 2)
    assert bounded[-1] == {"end": state, "records": len(_records(whole))}


async def test_a_range_goes_past_a_version_a_restart_left_without_an_index_block(
        tmp_path, source: Source, users_file: str):
    """The case the chaos run met (seed 20261128): a table renamed away, the service started
    again (its recovery cuts the table's newest version back to the checkpoint, and with it
    the index's block for that empty version), the table renamed back and written. The
    range ended at the empty version: the row after it was never sent, and the end line
    said the range was complete."""
    t = f"`{source.database}`.t"
    config = make_config(str(tmp_path / "data"), source.url, users_file)
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                       f"RENAME TABLE {t} TO {t}2")
        await running.caught_up(source)
    finally:
        await running.stop()
    running = await start_service(config)
    try:
        source.execute(f"RENAME TABLE {t}2 TO {t}", f"ALTER TABLE {t} ADD COLUMN w INT",
                       f"INSERT INTO {t} (id, v) VALUES (1, 1)")
        await running.caught_up(source)
        state = await _state(running)
        bounded = await _bounded(running, f"REQUEST-DATA {source.database}.t UNTIL {state}")
        assert [r["id"] for r in _records(bounded)] == [1], bounded
        assert bounded[-1] == {"end": state, "records": 1}
    finally:
        await running.stop()


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


def _read_avro(port: int, table: str, after: str, until: str) -> list[Any]:
    """A bounded read in AVRO mode through the client's range reader: schemas and records."""
    conn = SyncCdcConnection.open("127.0.0.1", port, USER, PASSWORD, format="AVRO")
    try:
        return list(ranges.read(conn, table, ranges.Position(after), ranges.Position(until)))
    finally:
        conn.close()


async def test_an_avro_range_holds_what_the_json_range_holds(cdc: RunningService,
                                                             source: Source):
    """AVRO mode copies the blocks the index proves inside the range and re-encodes the
    ones at its edges: with ~300 KB stored (several index entries), every cut is exact."""
    db, t = source.database, f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, body TEXT, at DATETIME)")
    states = []
    for txn in range(40):
        source.execute(f"INSERT INTO {t} VALUES " + ",".join(
            f"({txn * 10 + i}, REPEAT('x', 700), '2024-01-0{1 + i % 9} 10:00:00')"
            for i in range(10)))
        states.append(str(source.gtid_state()))
    source.execute(f"ALTER TABLE {t} ADD COLUMN w INT", f"INSERT INTO {t} VALUES (1000, 'y', "
                   "NULL, 1)", f"UPDATE {t} SET w = 2 WHERE id < 3")
    await cdc.caught_up(source)
    end = str(source.gtid_state())
    for after, until in [("", states[0]), ("", states[5]), (states[5], states[33]),
                         (states[33], end), (states[39], end), (end, end)]:
        request = f"REQUEST-DATA {db}.t" + (f" AFTER {after}" if after else "") + \
            f" UNTIL {until}"
        expected = _records(await _bounded(cdc, request))
        got = await asyncio.to_thread(_read_avro, cdc.port, f"{db}.t", after, until)
        records = [r for r in got if isinstance(r, dict)]
        key = ("sequence", "event_number", "event_type", "id")
        assert [tuple(r[k] for k in key) for r in records] == \
            [tuple(e[k] for k in key) for e in expected], (after, until)
        assert [r["at"].isoformat(" ") if r["at"] else None for r in records] == \
            [e["at"] for e in expected]
        versions = [item.avsc["version"] for item in got if isinstance(item, ranges.Schema)]
        assert versions == ([] if after == until else [1, 2] if until == end else [1])
    assert expected == [] and records == []  # (end, end): nothing, and not an error


async def test_ranges_of_at_most_n_events_cut_big_transactions_exactly(
        cdc: RunningService, source: Source):
    db, t = source.database, f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {t} VALUES " + ",".join(f"({i}, 0)" for i in range(7)),
                   f"INSERT INTO {t} VALUES (100, 0)",
                   f"UPDATE {t} SET v = 1 WHERE id < 5")  # 10 events
    await cdc.caught_up(source)
    everything = _records(await _bounded(cdc, f"REQUEST-DATA {db}.t UNTIL "
                                              f"{source.gtid_state()}"))

    def read_in_ranges(limit: int) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        start = ranges.Position()
        query = SyncCdcConnection.open("127.0.0.1", cdc.port, USER, PASSWORD)
        try:
            while True:
                end, _ = ranges.plan(query, f"{db}.t", start, limit)
                if end == start:
                    return records
                got = [r for r in _read_avro_range(cdc.port, f"{db}.t", start, end)]
                assert len(got) <= limit
                records += got
                start = end
        finally:
            query.close()

    for limit in (1, 3, 4, 100):
        records = await asyncio.to_thread(read_in_ranges, limit)
        assert [(r["sequence"], r["event_number"]) for r in records] == \
            [(e["sequence"], e["event_number"]) for e in everything], limit


def _read_avro_range(port: int, table: str, start: ranges.Position, end: ranges.Position
                     ) -> list[dict[str, Any]]:
    conn = SyncCdcConnection.open("127.0.0.1", port, USER, PASSWORD, format="AVRO")
    try:
        return [r for r in ranges.read(conn, table, start, end) if isinstance(r, dict)]
    finally:
        conn.close()


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
    # AFTER already past UNTIL: nothing, and the end keeps AFTER (a reader's position never
    # goes back)
    assert await _query(cdc, f"QUERY-RANGE {db}.t AFTER {after_u} UNTIL {after_first} "
                             "LIMIT 100") == {"end": after_u, "events": 0, "next": None}
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


async def test_a_client_that_shuts_down_its_sending_side_gets_the_whole_range(
        cdc: RunningService, source: Source):
    """``nc -N`` sends the request and the end of its input: a bounded read goes on to its
    end line, here waiting for transactions not written yet when the input ended (a live
    stream ends there, as MaxScale's does)."""
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1)")
    await cdc.caught_up(source)
    now = source.gtid_state()
    domain, server, sequence = str(now).split(",")[0].split("-")
    until = f"{domain}-{server}-{int(sequence) + 2}"  # two transactions from now
    client = await RawClient.connect(cdc.port)
    await client.login("JSON")
    await client.send(f"REQUEST-DATA {source.database}.t UNTIL {until}".encode())
    client.writer.write_eof()
    await asyncio.sleep(0.5)  # the server reads the end of the input, then the rows come
    source.execute(f"INSERT INTO {t} VALUES (2)", f"INSERT INTO {t} VALUES (3)")
    lines = [json.loads(line) for line in (await client.closed(timeout=30)).splitlines()]
    assert [r["id"] for r in _records(lines)] == [1, 2, 3]
    assert lines[-1] == {"end": until, "records": 3}

    live = await RawClient.connect(cdc.port)
    await live.login("JSON")
    await live.send(f"REQUEST-DATA {source.database}.t".encode())
    live.writer.write_eof()
    await live.closed(timeout=30)  # ends, whatever it sent before it read the end


async def test_a_half_closed_bounded_read_waiting_for_the_future_ends_at_the_idle_timeout(
        tmp_path, source: Source, users_file: str):
    """A client that sent a range ending far in the future and the end of its input (or
    went away: the two look alike until something is written) holds its session as long
    as an idle one may, not for ever."""
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         listener={"idle_timeout": 1.0})
    running = await start_service(config)
    try:
        t = f"`{source.database}`.t"
        source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1)")
        await running.caught_up(source)
        client = await RawClient.connect(running.port)
        await client.login("JSON")
        await client.send(f"REQUEST-DATA {source.database}.t UNTIL 0-1-999999999".encode())
        client.writer.write_eof()
        rest = await client.closed(timeout=30)
        assert b'"end"' not in rest  # not the range's end: it never came
        server = running.service.listener.server
        await eventually(lambda: asyncio.sleep(0.1, server.sessions()), lambda s: s == [],
                         timeout=10, what="the session to end")
    finally:
        await running.stop()
