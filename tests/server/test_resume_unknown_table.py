"""A client streaming a table through a restart of the service that has not replayed the
table's creation yet: the service started over from a checkpoint before it (here: none at
all, ``--flush-interval`` an hour), so until its replay creates the table again it answers
``NO-FILE``. The client library asks again (``client/reconnect.py``) and goes on from where
it was, every row once: the table's ids, read back from the stream, are 1 to 100 in order.

The source is stopped while the service restarts, so the window in which the table is
unknown lasts until it is started again (without that, the replay recreates it in
milliseconds and the client may never be told ``NO-FILE``). How many tries such a table
gets is the unit tests' (tests/unit/test_reconnect_no_file.py); here it is raised, so the
test does not depend on how fast a loaded machine restarts MariaDB."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator

import pytest

from mariadb_cdc_client import reconnect
from tests import chaos
from tests.apache_kafka import free_port
from tests.conftest import Source
from tests.faultsoak import LedgerReader
from tests.helpers import PASSWORD, USER, until

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]


@pytest.fixture
def restartable(source: Source) -> Iterator[Source]:
    yield source
    if source.server.process is None:  # stopped by the test: running for the next
        source.server.start()


async def test_a_table_the_restarted_service_has_not_replayed_yet_is_asked_for_again(
        tmp_path, restartable: Source, users_file: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture):
    source = restartable
    monkeypatch.setattr(reconnect, "NO_FILE_RETRIES", 10_000)
    caplog.set_level(logging.WARNING, logger="mariadb_cdc_client")
    port = free_port()
    args = chaos.service_args(source.url, str(tmp_path / "data"), users_file, 7301)
    args[args.index("127.0.0.1:0")] = f"127.0.0.1:{port}"  # the client's, across the restart
    args[args.index("--flush-interval") + 1] = "3600"  # no checkpoint after the start
    service = chaos.Service(args, os.path.join(tmp_path, "service.log"))
    table = f"`{source.database}`.late"
    reader = None
    try:
        service.start()
        await asyncio.to_thread(service.wait_ready)
        source.execute(f"USE `{source.database}`", f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                       f"INSERT INTO {table} SELECT seq FROM seq_1_to_50")
        conn = source.server.connect(source.database)
        try:
            assert await asyncio.to_thread(chaos.caught_up, service, conn, 60)
        finally:
            conn.close()
        reader = LedgerReader(port, f"{source.database}.late", USER, PASSWORD)
        assert await asyncio.to_thread(reader.until, 50, 60), (reader.ids, reader.error)
        await asyncio.to_thread(service.kill)
        await asyncio.to_thread(source.server.stop)
        service.start()
        await asyncio.to_thread(service.wait_ready)
        await until(lambda: "NO-FILE" in caplog.text or reader.error is not None, 60,
                    "the client told NO-FILE")
        assert reader.error is None, reader.error
        await asyncio.to_thread(source.server.start)
        source.execute(f"USE `{source.database}`",
                       f"INSERT INTO {table} SELECT seq FROM seq_51_to_100")
        assert await asyncio.to_thread(reader.until, 100, 120), (reader.ids, reader.error,
                                                                  service.text()[-3000:])
        assert reader.ids == list(range(1, 101))
    finally:
        if reader is not None:
            reader.abandon()
        if service.exited() is None:
            service.kill()
