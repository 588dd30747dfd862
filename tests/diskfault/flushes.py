"""Run under the shim (its sync log on) by ``tests/server/test_disk_faults.py``: a store that
applies and flushes a few transactions, so the test can read, from the log, the order in
which its files were synced. Usage: ``python -m tests.diskfault.flushes DATA_DIR``."""

from __future__ import annotations

import asyncio
import sys

from cdcserver.core.changes import Rows, RowsKind
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore
from tests.diskfault.failed_fsync import LAYOUT
from tests.unit.test_store import _Feed


async def main(path: str) -> None:
    store = AvroStore(path, Catalog(DataDir(path).avro))
    store.open()
    feed = _Feed()
    for key in range(1, 4):
        await store.apply(feed.transaction(Rows(LAYOUT, RowsKind.INSERT, 0, [(key,)])))  # type: ignore[arg-type]
        await store.flush()
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
