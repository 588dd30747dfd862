"""Tables a new ``[capture]`` configuration brings in: each gets a dump at once.

A table that the filters left out until this start has no stream before it: its rows reach
consumers through a dump, after which its stream continues exact (the dump-then-follow
contract, ``REQUEST-DUMP db.table FOLLOW``). So at each start the service compares the
filters with those it recorded (``state/capture.json``), finds the source's tables captured
now and not before, and owes each a dump; the record keeps what is owed, with when, until a
dump of the table taken since exists. A kill before then owes them still, and the next start
asks again (an interrupted dump resumes). A directory without a record was written before
the filters existed, when everything but the system schemas was captured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import pymysql

from cdcserver.core.capture import CaptureFilter
from cdcserver.core.captureconfig import CaptureConfig
from cdcserver.core.config import SourceAddress
from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import CdcError
from cdcserver.core.names import TableName
from cdcserver.core.retry import Backoff
from cdcserver.dump.files import list_dumps
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.replication.selection import capture_selection
from cdcserver.store.layout import DataDir

log = logging.getLogger(__name__)


@dataclass
class CaptureRecord:
    """The filters of the last start, and the dumps still owed (table -> since, epoch s)."""

    include: str = ""
    exclude: str = ""
    system_tables: str = ""
    owed: dict[TableName, float] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str, current: CaptureConfig) -> CaptureRecord:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:  # before the filters: every table but the system schemas'
            return cls(system_tables=current.system_tables)
        owed = {TableName(str(d), str(t)): float(since) for d, t, since in data.get("owed", [])}
        return cls(str(data.get("include", "")), str(data.get("exclude", "")),
                   str(data.get("system_tables", "")), owed)

    def save(self, path: str) -> None:
        write_atomically(path, json.dumps(
            {"include": self.include, "exclude": self.exclude,
             "system_tables": self.system_tables,
             "owed": [[t.database, t.table, since] for t, since in self.owed.items()]},
            ensure_ascii=False).encode() + b"\n")

    def capture(self) -> CaptureFilter:
        return CaptureFilter.parse(self.system_tables, self.include, self.exclude)


class NewlyIncluded:
    def __init__(self, config: CaptureConfig, address: SourceAddress, data_dir: str,
                 scheduler: DumpScheduler, poll: float = 1.0) -> None:
        self.config = config
        self.address = address
        self.data_dir = data_dir
        self.path = DataDir(data_dir).capture
        self.scheduler = scheduler
        self.poll = poll

    async def run(self, replicating: asyncio.Event) -> None:
        """Owe and ask for the dumps, then wait for them, keeping the record true."""
        await replicating.wait()  # a chunked dump needs the store to follow the source
        backoff = Backoff()
        while True:
            try:
                record = await asyncio.to_thread(self._owe)
                break
            except (CdcError, pymysql.MySQLError, OSError) as exc:
                delay = backoff.failed()
                log.warning("capture: cannot list the source's tables to find those newly "
                            "included (%s); trying again in %.0f s", exc, delay)
                await asyncio.sleep(delay)
        backoff = Backoff(first=1.0, maximum=60.0)
        while record.owed:
            # Those not being dumped, seen before the dumps are listed: a dump is in place
            # before its table leaves the scheduler's list, so one that landed in between is
            # listed, settled, and not asked for a second time.
            idle = [t for t in record.owed if t not in self.scheduler.progress or
                    self.scheduler.progress[t].state == "failed"]
            try:
                record = await asyncio.to_thread(self._settle, record)
                backoff.connected()
            except OSError as exc:  # a full or failing disk: the record is written later
                delay = backoff.failed()
                log.warning("capture: cannot record which newly included tables were dumped "
                            "(%s); trying again in %.0f s", exc, delay)
                self.scheduler.request(idle)
                await asyncio.sleep(delay)
                continue
            self.scheduler.request([t for t in idle if t in record.owed])
            await asyncio.sleep(self.poll)

    def _owe(self) -> CaptureRecord:
        before = CaptureRecord.load(self.path, self.config)
        now = CaptureFilter.of(self.config)
        record = CaptureRecord(self.config.include, self.config.exclude,
                               self.config.system_tables, dict(before.owed))
        changed = (before.include, before.exclude, before.system_tables) != \
            (record.include, record.exclude, record.system_tables)
        if changed:
            previously = before.capture()
            fresh = [t for t in capture_selection(self.address, now).captured
                     if not previously.captures_table(t)]
            for table in fresh:
                record.owed.setdefault(table, time.time())
            if fresh:
                log.warning("capture: %d tables newly included (%s); each gets a dump now, "
                            "its stream follows it", len(fresh),
                            ", ".join(str(t) for t in fresh[:10]))
        record.owed = {t: since for t, since in record.owed.items() if now.captures_table(t)}
        record.save(self.path)
        return record

    def _settle(self, record: CaptureRecord) -> CaptureRecord:
        """Without the tables dumped since they were owed."""
        done = [t for t, since in record.owed.items()
                if any(d.modified >= since for d in list_dumps(self.data_dir, t))]
        if done:
            settled = CaptureRecord(record.include, record.exclude, record.system_tables,
                                    {t: s for t, s in record.owed.items() if t not in done})
            settled.save(self.path)  # (refused: the record stays as it was, owing them)
            log.info("capture: dumped %s, newly included", ", ".join(map(str, done)))
            return settled
        return record
