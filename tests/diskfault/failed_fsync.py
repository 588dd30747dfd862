"""Run under the shim by ``tests/server/test_disk_faults.py``: a store whose fsync failed once
writes nothing more, above all no checkpoint, even once fsyncs work again (after a failed
fsync the kernel may have dropped the pages: a later fsync would "succeed" without them).

Prints one word a step: ``damaged`` (the flush raised StoreDamaged), ``refused`` (a write or
flush afterwards raised it too), and ``kept`` when the checkpoint on disk is still the one
before the failure. Usage: ``python -m tests.diskfault.failed_fsync DATA_DIR CONTROL``.
"""

from __future__ import annotations

import asyncio
import sys

from cdcserver.core.changes import ColumnDef, Rows, RowsKind, TableLayout
from cdcserver.core.errors import StoreDamaged
from cdcserver.mariadb.constants import ColumnType
from cdcserver.store import checkpoint as ckpt
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore
from tests.diskfault import CONTROL_SIZE
from tests.unit.test_store import _Feed

LAYOUT = TableLayout("db", "t", (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))


def _set(control: str, fault: str) -> None:
    with open(control, "r+b") as f:
        f.write(fault.encode().ljust(CONTROL_SIZE))


async def main(path: str, control: str) -> None:
    store = AvroStore(path, Catalog(DataDir(path).avro))
    store.open()
    feed = _Feed()
    await store.apply(feed.transaction(Rows(LAYOUT, RowsKind.INSERT, 0, [(1,)])))  # type: ignore[arg-type]
    await store.flush()
    before = store.durable
    await store.apply(feed.transaction(Rows(LAYOUT, RowsKind.INSERT, 0, [(2,)])))  # type: ignore[arg-type]
    _set(control, "eio-fsync")
    try:
        await store.flush()
    except StoreDamaged:
        print("damaged")
    _set(control, "off")
    for step in (lambda: store.apply(feed.transaction(
            Rows(LAYOUT, RowsKind.INSERT, 0, [(3,)]))), store.flush):  # type: ignore[arg-type]
        try:
            await step()
        except StoreDamaged:
            print("refused")
    store.close()
    loaded = ckpt.load(DataDir(path).checkpoint)
    if loaded is not None and loaded.position == before:
        print("kept")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
