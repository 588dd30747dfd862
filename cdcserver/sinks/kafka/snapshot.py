"""The Kafka sink's initial snapshot (``[kafka] snapshot = "initial"``): the rows each published
table holds, then its changes after them.

A sink that starts with no position at all (no ``state/kafka.json``, nothing in
``state_topic``) stays out of replication (the store goes on, which the dumps need) while
:class:`InitialSnapshot` takes each published table's dump with the service's own machinery
(:func:`cdcserver.dump.dumper.dump_tables`: chunked, so writes and an ``ALTER TABLE`` are not
blocked) and publishes its rows to the table's topic and partitions, as the format expresses a
row that exists (Debezium's read event, ``op`` "r"; an insert in the others), waiting for the
broker's acknowledgements. Each dump is the table at one point, a transaction boundary of the
binlog. Then the sink joins: its position is the earliest of those points, replication starts
over from there, and :class:`PointFilter` drops each table's changes made in a transaction
that starts before that table's own point (those are in its rows already). So a table's
changes follow its rows in every partition, none is missing and none is in both.

The points are kept in ``state/kafka-snapshot.json`` as each table's dump is taken: after a
crash during the publishing the same dumps are published again (their rows twice, at least
once), never newer ones, so a row deleted since is not left behind by a stream that starts
after its deletion; tables whose rows were all acknowledged are not published again. The file
stays after the join, so that a restart before the stream passes every point still drops
what the rows hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cdcserver.core.capture import CaptureFilter, TableSelection
from cdcserver.core.changes import Begin, Change, Ddl, Rows
from cdcserver.core.config import DumpConfig, SourceAddress
from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import BinlogPosition, GtidState, binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.chunks import service_source
from cdcserver.dump.dumper import DumpOptions, dump_tables, newest_versions
from cdcserver.messages.events import RowEvent
from cdcserver.sinks.kafka.dumpevents import DumpEvents, DumpReading, header
from cdcserver.store import checkpoint
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from mariadb_cdc_client.format.names import table_ref

log = logging.getLogger("cdcserver.sinks.kafka.sink")  # operators grep for it

WORKER_ROWS = 50_000  # a dump of at least this many rows is formatted apart (snapshotworker)
STORE_WAIT = 30.0  # seconds the first dump waits for the store to be ready for chunked dumps
SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")


@dataclass
class TablePoint:
    """Where a table's dump stands in the binlog: its rows are the table after every
    transaction before it."""

    file: str
    pos: int
    gtid: str
    dump: str = ""  # the dump file published
    published: bool = False  # every row acknowledged

    def holds(self, begin: Begin) -> bool:
        """The transaction ``begin`` starts is in the dump's rows: it starts before the
        point (a transaction boundary), by binlog position; by GTID where there is none."""
        if self.file and begin.file:
            return binlog_ordinal(begin.file, begin.pos) < binlog_ordinal(self.file, self.pos)
        return GtidState.parse(self.gtid).covers(begin.gtid)

    def position(self) -> BinlogPosition:
        return BinlogPosition(GtidState.parse(self.gtid), self.file, self.pos)


class SnapshotState:
    """``state/kafka-snapshot.json``: each table's point, and whether the sink has joined
    replication (the snapshot is over)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.points: dict[TableName, TablePoint] = {}
        self.joined = False
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return
        self.joined = bool(data.get("joined"))
        for ref, point in data.get("tables", {}).items():
            self.points[TableName.from_ref(ref)] = TablePoint(**point)

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tables = {t.ref(): asdict(p) for t, p in self.points.items()}
        write_atomically(self.path, json.dumps({"joined": self.joined,
                                                "tables": tables}).encode())

    def discard(self) -> None:
        self.points, self.joined = {}, False
        if os.path.exists(self.path):
            os.unlink(self.path)

    def earliest(self) -> BinlogPosition | None:
        points = list(self.points.values())
        if not points:
            return None
        return min(points, key=lambda p: binlog_ordinal(p.file, p.pos)).position()


class PointFilter:
    """Drops each table's rows and statements of the transactions its dump holds already."""

    def __init__(self, points: dict[TableName, TablePoint]) -> None:
        self.points = {t: p for t, p in points.items() if p.dump}
        self._begin: Begin | None = None
        self._last = max((binlog_ordinal(p.file, p.pos) for p in self.points.values()
                          if p.file), default=None)

    def __call__(self, changes: list[Change]) -> list[Change]:
        if not self.points:
            return changes
        kept: list[Change] = []
        for at, change in enumerate(changes):
            if isinstance(change, Begin):
                self._begin = change
                if self._past_every_point(change):
                    self.points = {}
                    return kept + changes[at:]
            elif self._drops(change):
                continue
            kept.append(change)
        return kept

    def _drops(self, change: Change) -> bool:
        if isinstance(change, Rows):
            return self._held(change.layout.database, change.layout.table)
        return isinstance(change, Ddl) and bool(change.changes) and all(
            self._held(c.database, c.table) for c in change.changes)

    def _held(self, database: str, table: str) -> bool:
        point = self.points.get(TableName(database, table))
        return point is not None and self._begin is not None and point.holds(self._begin)

    def _past_every_point(self, begin: Begin) -> bool:
        return self._last is not None and bool(begin.file) and \
            binlog_ordinal(begin.file, begin.pos) >= self._last and \
            all(p.file for p in self.points.values())


@dataclass
class TableProgress:
    """A table's part of the snapshot, as ``/health`` shows it."""

    table: TableName
    state: str = "waiting"  # waiting, dumping, publishing, done
    rows: int = 0  # read so far while dumping, then published
    total: int = 0  # in its dump
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"table": table_ref(self.table.database, self.table.table),
                "state": self.state, "rows": self.rows, "total": self.total,
                "seconds": round(self.seconds, 1)}


# (rows of a table's dump, each with its snapshot marker) -> published
Publish = Callable[[list[RowEvent]], Any]
# (a dump formatted apart: its rows sent, or None where the format cannot)
PublishDump = Callable[[DumpEvents, str, Callable[[int], None]], Awaitable[int | None]]


@dataclass
class Sources:
    """What the snapshot reads: the source, the data directory, the dump settings."""

    address: Callable[[], SourceAddress]
    data_dir: str
    dump: DumpConfig
    catalog: Catalog | None
    capture: CaptureFilter
    published: TableSelection
    progress: dict[TableName, TableProgress] = field(default_factory=dict)


class InitialSnapshot:
    def __init__(self, sources: Sources, state: SnapshotState, publish: Publish,
                 flushed: Callable[[], Any], batch: int = 500,
                 publish_dump: PublishDump | None = None) -> None:
        self.sources = sources
        self.state = state
        self.publish = publish  # awaitable: routes the rows to the sender
        self.flushed = flushed  # awaitable: every message sent acknowledged
        self.batch = batch
        self.publish_dump = publish_dump  # awaitable: a big table's dump, formatted apart
        self.progress = sources.progress

    async def run(self) -> BinlogPosition | None:
        """Every published table dumped (or its earlier dump taken again) and its rows
        acknowledged; the earliest point (None: no table)."""
        if self.state.joined:  # the last snapshot's, its sink's position since lost
            self.state.discard()
        await self._store_ready()
        done: set[TableName] = set()
        while True:  # tables created while the others were dumped are taken too
            tables = [t for t in await asyncio.to_thread(self._tables) if t not in done]
            if not tables:
                break
            for table in tables:
                self.progress.setdefault(table, TableProgress(table))
            for table in tables:
                await self._table(table, last=table == tables[-1])
                done.add(table)
        self.state.joined = True
        await asyncio.to_thread(self.state.save)
        return self.state.earliest()

    async def _store_ready(self) -> None:
        """Until the store has a checkpoint and has recorded the server it reads, which a
        chunked dump merges from (else it would read each table in one snapshot, holding its
        metadata lock): at most ``STORE_WAIT`` seconds (a quiet source may write nothing)."""
        layout = DataDir(self.sources.data_dir)
        deadline = time.monotonic() + STORE_WAIT

        def ready() -> bool:
            return checkpoint.load(layout.checkpoint) is not None and \
                service_source(self.sources.data_dir) is not None

        while time.monotonic() < deadline:
            if await asyncio.to_thread(ready):
                return
            await asyncio.sleep(0.2)  # (files another process may write: nothing to await)

    def _tables(self) -> list[TableName]:
        from cdcserver.replication import source as source_sql

        conn = source_sql.connect(self.sources.address())
        try:
            rows = source_sql.query(
                conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE "
                "TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
        finally:
            conn.close()
        names = [TableName(str(r[0]), str(r[1])) for r in rows
                 if str(r[0]) not in SYSTEM_SCHEMAS]
        return [t for t in names if self.sources.capture.captures(t.database, t.table)
                and self.sources.published.selects(t)]

    async def _table(self, table: TableName, last: bool) -> None:
        progress = self.progress[table]
        started = time.monotonic()
        point = self.state.points.get(table)
        if point is not None and point.published:
            progress.state, progress.rows = "done", progress.total
            return
        if point is None or not await asyncio.to_thread(os.path.exists, point.dump):
            progress.state = "dumping"
            point = await self._dump(table)
            self.state.points[table] = point
            await asyncio.to_thread(self.state.save)
        progress.state = "publishing"
        rows = await self._publish(table, point.dump, last)
        await self.flushed()
        point.published = True
        await asyncio.to_thread(self.state.save)
        progress.state, progress.seconds = "done", time.monotonic() - started
        log.info("kafka: snapshot of %s published: %d rows in %.1fs (its changes follow from "
                 "%s:%d)", table, rows, progress.seconds, point.file, point.pos)

    async def _dump(self, table: TableName) -> TablePoint:
        info = await self._dump_once(table, restart=False)
        if info.header.resumed:  # (one read in one snapshot may hold updates and deletes)
            info = await self._dump_once(table, restart=True)
        header = info.header
        return TablePoint(header.binlog_file, header.binlog_pos, header.gtid, info.path)

    async def _dump_once(self, table: TableName, restart: bool) -> files.DumpInfo:
        """The table's dump, in a thread; stopped (to be continued) if this is cancelled,
        as the service's own dumps are when it stops."""
        sources = self.sources
        versions = newest_versions(sources.catalog, [table]) if sources.catalog else {}
        stop = threading.Event()
        progress = self.progress[table]

        def read(_: TableName, rows: int) -> None:  # (from the dump's thread)
            progress.rows = rows

        work = asyncio.ensure_future(asyncio.to_thread(
            dump_tables, sources.address(), sources.data_dir, [table],
            DumpOptions(sources.dump, restart=restart), versions, read, stop,
            sources.capture))
        try:
            results = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()
            with contextlib.suppress(CdcError, OSError):
                await work
            raise
        return results[0].info

    async def _publish(self, table: TableName, path: str, last: bool) -> int:
        """The dump's rows to the sender, in batches (a big table's formatted in a process
        of its own, :mod:`.snapshotworker`); how many."""
        head = await asyncio.to_thread(header, path)
        first_table = not any(p.rows for p in self.progress.values() if p.table != table)
        dump = DumpEvents.of(table, head, first_table, last)
        progress = self.progress[table]
        progress.total, progress.rows = dump.total, 0
        if self.publish_dump is not None and dump.total >= WORKER_ROWS:
            def read(rows: int) -> None:
                progress.rows = rows

            published = await self.publish_dump(dump, path, read)
            if published is not None:
                return published
        reading = DumpReading(path)
        try:
            while True:
                block = await asyncio.to_thread(reading.next_rows, self.batch * 4)
                if block is None:
                    break
                events = dump.events(block)
                for i in range(0, len(events), self.batch):
                    await self.publish(events[i:i + self.batch])
                progress.rows = dump.number
        finally:
            reading.close()
        return dump.number
