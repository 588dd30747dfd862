"""The client library (async and blocking) and the ``cdc`` command, against the real service."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import os
import subprocess
import sys
from decimal import Decimal

import fastavro
import pytest

from mariadb_cdc_client import CdcClient, ChangeRecord, ProtocolError, SchemaChange, SyncCdcClient
from mariadb_cdc_client.cli import main as cdc_main
from mariadb_cdc_client.format.wire import Code
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER

pytestmark = pytest.mark.mariadb


def _fill(source: Source, count: int = 5) -> str:
    table = f"`{source.database}`.accounts"
    source.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, owner VARCHAR(50), balance DECIMAL(12,3), "
        "opened DATE)",
        *(f"INSERT INTO {table} VALUES ({i}, 'owner {i}', {i}.125, '2020-01-0{i}')"
          for i in range(1, count + 1)))
    return f"{source.database}.accounts"


@pytest.mark.parametrize("fmt", ["JSON", "AVRO"])
async def test_async_client_yields_typed_records(cdc: RunningService, source: Source, fmt: str):
    name = _fill(source)
    await cdc.caught_up(source)
    events = []
    async with CdcClient("127.0.0.1", cdc.port, USER, PASSWORD, format=fmt) as client:
        async for event in client.stream(name):
            events.append(event)
            if len(events) == 6:
                break
    assert isinstance(events[0], SchemaChange) and events[0].version == 1
    assert [c.column for c in events[0].columns] == ["id", "owner", "balance", "opened"]
    first = events[1]
    assert isinstance(first, ChangeRecord) and first.event_type == "insert"
    assert first.values == {"id": 1, "owner": "owner 1", "balance": Decimal("1.125"),
                            "opened": dt.date(2020, 1, 1)}
    assert first.gtid.startswith("0-1-")


async def test_async_client_resumes_after_a_dropped_connection(cdc: RunningService,
                                                                source: Source):
    name = _fill(source, 3)
    await cdc.caught_up(source)
    received: list[int] = []
    schemas = 0
    async with CdcClient("127.0.0.1", cdc.port, USER, PASSWORD,
                         retry_delays=(0.05,)) as client:
        stream = client.stream(name)
        async for event in stream:
            if isinstance(event, SchemaChange):
                schemas += 1
                continue
            received.append(event.values["id"])
            if len(received) == 2:
                # Drop every client connection on the server side, mid-stream.
                for task in list(cdc.service.listener.server._connections):  # type: ignore[union-attr]
                    task.cancel()
            if len(received) == 3:
                source.execute(f"INSERT INTO `{source.database}`.accounts VALUES "
                               "(4, 'late', 0, '2021-01-01')")
            if len(received) == 4:
                break
    assert received == [1, 2, 3, 4]
    assert schemas == 1


async def test_async_client_errors(cdc: RunningService, source: Source):
    _fill(source, 1)
    await cdc.caught_up(source)
    bad = CdcClient("127.0.0.1", cdc.port, USER, "wrong")
    with pytest.raises(ProtocolError) as wrong_password:
        await bad.last_transaction()
    assert wrong_password.value.code == Code.AUTH_FAILED
    client = CdcClient("127.0.0.1", cdc.port, USER, PASSWORD)
    with pytest.raises(ProtocolError) as no_table:
        async for _ in client.stream(f"{source.database}.missing"):
            pass
    assert no_table.value.code == Code.NO_FILE
    last = await client.last_transaction()
    assert await client.transaction(last["GTID"]) == last


async def test_sync_client_reads_until_idle(cdc: RunningService, source: Source):
    name = _fill(source, 4)
    await cdc.caught_up(source)

    def read() -> list[ChangeRecord]:  # blocking client, in a thread: the service runs here
        with SyncCdcClient("127.0.0.1", cdc.port, USER, PASSWORD, format="AVRO") as client:
            return [e for e in client.stream(name, idle_timeout=1)
                    if isinstance(e, ChangeRecord)]

    records = await asyncio.to_thread(read)
    assert [r.values["id"] for r in records] == [1, 2, 3, 4]
    assert records[3].values["balance"] == Decimal("4.125")


async def test_cdc_command_prints_the_stream_like_cdc_py(cdc: RunningService, source: Source,
                                                         capfdbinary: pytest.CaptureFixture):
    name = _fill(source, 2)
    await cdc.caught_up(source)
    argv = ["-h", "127.0.0.1", "-P", str(cdc.port), "-u", USER, "-p", PASSWORD, "-t", "1", name]
    assert await asyncio.to_thread(cdc_main, argv) == 0
    lines = capfdbinary.readouterr().out.splitlines()
    assert json.loads(lines[0])["table"] == "accounts"
    assert [json.loads(line)["id"] for line in lines[1:]] == [1, 2]

    assert await asyncio.to_thread(cdc_main, ["-f", "AVRO", *argv]) == 0
    records = list(fastavro.reader(io.BytesIO(capfdbinary.readouterr().out)))
    assert [r["id"] for r in records] == [1, 2]

    missing = ["-h", "127.0.0.1", "-P", str(cdc.port), "-u", USER, "-p", PASSWORD, "-t", "1",
               f"{source.database}.nothere"]
    assert await asyncio.to_thread(cdc_main, missing) == 1
    assert capfdbinary.readouterr().err.startswith(b"ERR NO-FILE")


async def test_cdc_command_queries_and_auth_string(cdc: RunningService, source: Source,
                                                   capsys: pytest.CaptureFixture[str]):
    _fill(source, 1)
    await cdc.caught_up(source)
    options = ["-h", "127.0.0.1", "-P", str(cdc.port), "-u", USER, "-p", PASSWORD]
    assert await asyncio.to_thread(cdc_main, ["last-transaction", *options]) == 0
    last = json.loads(capsys.readouterr().out)
    assert last["events"] == 1
    assert cdc_main(["auth-string", "-u", "foobar", "-p", "foopasswd"]) == 0
    # The worked example from MaxScale's protocol notes.
    assert capsys.readouterr().out.strip() == \
        "666f6f6261723a96c86eb4479c9e3142111cf29d931bcddf248783"


def test_cdc_entry_point_is_installed():
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cdc"), "--help"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "DATABASE.TABLE" in result.stdout
