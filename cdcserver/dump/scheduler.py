"""Scheduled dumps inside the service: ``[dump] tables`` every ``[dump] interval``.

A table is due when its newest dump is ``interval`` old (or it has none), or when an
interrupted dump of it is waiting to be resumed, so a restart neither skips nor repeats a
dump. Due tables are dumped together, in one snapshot, in a worker thread; a failure (the
source is down) is logged and retried after a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import threading

from cdcserver.core.config import DumpConfig, SourceAddress
from cdcserver.core.errors import CdcError
from cdcserver.dump import files
from cdcserver.dump.dumper import DumpOptions, dump_tables, newest_versions, resolve_tables
from cdcserver.store.catalog import Catalog
from cdcserver.store.naming import TableName

log = logging.getLogger(__name__)

RETRY = 60.0


class DumpScheduler:
    def __init__(self, config: DumpConfig, address: SourceAddress, data_dir: str,
                 catalog: Catalog) -> None:
        self.config = config
        self.address = address
        self.data_dir = data_dir
        self.catalog = catalog
        self.patterns = [p.strip() for p in config.tables.split(",") if p.strip()]
        self.runs = 0
        self.running = False  # a dump is being taken

    @property
    def enabled(self) -> bool:
        return bool(self.patterns) and self.config.interval > 0

    async def run(self) -> None:
        while self.enabled:
            try:
                wait = await self.run_due()
            except CdcError as exc:
                log.warning("scheduled dump failed: %s; retrying in %.0fs", exc, RETRY)
                wait = RETRY
            except Exception:  # the schedule must outlive any one failure (logged)
                log.exception("scheduled dump failed; retrying in %.0fs", RETRY)
                wait = RETRY
            await asyncio.sleep(wait)

    async def run_due(self) -> float:
        """Dump the tables that are due; returns the seconds until the next is."""
        tables = await asyncio.to_thread(resolve_tables, self.address, self.patterns)
        now = dt.datetime.now(dt.UTC)
        due, wait = [], self.config.interval
        for table in tables:
            remaining = await asyncio.to_thread(self._remaining, table, now)
            if remaining <= 0:
                due.append(table)
            else:
                wait = min(wait, remaining)
        if due:
            options = DumpOptions(chunk_rows=self.config.chunk_rows,
                                  readers=self.config.readers,
                                  sync_seconds=self.config.sync_interval)
            versions = newest_versions(self.catalog, due)
            stop = threading.Event()
            work = asyncio.ensure_future(asyncio.to_thread(
                dump_tables, self.address, self.data_dir, due, options, versions, None, stop))
            self.running = True
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                stop.set()  # the service is stopping: leave the dump to be resumed
                with contextlib.suppress(CdcError, OSError):
                    await work
                raise
            finally:
                self.running = False
            self.runs += 1
        return max(wait, 1.0)

    def _remaining(self, table: TableName, now: dt.datetime) -> float:
        if os.path.exists(os.path.join(files.dump_dir(self.data_dir),
                                       f"{table.stem}.partial")):
            return 0.0  # an interrupted dump: resume it now
        dumps = files.list_dumps(self.data_dir, table)
        if not dumps:
            return 0.0
        created = dt.datetime.fromisoformat(dumps[-1].header.created)
        return self.config.interval - (now - created).total_seconds()
