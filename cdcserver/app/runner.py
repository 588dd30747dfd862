"""Replication from start to stop: where to start, the replicator and pipeline, retries, a full
disk.

The runner checks the source (preflight) and resolves where a new store starts, retrying while
the source does not answer (:mod:`cdcserver.app.firstsource`); opens every sink; then runs a
replicator and a pipeline from the earliest sink checkpoint until the stream ends or fails. A
full data directory pauses it: every sink drops its open transaction, and once a probe write
fits again (:mod:`cdcserver.app.diskroom`) replication starts over from what the sinks
applied. A failed disk pauses it too; once a write and an fsync work there again, run()
raises :class:`StoreDamaged` and the service starts over from its checkpoint
(:mod:`cdcserver.app.recovering`). What it is doing (:class:`State`) is readable at any
time from :meth:`stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cdcserver.app.diskroom import room_needed, until_room, until_writable
from cdcserver.app.firstsource import choose_source, retrying
from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.changes import Abort
from cdcserver.core.config import SourceAddress, SourceConfig
from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import (
    BinlogPurged,
    DiskFull,
    PublisherFenced,
    ServerIdInUse,
    SinkRewound,
    SourceUnavailable,
    StoreDamaged,
    StoreError,
)
from cdcserver.core.gtid import BinlogPosition, GtidState
from cdcserver.core.handoff import Handoff
from cdcserver.core.names import TableName
from cdcserver.core.retry import Backoff
from cdcserver.ops.metrics import ReplicationStats
from cdcserver.replication.mappedtable import DeferDecoding
from cdcserver.replication.replicator import Replicator
from cdcserver.replication.sources import Sources
from cdcserver.replication.xa import PreparedXa
from cdcserver.reread.repair import Repairer
from cdcserver.reread.repairstats import RepairStats
from cdcserver.reread.view import Views
from cdcserver.schema.history import SchemaHistory
from cdcserver.sinks.base import Sink, SourceInfo, ordered
from cdcserver.sinks.pipeline import Applied, Pipeline, start_position
from cdcserver.store.catalog import Catalog
from cdcserver.store.faults import disk_failed, disk_full
from cdcserver.store.layout import DataDir

log = logging.getLogger(__name__)



class State(enum.Enum):
    """What replication is doing; the runner's ``why`` says why it is paused or stopped. (That
    run() raised is told apart, in ``failure``: it may have raised in any of them.)"""

    STARTING = "starting"  # checking the sources, opening the sinks
    REPLICATING = "replicating"  # a replicator and pipeline run (or start again)
    PAUSED = "paused"  # the data directory is full; resumes once a write fits
    STOPPED = "stopped"  # for good, while the service serves what is stored


class ReplicationRunner:
    def __init__(self, config: SourceConfig, data_dir: DataDir, catalog: Catalog,
                 sinks: list[Sink], *, flush_interval: float, disk_full_retry: float,
                 defer_decoding: DeferDecoding | None = None,
                 sources: Sources | None = None,
                 capture: CaptureFilter = EVERY_USER_TABLE,
                 on_applied: Applied | None = None) -> None:
        self.capture = capture
        self.config = config
        self.sources = sources if sources is not None else Sources(config.addresses())
        self.data_dir = data_dir
        self.catalog = catalog
        self.sinks = sinks  # read when replication (re)starts: a sink may be added before
        self.flush_interval = flush_interval
        self.disk_full_retry = disk_full_retry
        self.defer_decoding = defer_decoding
        self.replicator: Replicator | None = None
        self.pipeline: Pipeline | None = None
        self.handoff: Handoff | None = None
        self.state = State.STARTING
        self.why = ""  # why it is paused or stopped
        self.failure = ""  # why run() raised, once it did (/live says so)
        self.info: SourceInfo | None = None  # what the source is, once checked
        self._restarting = False
        self._setting_up = asyncio.Lock()
        self._views: Views | None = None
        self._halted = asyncio.Event()  # set by stop()
        self.repair_stats = RepairStats()  # changes without binlog rows, and their repairs
        self.replicating = asyncio.Event()  # set once the replicator is started
        self.on_applied = on_applied  # told after each sink's apply (the metrics)
        self._unreachable = Backoff()  # between restarts after the source could not be read
        self._replaced: asyncio.Future[None] | None = None
        self.xa: PreparedXa | None = None  # prepared XA transactions, once replication runs

    # -- what it is doing --------------------------------------------------------------

    @property
    def paused(self) -> str:
        """Why replication is paused (a full disk); empty while it is not."""
        return self.why if self.state is State.PAUSED else ""

    @property
    def stopped(self) -> str:
        """Why replication stopped for good while the service serves on; empty if it did not."""
        return self.why if self.state is State.STOPPED else ""

    def repair_pending(self) -> bool:
        """A repair is under way whose records are not out yet: no checkpoint may pass the
        change it repairs."""
        return self.pipeline is not None and self.pipeline.repair_pending

    def may_checkpoint(self, sink: Sink) -> bool:
        """Whether ``sink``'s checkpoint may be written where it stands
        (:meth:`Pipeline.may_checkpoint`; always, before the first pipeline)."""
        return self.pipeline is None or self.pipeline.may_checkpoint(sink)

    def resyncing(self) -> set[TableName]:
        """The tables whose resync is under way."""
        repairer = self.pipeline.repairer if self.pipeline is not None else None
        return repairer.resyncing if repairer is not None else set()

    def stats(self) -> ReplicationStats:
        replicator, pipeline, handoff = self.replicator, self.pipeline, self.handoff
        return ReplicationStats(
            started=replicator is not None,
            connected=replicator is not None and replicator.connected.is_set(),
            reconnects=replicator.reconnects if replicator is not None else 0,
            paused=self.paused,
            stopped=self.stopped,
            halted=self._halted.is_set(),
            failure=self.failure,
            transactions=pipeline.transactions if pipeline is not None else 0,
            queue_bytes=handoff.in_flight if handoff is not None else 0,
            queue_capacity=handoff.capacity if handoff is not None else 0,
            repair_pending=self.repair_pending(),
            repairs_waiting=self.pipeline.repairs_waiting() if self.pipeline else [],
            stage_seconds=dict(pipeline.stage_seconds) if pipeline is not None else {},
            source=self.sources.current.describe(), sources=len(self.sources.addresses),
            source_switches=self.sources.switches,
            refused=[r.text() for r in self.sources.refusals],
            **self._xa_stats())

    def _xa_stats(self) -> dict[str, Any]:
        xa = self.xa
        if xa is None:
            return {}
        return {"xa_prepared": len(xa.pending()), "xa_oldest_seconds": xa.oldest_age(),
                "xa_lost": list(xa.lost)}

    def request_resync(self, table: TableName, why: str) -> bool:
        """Resync a quarantined table (``cdcserver/app/resyncs.py``); False if it cannot be
        asked now: replication does not run, or the table's resync is under way."""
        repairer = self.pipeline.repairer if self.pipeline is not None else None
        return repairer is not None and repairer.request_resync(table, why)

    def applied(self, before_start: Callable[[], GtidState]) -> GtidState:
        """Every transaction applied by every sink (``before_start`` until replication
        runs)."""
        return self.pipeline.state if self.pipeline is not None else before_start()

    def last_commit(self) -> float | None:
        return self.pipeline.last_commit_timestamp if self.pipeline is not None else None

    async def wait_applied(self, reached: Callable[[GtidState], bool]) -> None:
        """Return once what every sink has applied satisfies ``reached``."""
        await self.replicating.wait()
        assert self.pipeline is not None
        while not reached(self.pipeline.state):
            # Shared with other waiters (shielded); a new pipeline (after a pause) has its
            # own progress, so a replacement wakes the waiters too.
            progress = asyncio.shield(self.pipeline.progress())
            replaced = asyncio.shield(self._pipeline_replaced())
            await asyncio.wait({progress, replaced}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (progress, replaced):
                waiter.cancel()

    def _pipeline_replaced(self) -> asyncio.Future[None]:
        if self._replaced is None or self._replaced.done():
            self._replaced = asyncio.get_running_loop().create_future()
        return self._replaced

    # -- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """Until the stream ends; raises when replication fails for good (``failure`` then
        says why)."""
        try:
            await self._run()
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            raise

    async def _run(self) -> None:
        default, info = await retrying(lambda: choose_source(self.sources, self.config))
        self.info = info = replace(info, control=self)
        for sink in self.sinks:
            await sink.open(info)  # a broker is waited for here; the listener serves meanwhile
        while True:
            try:
                await self._replicate_from(default, info)
                if self._restarting and not self._halted.is_set():
                    self._restarting = False
                    continue
                return
            except BinlogPurged as exc:
                await self._stopped_by_purge(exc)
                return
            except (ServerIdInUse, PublisherFenced) as exc:
                await self._stopped_for_good(f"replication stopped: {exc}")
                return
            except SinkRewound as exc:  # it stands at its last commit again
                log.warning("replication starts over from the checkpoints: %s", exc)
                if self._halted.is_set():
                    return
            except (StoreError, OSError, sqlite3.Error) as exc:
                if disk_failed(exc):
                    await self._pause_until_writable(exc)
                    if isinstance(exc, StoreDamaged):
                        raise
                    raise StoreDamaged(f"{self.data_dir.root}: {exc}") from exc
                if not disk_full(exc):
                    raise
                await self._pause_until_room(exc)
            except SourceUnavailable as exc:  # a repair could not reach the source
                delay = self._unreachable.failed()
                log.warning("replication restarts from the checkpoints in %.1f s: %s", delay,
                            exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._halted.wait(), delay)
                if self._halted.is_set():
                    return

    def feeding(self) -> bool:
        """Replication runs: not stopped for a purged binlog, nor paused for a full disk
        (a sink behind the publisher lease lets another instance publish then)."""
        return not (self.stopped or self.paused)

    async def restart(self) -> None:
        """Replication starts over from where every sink stands: after a sink was added
        (it is fed from its own position; the others skip what they have) or removed.
        Returns once the new pipeline runs (or the service stops): the old one no longer
        uses a sink removed before."""
        await self.replicating.wait()
        async with self._setting_up:  # not between reading the sinks and the replicator
            replaced: asyncio.Future[None] = asyncio.shield(self._pipeline_replaced())
            self._restarting = True
            if self.replicator is not None:
                await asyncio.to_thread(self.replicator.stop)
        halted = asyncio.ensure_future(self._halted_wait())
        try:
            await asyncio.wait([replaced, halted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            halted.cancel()

    async def _halted_wait(self) -> None:
        await self._halted.wait()

    async def stop(self) -> None:
        """Stop reading the binlog; the pipeline then ends after its final flush."""
        self._halted.set()
        if self.replicator is not None:
            await asyncio.to_thread(self.replicator.stop)

    async def _replicate_from(self, default: BinlogPosition, info: SourceInfo) -> None:
        """Replicate from where every sink stands (``default`` for a new store) until the
        stream ends or fails."""
        async with self._setting_up:
            await self._set_up(default, info)
        try:
            assert self.pipeline is not None
            await self.pipeline.run()
        finally:
            assert self.handoff is not None and self.replicator is not None
            self.handoff.close()
            await asyncio.to_thread(self.replicator.stop)
            if self.pipeline is not None and self.pipeline.repairer is not None:
                self.pipeline.repairer.stop()
            if self._views is not None:  # once no thread folds or reads them
                await asyncio.to_thread(self._views.close)

    async def _set_up(self, default: BinlogPosition, info: SourceInfo) -> None:
        """The replicator and pipeline from where every sink stands, started."""
        cfg = self.config
        sinks = ordered(self.sinks)
        position = start_position(sinks, default, by_gtid=self.sources.several)
        for sink in sinks:
            sink.starting_at(position)
        start = position.gtid_state
        history = SchemaHistory(self.data_dir.schema_history)
        await asyncio.to_thread(history.load, start)
        handoff = self.handoff = Handoff(asyncio.get_running_loop())
        xa = self.xa = await asyncio.to_thread(PreparedXa, self.data_dir.xa)
        self.replicator = Replicator(self.sources, cfg.server_id, handoff, start,
                                     heartbeat=cfg.heartbeat, backoff=Backoff(),
                                     report_host=cfg.report_host, history=history,
                                     mariadb=info.mariadb, file=position.file,
                                     pos=position.pos, defer_decoding=self.defer_decoding,
                                     failover_after=cfg.failover_after,
                                     connected_to=self._record_source,
                                     capture=self.capture, xa=xa)
        views = self._views = Views(self.data_dir.views)
        repairer = Repairer(self.sources, self.catalog, views, self.repair_stats,
                            self.capture.columns)
        placements = self.pipeline.placements if self.pipeline is not None else None
        if self.pipeline is not None and self.pipeline.repairer is not None:
            unfinished = self.pipeline.repairer.carry_over()
            repairer.take_over(unfinished)  # resyncs (the replay brings every other one)
            if placements is not None:
                placements.forget(unfinished)
        self.pipeline = Pipeline(handoff, sinks, start, self.flush_interval, repairer,
                                 self.on_applied, self.capture, xa, placements)
        if self._replaced is not None and not self._replaced.done():
            self._replaced.set_result(None)
        self.replicator.start()
        self._enter(State.REPLICATING)
        self.replicating.set()

    def _enter(self, state: State, why: str = "") -> None:
        self.state, self.why = state, why

    async def _stopped_by_purge(self, exc: BinlogPurged) -> None:
        """The binlog after the stored state is gone: say so once, with the way out, and
        serve what is stored until stopped (``/health`` says it too)."""
        state = self.pipeline.state if self.pipeline is not None else None
        self._enter(State.STOPPED, (
            f"replication stopped: the source no longer holds the binlog after GTID state "
            f"'{state}' (purged), so the changes since then are lost to the stream. The way "
            "out: stop the service and run `cdcserver resync` with its configuration (it "
            "marks every table in the stream, dumps each, and replication continues from the "
            "source's position then)"))
        log.error("%s [%s]", self.stopped, exc)
        await self._halted.wait()

    async def _stopped_for_good(self, why: str) -> None:
        """Say once why replication cannot go on, and serve what is stored until stopped
        (``/health`` and ``/ready`` say it too; ``cdc_replication_stopped`` is 1)."""
        self._enter(State.STOPPED, why)
        log.error("%s", why)
        await self._halted.wait()

    def _record_source(self, address: SourceAddress, identity: str) -> None:
        """Which server replication reads (``state/source.json``): a chunked dump compares
        binlog positions with the store's, which only holds on the same server."""
        record = {"source": address.describe(), "server": identity}
        write_atomically(self.data_dir.source, json.dumps(record).encode() + b"\n")

    async def _pause_until_room(self, cause: Exception) -> None:
        """The data directory is full: every sink drops its open transaction; wait until a
        write fits again, then replication starts over from what they applied. The listener
        serves meanwhile (from the committed data, which nothing touched)."""
        self._enter(State.PAUSED, f"replication paused: {cause}")
        needed, why = room_needed(cause)
        log.error("%s; resuming when %s has room again (%d MiB free%s)", self.paused,
                  self.data_dir.root, -(-needed >> 20), why)
        for sink in ordered(self.sinks):
            with contextlib.suppress(Exception):
                await sink.apply([Abort("the data directory is full")])
        probe = self.data_dir.room_probe
        pipeline = self.pipeline
        while True:
            await until_room(probe, self.disk_full_retry, needed)
            try:
                # Checkpoints cover everything applied, but never a change whose repair is
                # pending: the next pipeline (or the next process) replays it from there and
                # recognises it again, which is the one way it is repaired (each sink skips
                # what it applied in this process, in either case).
                for sink in ordered(self.sinks):
                    await self._checkpoint_at_pause(sink, pipeline)
                break
            except DiskFull:
                continue
        log.warning("the data directory has room again: resuming replication")
        self._enter(State.REPLICATING)

    @staticmethod
    async def _checkpoint_at_pause(sink: Sink, pipeline: Pipeline | None) -> None:
        """The sink's checkpoint written before replication starts over from it, or where
        none may be written (:meth:`Pipeline.may_checkpoint`: a repair was pending when the
        pause came, or the part the full disk cut short moved the sink), what a flush does
        short of the checkpoint (:meth:`Sink.keep_up`). A sink that rewound instead (the
        Kafka sink whose commit the pause cut short reads the position committed back)
        already stands at its last commit: nothing more to write. (Raised, the rewind
        stopped the service: the pause is outside the loop that takes it.)"""
        try:
            if pipeline is not None and not pipeline.may_checkpoint(sink):
                await sink.keep_up(lambda: pipeline.unrepaired_for(sink.name))
            else:
                await sink.flush()
        except SinkRewound as exc:
            log.warning("%s stands at its last commit again: %s", sink.name, exc)

    async def _pause_until_writable(self, cause: Exception) -> None:
        """The data directory's disk failed: every sink drops its open transaction, and
        once a write and an fsync work there again, :meth:`run` raises
        :class:`StoreDamaged` for the service to start over from its checkpoint. The
        listener serves meanwhile; ``/health`` and ``/ready`` say why."""
        self._enter(State.PAUSED, f"replication paused: the data directory's disk failed "
                                  f"({cause}); the service starts over from its checkpoint "
                                  "once it takes a write and an fsync again")
        log.error("%s", self.paused)
        for sink in ordered(self.sinks):
            with contextlib.suppress(Exception):
                await sink.apply([Abort("the data directory's disk failed")])
        halted = asyncio.ensure_future(self._halted.wait())
        writable = asyncio.ensure_future(until_writable(self.data_dir.room_probe,
                                                        self.disk_full_retry))
        try:
            await asyncio.wait({halted, writable}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halted.cancel()
            writable.cancel()
        if not self._halted.is_set():
            log.warning("the data directory takes writes again: the service starts over "
                        "from its checkpoint")
