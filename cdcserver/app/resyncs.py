"""Quarantined tables back in the stream: resyncs asked for by the service itself, with
backoff, and by ``cdcserver resync db.table`` (a request file in ``state/resync/``).

A table is quarantined when one of its changes cannot be stored exactly (the store's
module says when). The repair stage resyncs it (``cdcserver/reread/repair.py``): it reads
the table at a watermark, in the columns the source gives it there, and when the stream
reaches the watermark releases it with a ``resync`` version holding the difference between
what the stream had and the table. Whether the cause is gone can only be told by trying, so
the service tries 2 s after the quarantine, then after 10 s, 30 s, 1 and 2 minutes, then every
5 minutes; a request file makes it try at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable

from cdcserver.core.durable import write_atomically
from cdcserver.core.names import TableName
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir

log = logging.getLogger(__name__)

DELAYS = (2.0, 10.0, 30.0, 60.0, 120.0, 300.0)  # before each try; the last one repeats
POLL = 1.0  # seconds between looks at the request files

# asks the repair stage to resync a table; False when it cannot now (no pipeline, or one runs)
Request = Callable[[TableName, str], bool]


def ask(data_dir: str, table: TableName) -> str:
    """Ask the service that writes ``data_dir`` to resync ``table`` now (it does at its
    next look, within a second, or when it starts). Returns the request file's path."""
    layout = DataDir(data_dir)
    os.makedirs(layout.resync_requests, exist_ok=True)
    path = layout.resync_request(table)
    write_atomically(path, json.dumps({"database": table.database,
                                       "table": table.table}).encode() + b"\n")
    return path


class ResyncScheduler:
    def __init__(self, catalog: Catalog, data_dir: str, request: Request) -> None:
        self.catalog = catalog
        self.layout = DataDir(data_dir)
        self.request = request
        self._tries: dict[TableName, tuple[int, float]] = {}  # tries so far, next one at

    async def run(self) -> None:
        """Until cancelled: a look at every quarantine change, and every second."""
        while True:
            self.tick(time.monotonic())
            changed = asyncio.shield(self.catalog.quarantine_changed())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed, POLL)

    def tick(self, now: float) -> None:
        asked = self._requests()
        for table in list(self._tries):
            if table not in self.catalog.quarantined:
                del self._tries[table]  # released (or dropped): a new quarantine starts over
        for table, why in self.catalog.quarantined.items():
            tries, due = self._tries.setdefault(table, (0, now + DELAYS[0]))
            if table not in asked and now < due:
                continue
            if self.request(table, why.cause):
                log.info("%s: resyncing (%s)", table, "asked" if table in asked else
                         f"try {tries + 1}")
                delay = DELAYS[min(tries + 1, len(DELAYS) - 1)]
                self._tries[table] = (tries + 1, now + delay)
            if table in asked:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(asked[table])

    def _requests(self) -> dict[TableName, str]:
        """The tables ``cdcserver resync`` asked for (a request for a table that is not
        quarantined is answered by removing it: there is nothing to do)."""
        found: dict[TableName, str] = {}
        try:
            names = os.listdir(self.layout.resync_requests)
        except FileNotFoundError:
            return found
        for name in names:
            if not name.endswith(".request"):
                continue
            path = os.path.join(self.layout.resync_requests, name)
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                table = TableName(str(data["database"]), str(data["table"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written (a temporary file), or not a request
            if table in self.catalog.quarantined:
                found[table] = path
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return found
