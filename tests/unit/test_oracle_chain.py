"""The test oracle (tests/oracle.py) rebuilds a table down a chain of thousands of renames
without Python's recursion (a soak swaps tables that often; the oracle used to raise
RecursionError there), and a bounded read lasts to the server's end line however long the
server pauses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.oracle import read_stream, rebuild

DEPTH = 3000


def _schema(table: str, gtid: str, **ddl: str) -> dict[str, Any]:
    return {"database": "db", "table": table, "gtid": gtid, "ddl": ddl,
            "fields": [{"name": n} for n in ("domain", "server_id", "sequence",
                                              "event_number", "timestamp", "event_type",
                                              "id", "v")],
            "primary_key": ["id"]}


def test_a_table_renamed_thousands_of_times_keeps_its_first_rows():
    names = [f"a{i}" for i in range(DEPTH)] + ["t"]
    streams: dict[str, list[dict[str, Any]]] = {}
    for i, name in enumerate(names):
        lines = [_schema(name, f"0-1-{i}", kind="create",
                         **({"renamed_from": f"db.{names[i - 1]}"} if i else {}))]
        if i == 0:
            lines.append({"event_type": "insert", "id": 1, "v": "first"})
        if i + 1 < len(names):
            lines.append(_schema(name, f"0-1-{i + 1}", kind="drop",
                                 renamed_to=f"db.{names[i + 1]}"))
        streams[f"db.{name}"] = lines
    rebuilt = rebuild(streams["db.t"], ("id",), streams)
    assert rebuilt.rows == {(1,): {"id": 1, "v": "first"}}


async def _serving(lines: list[bytes], pause: float) -> tuple[asyncio.Server, int]:
    """A server on 127.0.0.1 port 0 that takes the login and REGISTER, then sends ``lines``
    after a pause longer than any quiet time, and closes."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)  # the login (a single write with no newline)
        writer.write(b"OK\n")
        await reader.readline()
        writer.write(b"OK\n")
        await reader.readline()  # REQUEST-DATA ... UNTIL ...
        writer.write(lines[0])
        await asyncio.sleep(pause)
        writer.writelines(lines[1:])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_bounded_read_waits_out_a_pause_and_a_cut_one_fails():
    """A busy machine paused one soak's stream for longer than the oracle's quiet time: the
    read stopped early, a rename's origin lost its past, and the audit reported deletes of
    rows the stream never held. Bounded by ``UNTIL``, a read lasts to the end line."""
    schema = json.dumps(_schema("t", "0-1-1", kind="create")).encode() + b"\n"
    record = b'{"event_type": "insert", "id": 1, "v": "x"}\n'
    server, port = await _serving([schema, record, b'{"end": "0-1-1", "records": 1}\n'], 1.5)
    async with server:
        lines = await read_stream(port, "db.t", user="u", password="p", quiet=0.5,
                                  until="0-1-1")
    assert [line.get("event_type") for line in lines] == [None, "insert"]
    server, port = await _serving([schema, record], 0.1)  # closed with no end line: cut
    async with server:
        with pytest.raises(AssertionError, match="without its end line"):
            await read_stream(port, "db.t", user="u", password="p", until="0-1-1")


def test_a_stream_value_not_of_the_columns_type_is_a_difference_not_a_failure():
    """Soak seed 95001: a stream row held text in a column the table types INT; the oracle
    raised ValueError and the soak stopped, instead of reporting the row."""
    from tests.oracle import Rebuilt, compare

    stream = Rebuilt(("id",))
    stream.rows[(1,)] = {"id": 1, "n": "v855é"}
    comparison = compare(stream, [{"id": 1, "n": 7}], {"id": "int", "n": "int"})
    assert not comparison.equal and len(comparison.different) == 1
