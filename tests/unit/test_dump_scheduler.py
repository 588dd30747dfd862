"""The service's dump scheduler when a requested pass fails before it reads a row."""

from __future__ import annotations

import asyncio

from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.store.catalog import Catalog
from tests.helpers import eventually


async def test_a_dump_asked_for_while_the_source_is_unreachable_fails_and_may_be_asked_again(
        tmp_path):
    """Nothing listens on port 1: the pass fails at the source's row estimate, before its
    tables run. They stayed listed queued for ever, so that every later START-DUMP of them
    was answered "under way" and none was ever taken, until the service restarted."""
    unreachable = parse_source_url("mysql://cdc@127.0.0.1:1")
    scheduler = DumpScheduler(DumpConfig(), unreachable, str(tmp_path / "data"),
                              Catalog(str(tmp_path / "data" / "avro")))
    table = TableName("db", "t")
    serving = asyncio.create_task(scheduler.serve())
    try:
        assert scheduler.request([table]) == [table]

        async def listed() -> list[dict[str, object]]:
            return scheduler.listed()

        (entry,) = await eventually(listed, lambda found: found[0]["state"] != "queued",
                                    what="the pass to end")
        assert entry["state"] == "failed" and "127.0.0.1:1" in str(entry["error"]), entry
        assert scheduler.request([table]) == [table]  # asked for again: queued again
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
