"""A full data directory: replication pauses without corrupting anything, clients are still
served, and replication resumes, losing and duplicating nothing, once there is room.

The data directory is a real, small tmpfs (mounting one needs root, which the suite's machines
give; elsewhere the test is skipped and says so)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import fastavro
import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from tests.conftest import Source, make_config, start_service
from tests.helpers import RawClient, fill, small_tmpfs
from tests.server.test_probes import fetch_probe

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

SIZE_MIB = 64


@pytest.fixture
def small_disk(tmp_path) -> Iterator[str]:
    with small_tmpfs(str(tmp_path / "data"), f"{SIZE_MIB}m") as mount_point:
        yield mount_point


async def test_a_full_disk_pauses_replication_and_loses_nothing(small_disk: str,
                                                                 source: Source,
                                                                 users_file: str):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, body TEXT)",
                   f"INSERT INTO {table} VALUES (1, 'before')")
    config = make_config(small_disk, source.url, users_file,
                         store={"disk_full_retry": 0.1})
    cdc = await start_service(config)
    try:
        await cdc.caught_up(source)
        ballast = os.path.join(small_disk, "ballast")
        await asyncio.to_thread(fill, ballast)

        for i in range(2, 62):  # 60 transactions of 60 KB: far more than is left
            source.execute(f"INSERT INTO {table} VALUES ({i}, REPEAT('x', 60000))")
        while not cdc.service.replication.runner.paused:
            await asyncio.wait({cdc.task}, timeout=0.05)
            assert not cdc.task.done(), "the service stopped instead of pausing"
        assert "paused" in cdc.service.replication.runner.paused
        status, doc = await fetch_probe(cdc, "/ready")  # live, and says why it is not ready
        assert status == 503 and doc["reason"] == "paused" and "No space" in doc["message"]
        assert (await fetch_probe(cdc, "/live"))[0] == 200

        # Serving continues from what was committed.
        client = await RawClient.connect(cdc.port)
        await client.login()
        await client.send(f"REQUEST-DATA {source.database}.t\n".encode())
        assert (await client.json_line())["table"] == "t"
        assert (await client.json_line())["body"] == "before"
        await client.close()

        os.unlink(ballast)  # room again
        await cdc.caught_up(source, timeout=120)
        assert not cdc.service.replication.runner.paused
    finally:
        await cdc.stop()

    report = await asyncio.to_thread(verify_table, parse_source_url(source.url), small_disk,
                                     TableName(source.database, "t"))
    assert report.ok and report.duplicates == 0, "\n".join(report.lines())
    assert report.source_rows == report.stream_rows == 61
    for name in os.listdir(os.path.join(small_disk, "avro")):
        if name.endswith(".avro"):
            with open(os.path.join(small_disk, "avro", name), "rb") as f:
                assert sum(1 for _ in fastavro.reader(f)) > 0
