"""The cleaner: retention for dumps and for old table versions.

Dumps: per table, at most ``dumps_keep`` (newest first), none older than ``dumps_max_age``,
and the oldest go first while all dumps together exceed ``dumps_max_bytes``. The newest dump
of each table is always kept: it is what a new client starts from.

Table versions: a version may go only when newer dumps replace it, that is when every kept
dump of the table was taken in a later version (``stream_version``): every record of the old
version precedes those dumps' snapshots, so a client starting from any of them never needs
it. Such
versions go when older than ``versions_max_age``, and oldest first while the Avro files exceed
``versions_max_bytes``. Without limits (the default) nothing is deleted.

A file in use (being sent to a client, or streamed) is skipped and deleted on a later run;
the cleaner runs every ``interval``, right after each pass of dumps (a client that asks for
dumps without end keeps a table to ``dumps_keep``, not one more per request) and right
after each dump transfer ends. Deleting a version
removes it from the catalog first, under the file's exclusive lock, so no stream starts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdcserver.core.config import RetentionConfig
from cdcserver.core.names import TableName
from cdcserver.dump.files import DumpInfo, list_dumps
from cdcserver.store.catalog import Catalog, VersionInfo
from cdcserver.store.index import StoreIndex
from cdcserver.store.inuse import delete_unless_in_use

log = logging.getLogger(__name__)


@dataclass
class CleanReport:
    deleted: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)  # due, but skipped: retried later


def expired_dumps(dumps: list[DumpInfo], policy: RetentionConfig, now: float
                  ) -> list[DumpInfo]:
    """The dumps the policy deletes, oldest first."""
    by_table: dict[TableName, list[DumpInfo]] = {}
    for dump in dumps:
        by_table.setdefault(dump.table, []).append(dump)
    doomed: dict[str, DumpInfo] = {}
    survivors: list[DumpInfo] = []
    for table_dumps in by_table.values():
        *older, newest = table_dumps  # list_dumps gives them oldest first
        for i, dump in enumerate(reversed(older), start=2):
            too_many = policy.dumps_keep > 0 and i > policy.dumps_keep
            too_old = policy.dumps_max_age > 0 and now - dump.modified > policy.dumps_max_age
            if too_many or too_old:
                doomed[dump.name] = dump
            else:
                survivors.append(dump)
        survivors.append(newest)
    if policy.dumps_max_bytes > 0:
        total = sum(d.size for d in survivors)
        newest_names = {ds[-1].name for ds in by_table.values()}
        for dump in sorted(survivors, key=lambda d: d.modified):
            if total <= policy.dumps_max_bytes:
                break
            if dump.name not in newest_names:
                doomed[dump.name] = dump
                total -= dump.size
    return sorted(doomed.values(), key=lambda d: d.modified)


def expired_versions(catalog: Catalog, dumps: list[DumpInfo], policy: RetentionConfig,
                     now: float) -> list[VersionInfo]:
    """The table versions the policy deletes, oldest first (``dumps``: the dumps kept)."""
    if policy.versions_max_age <= 0 and policy.versions_max_bytes <= 0:
        return []
    floor: dict[TableName, int] = {}  # the oldest version a kept dump continues in
    for dump in dumps:
        floor[dump.table] = min(floor.get(dump.table, dump.header.stream_version),
                                dump.header.stream_version)
    replaced = []
    for name, entry in catalog.tables.items():
        latest = entry.latest()
        for info in entry.versions.values():
            if info is not latest and info.sealed and info.version < floor.get(name, 0):
                replaced.append(info)
    replaced.sort(key=_mtime)
    doomed = {id(v): v for v in replaced
              if policy.versions_max_age > 0 and now - _mtime(v) > policy.versions_max_age}
    if policy.versions_max_bytes > 0:
        total = sum(v.committed for e in catalog.tables.values() for v in e.versions.values())
        total -= sum(v.committed for v in doomed.values())
        for info in replaced:
            if total <= policy.versions_max_bytes:
                break
            if id(info) not in doomed:
                doomed[id(info)] = info
                total -= info.committed
    return sorted(doomed.values(), key=_mtime)


def _mtime(info: VersionInfo) -> float:
    try:
        return os.path.getmtime(info.path)
    except FileNotFoundError:
        return 0.0


class Cleaner:
    def __init__(self, policy: RetentionConfig, data_dir: str, catalog: Catalog,
                 index: Callable[[], StoreIndex | None]) -> None:
        self.policy = policy
        self.data_dir = data_dir
        self.catalog = catalog
        self.index = index
        self._wake = asyncio.Event()
        self._pass = asyncio.Lock()  # one pass at a time: the timer's and an operator's
        self.runs = 0
        self.deleted = 0  # files deleted since start
        self._undropped: set[tuple[TableName, int]] = set()  # their index entries left

    def wake(self) -> None:
        """Run soon (a dump transfer just released its file)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.clean()
            except Exception:  # the cleaner must outlive any one failure (logged)
                log.exception("cleaner failed; it runs again in %.0fs", self.policy.interval)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
            # that arrives as the wake-up does, and the service's stop would wait a whole
            # interval for the cleaner.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.policy.interval):
                    await self._wake.wait()

    async def clean(self) -> CleanReport:
        async with self._pass:
            return await self._clean()

    async def _clean(self) -> CleanReport:
        report = CleanReport()
        self._drop_index_entries()
        now = time.time()
        dumps = await asyncio.to_thread(list_dumps, self.data_dir)
        for dump in expired_dumps(dumps, self.policy, now):
            deleted = await asyncio.to_thread(delete_unless_in_use, dump.path)
            (report.deleted if deleted else report.in_use).append(dump.name)
        kept = [d for d in dumps if d.name not in report.deleted]
        for info in expired_versions(self.catalog, kept, self.policy, now):
            if self._delete_version(info):
                report.deleted.append(os.path.basename(info.path))
            else:
                report.in_use.append(os.path.basename(info.path))
        self.runs += 1
        self.deleted += len(report.deleted)
        if report.deleted:
            log.info("cleaner: deleted %s", ", ".join(report.deleted))
        if report.in_use:
            log.info("cleaner: in use, deleted later: %s", ", ".join(report.in_use))
        return report

    def _delete_version(self, info: VersionInfo) -> bool:
        def forget() -> None:
            self.catalog.remove_version(info.table, info.version)

        if not delete_unless_in_use(info.path, forget):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(info.path[: -len(".avro")] + ".avsc")
        self._undropped.add((info.table, info.version))
        self._drop_index_entries()
        return True

    def _drop_index_entries(self) -> None:
        """The index entries of the versions deleted, after their files: on a full disk
        SQLite has no room for its journal, and the space the files give back is what
        retention is for then; entries it cannot drop yet (dead weight, never read) are
        dropped at a later pass."""
        index = self.index()
        if index is None:
            return
        for table, version in list(self._undropped):
            try:
                index.drop_version(table, version)
            except sqlite3.OperationalError as exc:
                log.warning("cleaner: the index entries of %s version %d stay until the next "
                            "pass: %s", table, version, exc)
                return
            self._undropped.discard((table, version))
