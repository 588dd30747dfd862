"""The dump-then-follow property in a loop: ``CDC_DUMP_SOAK=N bash tests/run.sh
tests/server/test_dump_soak.py`` runs it N times (skipped otherwise), over table sizes,
chunk sizes, reader counts and writer seeds, each a chunked dump under concurrent inserts,
updates (of the key too) and deletes, then the stream after it, rebuilt and compared with
``SELECT``. A failure names its case; rerun it alone with ``-k``.

Issue 48 asked whether a deleted row once left in a rebuilt stream was a lost delete at a
chunk boundary: 700 runs here (240 of them beside ``stress-ng --cpu 2``) reproduced no
such thing, and found a dump that chased a table growing at the end of its key (fixed: the
last range ends at the table's last key when the dump begins)."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest

from cdcserver.core.config import DumpConfig, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpOptions, dump_tables
from mariadb_cdc_client import SyncCdcClient
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER
from tests.server.test_dump import Writer, _follow_until, _loaded, _orders, _table_rows

pytestmark = [pytest.mark.mariadb, pytest.mark.skipif(
    not os.environ.get("CDC_DUMP_SOAK"), reason="a soak: CDC_DUMP_SOAK=N runs it N times")]

RUNS = int(os.environ.get("CDC_DUMP_SOAK") or 0)
COMBOS = [(20000, chunk, readers) for chunk in (50, 200, 777, 3000)
          for readers in (1, 2, 3, 4, 8)] + \
    [(2500, chunk, readers) for chunk in (3, 7, 50) for readers in (1, 2, 4)]
CASES = [(rows, chunk, readers, seed)
         for seed, (rows, chunk, readers) in zip(range(RUNS), itertools.cycle(COMBOS))]


@pytest.mark.parametrize("rows,chunk,readers,seed", CASES)
async def test_dump_then_follow_is_the_table(cdc: RunningService, source: Source, rows: int,
                                             chunk: int, readers: int, seed: int):
    table = _orders(source, rows)
    with Writer(source, table, rows, seed=seed) as writer:
        await asyncio.to_thread(writer.enough.wait, 30)  # writes before and during the dump
        results = await asyncio.to_thread(
            dump_tables, parse_source_url(source.url), cdc.service.config.store.data_dir,
            [TableName(source.database, "orders")],
            DumpOptions(DumpConfig(chunk_rows=chunk, readers=readers)))
        writer.transactions = 0
        writer.enough.clear()
        await asyncio.to_thread(writer.enough.wait, 30)  # and after it
    sentinel = 10_000_000
    source.execute(f"INSERT INTO {table} (id, name) VALUES ({sentinel}, 'the end')")
    await cdc.caught_up(source)
    image: dict[tuple[Any, ...], dict[str, Any]] = {}
    client = SyncCdcClient(cdc.host, cdc.port, USER, PASSWORD)
    await asyncio.to_thread(_follow_until, client, f"{source.database}.orders", image,
                            sentinel)
    got, want = _loaded(image), _table_rows(source, table)
    assert got == want, (results[0].info.path, sorted(set(got) - set(want))[:10],
                         sorted(set(want) - set(got))[:10],
                         [k for k in want if k in got and got[k] != want[k]][:10])
