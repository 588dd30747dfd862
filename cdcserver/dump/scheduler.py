"""Dumps inside the service: on a schedule, and on request while it streams.

Scheduled: ``[dump] tables`` every ``[dump] interval``. A table is due when its newest dump is
``interval`` old (or it has none), or when an interrupted dump of it is waiting to be resumed,
so a restart neither skips nor repeats a dump. Due tables are dumped in a worker thread; a
failure (the source is down) is logged and retried after a minute.

On request (``START-DUMP`` in the protocol, :meth:`DumpScheduler.request`): the tables are
queued and dumped in turn, without stopping replication. One dump pass runs at a time;
:attr:`DumpScheduler.progress` says, per table, whether it is queued, running (rows written,
rows the source estimates) or failed, for ``LIST-DUMPS`` and the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.config import DumpConfig, SourceAddress
from cdcserver.core.errors import CdcError, StoreError
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import (
    DumpOptions,
    DumpResult,
    dump_tables,
    estimate_rows,
    newest_versions,
    resolve_refs,
    resolve_tables,
)
from cdcserver.replication.sources import Sources
from cdcserver.store.catalog import Catalog
from cdcserver.store.naming import dump_stem
from mariadb_cdc_client.format.names import split_list, table_ref

log = logging.getLogger(__name__)

RETRY = 60.0


FAILED_KEPT = 600.0  # seconds a failed requested dump stays listed


@dataclass
class TableProgress:
    """A table's dump as LIST-DUMPS shows it while it is queued or running, or after it
    failed."""

    table: TableName
    state: str  # "queued", "running" or "failed"
    rows: int = 0  # written so far
    estimated_rows: int = 0  # what the source estimates the table holds (0: unknown)
    started: str = ""  # ISO 8601, UTC, once running
    error: str = ""
    ended: float = 0.0  # monotonic, once failed

    def summary(self) -> dict[str, object]:
        data: dict[str, object] = {"ref": table_ref(self.table.database, self.table.table),
                                   "database": self.table.database, "table": self.table.table,
                                   "state": self.state, "rows": self.rows,
                                   "estimated_rows": self.estimated_rows}
        if self.started:
            data["started"] = self.started
        if self.error:
            data["error"] = self.error
        return data


class DumpScheduler:
    def __init__(self, config: DumpConfig, address: SourceAddress | Sources, data_dir: str,
                 catalog: Catalog, capture: CaptureFilter = EVERY_USER_TABLE,
                 taken: Callable[[], None] | None = None) -> None:
        self.config = config
        self.taken = taken  # called after each pass that wrote dumps
        self.capture = capture
        self.sources = Sources.of(address)
        self.data_dir = data_dir
        self.catalog = catalog
        self.patterns = split_list(config.tables)
        self.runs = 0
        self.running = False  # a dump is being taken
        self.progress: dict[TableName, TableProgress] = {}
        self._progress_lock = threading.Lock()  # the dump thread writes rows
        self._requests: asyncio.Queue[list[TableName]] = asyncio.Queue()
        self._pass = asyncio.Lock()  # one dump pass at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):  # made in the service's loop: requests go there
            self._loop = asyncio.get_running_loop()

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    @property
    def enabled(self) -> bool:
        return bool(self.patterns) and self.config.interval > 0

    # -- on request ------------------------------------------------------------------------

    def request(self, tables: list[TableName]) -> list[TableName]:
        """Queue dumps of ``tables`` (from any thread); returns those queued now (a table
        already queued or running is not queued twice)."""
        if self._loop is None:  # made before the service's loop ran: asked from it now?
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()
        if self._loop is None:
            raise CdcError("the service is not taking dumps yet")
        with self._progress_lock:
            fresh = [t for t in dict.fromkeys(tables) if t not in self.progress or
                     self.progress[t].state == "failed"]
            for table in fresh:
                self.progress[table] = TableProgress(table, "queued")
        if fresh:
            self._loop.call_soon_threadsafe(self._requests.put_nowait, fresh)
        return fresh

    def resolve(self, refs: list[tuple[str, str | None]]) -> list[TableName]:
        """The base tables that ``(db, table)`` and ``(db, None)`` (every table of ``db``)
        name on the source, in the order given (blocking)."""
        return resolve_refs(self.address, refs, self.capture)

    def listed(self) -> list[dict[str, object]]:
        """The tables queued, running, or failed lately, as LIST-DUMPS shows them."""
        return [p.summary() for p in self.entries()]

    def entries(self) -> list[TableProgress]:
        """The tables queued, running, or failed lately."""
        now = time.monotonic()
        with self._progress_lock:
            for table in [t for t, p in self.progress.items()
                          if p.state == "failed" and now - p.ended > FAILED_KEPT]:
                del self.progress[table]
            return [dataclasses.replace(p) for p in self.progress.values()]

    async def serve(self) -> None:
        """Take the requested dumps, in turn, for as long as the service runs."""
        self._loop = asyncio.get_running_loop()
        while True:
            tables = await self._requests.get()
            try:
                await self._take(tables)
            except CdcError as exc:
                log.warning("requested dump failed: %s", exc)
            except Exception:  # a request must not stop the ones after it (logged)
                log.exception("requested dump failed")

    # -- on a schedule ---------------------------------------------------------------------

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
        tables = await asyncio.to_thread(resolve_tables, self.address, self.patterns,
                                         self.capture)
        now = dt.datetime.now(dt.UTC)
        due, wait = [], self.config.interval
        for table in tables:
            remaining = await asyncio.to_thread(self._remaining, table, now)
            if remaining <= 0:
                due.append(table)
            else:
                wait = min(wait, remaining)
        if due:
            await self._take(due)
        return max(wait, 1.0)

    async def _take(self, tables: list[TableName]) -> None:
        """Dump ``tables`` in a worker thread, one pass at a time; a cancelled service
        leaves the dump to be resumed. Each table is listed queued, then running until its
        own dump is in place (not until the pass ends: a table asked for again then is
        queued again); every failure of the pass, the source's estimate included, leaves
        the tables not in place listed failed, so that they may be asked for again."""
        entries = self._queued(tables)
        async with self._pass:
            self.running = True
            try:
                await self._dump(tables, entries)
            except OSError as exc:  # the dump directory's disk: full, failing, read-only
                said = _unwritable(tables, exc)
                self._failed(entries, said)
                raise StoreError(said) from exc
            except Exception as exc:
                self._failed(entries, str(exc))
                raise
            finally:
                self.running = False
                if self.taken is not None:  # (a failed pass may have written some too)
                    self.taken()
            self.runs += 1

    async def _dump(self, tables: list[TableName], entries: dict[TableName, TableProgress]) \
            -> None:
        estimates = await asyncio.to_thread(estimate_rows, self.address, tables)
        started = dt.datetime.now(dt.UTC).isoformat()
        with self._progress_lock:
            for table in tables:
                entries[table] = self.progress[table] = TableProgress(
                    table, "running", 0, estimates.get(table, 0), started)
        options = DumpOptions(self.config)
        versions = newest_versions(self.catalog, tables)
        stop = threading.Event()
        landed = functools.partial(self._landed, entries, asyncio.get_running_loop())
        work = asyncio.ensure_future(asyncio.to_thread(
            dump_tables, self.address, self.data_dir, tables, options, versions,
            self._progressed, stop, self.capture, landed))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()  # the service is stopping: leave the dump to be resumed
            with contextlib.suppress(CdcError, OSError):
                await work
            raise

    def _queued(self, tables: list[TableName]) -> dict[TableName, TableProgress]:
        """The pass's entries, listed queued while it waits for the one before it: those
        its request made, or new ones (a table failed before is queued again)."""
        with self._progress_lock:
            for table in tables:
                entry = self.progress.get(table)
                if entry is None or entry.state == "failed":
                    self.progress[table] = TableProgress(table, "queued")
            return {t: self.progress[t] for t in tables}

    def _progressed(self, table: TableName, rows: int) -> None:
        with self._progress_lock:
            entry = self.progress.get(table)
            if entry is not None:
                entry.rows = rows

    def _landed(self, entries: dict[TableName, TableProgress],
                loop: asyncio.AbstractEventLoop, result: DumpResult) -> None:
        """A table's dump is in place (called from the dump's thread): it is no longer
        taken, and the cleaner may now keep the table to its policy."""
        table = result.info.table
        with self._progress_lock:
            if self.progress.get(table) is entries.get(table):
                del self.progress[table]
        if self.taken is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the service stopped
                loop.call_soon_threadsafe(self.taken)

    def _failed(self, entries: dict[TableName, TableProgress], error: str) -> None:
        """The pass's tables still listed as its own (not landed, not asked for again)
        are listed failed."""
        with self._progress_lock:
            for table, entry in entries.items():
                if self.progress.get(table) is entry:
                    self.progress[table] = TableProgress(table, "failed", error=error,
                                                         ended=time.monotonic())

    def _remaining(self, table: TableName, now: dt.datetime) -> float:
        if os.path.exists(os.path.join(files.dump_dir(self.data_dir),
                                       f"{dump_stem(table)}.partial")):
            return 0.0  # an interrupted dump: resume it now
        dumps = files.list_dumps(self.data_dir, table)
        if not dumps:
            return 0.0
        created = dt.datetime.fromisoformat(dumps[-1].header.created)
        return self.config.interval - (now - created).total_seconds()


def _unwritable(tables: list[TableName], exc: OSError) -> str:
    """What a dump that its disk refused says, in one line."""
    refs = ", ".join(table_ref(t.database, t.table) for t in tables)
    where = f" ({exc.filename})" if exc.filename else ""
    return f"the dump of {refs} could not be written: {exc.strerror or exc}{where}"
