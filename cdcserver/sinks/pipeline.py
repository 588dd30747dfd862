"""The change pipeline: from the replicator's hand-off to every active sink, checkpointing by
flushes.

Each sink (:mod:`cdcserver.sinks.base`) keeps its own checkpoint; replication starts from the
earliest of them, and a sink is not given a transaction its own checkpoint already covers, so
a restart after a crash duplicates nothing in any sink. Flushes run every ``flush_interval``
seconds in the background, so checkpoint I/O overlaps with decoding.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    Rowless,
    Rows,
    TableLayout,
)
from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState, binlog_ordinal, same_transaction
from cdcserver.core.handoff import Handoff
from cdcserver.core.names import TableName
from cdcserver.replication.xa import PreparedXa
from cdcserver.reread.markers import OTHERS, named
from cdcserver.reread.repair import Repairer
from cdcserver.reread.repairstate import cause_of, repair_note
from cdcserver.schema.masking import project_layout
from cdcserver.sinks.base import Sink
from cdcserver.sinks.unheld import UnheldCauses

log = logging.getLogger(__name__)

T = TypeVar("T")
REPAIRS = "repairs"  # the stage of the seconds spent turning changes without rows into records

Applied = Callable[[str, list[Change]], None]  # a sink (by name) applied these changes


def start_position(sinks: Sequence[Sink], default: BinlogPosition, *,
                   by_gtid: bool = False) -> BinlogPosition:
    """Where replication resumes: the earliest checkpoint of all sinks (a sink without one
    starts where configured). When every checkpoint has a binlog position, the earliest by
    position is taken whole (its GTID state with it): with ``gtid_strict_mode=OFF`` a domain's
    sequence numbers can go down, so "the lower number" is not "the earlier transaction".
    Otherwise the GTID states are combined per domain; the binlog file/pos is what a MySQL
    source without GTIDs resumes from."""
    positions = [s.durable for s in sinks if s.durable is not None]
    if len(positions) < len(sinks):
        positions.append(default)
    earliest = min(positions, key=lambda p: binlog_ordinal(p.file, p.pos))
    if by_gtid:  # the checkpoints may name positions in different servers' binlogs
        return BinlogPosition(min_state([p.gtid_state for p in positions]), "", 4)
    if all(p.file for p in positions):
        return earliest
    return BinlogPosition(min_state([p.gtid_state for p in positions]), earliest.file,
                          earliest.pos)


def min_state(states: list[GtidState]) -> GtidState:
    result = states[0]
    for state in states[1:]:
        result = result.minimum(state)
    return result


RELEASED = "changes held for its repair, released"  # (RepairPlacements.record)


def _named(gtid: Gtid) -> object:
    """A transaction's name as :func:`same_transaction` compares them (hashable)."""
    return (gtid.key, gtid.sequence) if gtid.source_uuid is not None else gtid


class RepairPlacements:
    """Which transaction each finished repair's rows were first placed in, by table and note
    (and the changes a repair beside the stream released), for every pipeline of one
    runner. A pipeline started again for a sink that rewound (Kafka's) reads the repairs of
    what it replays again, at new watermarks, so in later transactions; a sink further ahead
    (the store) holds the first placement already (its filter skipped that transaction) and
    is not given the second, whose before-images are not its rows.

    Only a repair the previous pipeline finished is known here: one it left unfinished (it
    waited for its watermark, or had placed part of its rows, a share at a time, beside the
    stream) is carried over and done again whole against the view, which holds the part
    placed, so what it places next is rows no sink holds (:meth:`forget`)."""

    LIMIT = 10_000  # the newest placements kept

    def __init__(self) -> None:
        self._placed: collections.OrderedDict[tuple[str, str, str], object] = \
            collections.OrderedDict()
        # the transactions placed in, each with how many placements it holds
        self._transactions: collections.Counter[object] = collections.Counter()

    def __bool__(self) -> bool:
        return bool(self._placed)

    def first(self, rows: Rows) -> object | None:
        return self._placed.get((rows.layout.database, rows.layout.table, rows.repair))

    def record(self, changes: list[Change]) -> None:
        """The repairs among ``changes`` (after every sink was given them), and the changes
        a repair beside the stream held and released (a repair with nothing to place is
        held by the sinks that were given those)."""
        placed: object | None = None
        for change in changes:
            if isinstance(change, Begin):
                placed = _named(change.gtid)
            elif isinstance(change, Rows) and placed is not None and \
                    (change.repair or change.released):
                note = change.repair or repair_note(RELEASED, change.released)
                self._place((change.layout.database, change.layout.table, note), placed)
        while len(self._placed) > self.LIMIT:
            self._unplace(self._placed.popitem(last=False)[1])

    def _place(self, key: tuple[str, str, str], transaction: object) -> None:
        """The first placement is kept: a repair read again is placed again, later, and
        a sink that skipped the first holds it all (its shares, a share at a time, too)."""
        if key in self._placed:
            return
        self._placed[key] = transaction
        self._transactions[transaction] += 1

    def _unplace(self, transaction: object) -> None:
        """One placement in ``transaction`` fewer (each kept or dropped in O(1): every
        part with a repair passes here, and up to :attr:`LIMIT` are kept)."""
        self._transactions[transaction] -= 1
        if self._transactions[transaction] <= 0:
            del self._transactions[transaction]

    def placed_in_any(self, cause: str, transactions: set[object]) -> bool:
        """Whether a repair of ``cause`` was first placed in one of ``transactions``."""
        return bool(transactions) and any(
            cause_of(note) == cause and self._placed[(db, table, note)] in transactions
            for db, table, note in self._placed)

    def holds_placement(self, transaction: object) -> bool:
        """Whether a repair was placed in ``transaction`` (a name as :func:`_named` gives)."""
        return transaction in self._transactions

    def forget(self, unfinished: list[tuple[list[Rowless], str]]) -> None:
        """The repairs a stopped pipeline left unfinished (markers and cause, as
        :meth:`Repairer.carry_over` gives them): whatever part of them was placed, what the
        next pipeline places for them reaches every sink. By cause: a cascade's repair
        places rows of tables its markers do not name (the foreign keys it follows)."""
        causes = {cause for _, cause in unfinished}
        for key in [k for k in self._placed if cause_of(k[2]) in causes]:
            self._unplace(self._placed.pop(key))


class _ReplayFilter:
    """Drops, for one sink, the transactions its checkpoint already covers.

    Replication starts at the earliest checkpoint of all sinks, so a sink further ahead is
    handed again what it applied before the restart. In each domain its checkpoint names the
    last transaction it applied: the stream's transactions of that domain are dropped up to
    and including that exact GTID, and none after it. Sequence numbers are never compared:
    with ``gtid_strict_mode=OFF`` (MariaDB's default) a session may set a lower
    ``gtid_seq_no`` and servers sharing a domain count on their own, so a lower number can
    come later in the binlog. If the stream passes the checkpoint's binlog position while a
    domain still waits for its GTID, the checkpoint does not belong to this binlog: replication
    stops rather than guess.

    A repair is read again when the stream passes its cause again, and placed in a later
    transaction than before; the sink is not given it a second time if it holds it: its first
    placement is a transaction it skipped (:class:`RepairPlacements`, within one process), or
    the sink records which repairs were not yet placed where it recorded that
    (:attr:`Sink.unrepaired`, at ``unrepaired_at``): its cause is a transaction it skipped up to
    there and not one of them."""

    def __init__(self, name: str, durable: BinlogPosition | None, start: GtidState,
                 placements: RepairPlacements | None = None,
                 unrepaired: frozenset[str] | None = None,
                 unrepaired_at: BinlogPosition | None = None) -> None:
        self.name = name
        self.durable = durable
        self._waiting = _transactions_until(durable, start)
        # the domains whose transaction at unrepaired_at is not passed yet (default: durable)
        self._recorded = self._waiting.copy() if unrepaired_at is None else \
            _transactions_until(unrepaired_at, start)
        self._skipping: Gtid | None = None  # the open transaction, being dropped
        self._placements = placements
        self._skipped: set[object] = set()  # the transactions dropped a repair was placed in
        self._unrepaired = _transactions_named(unrepaired)
        self._skipped_causes: set[str] = set()  # the transactions dropped that were causes
        self._placed_held: dict[str, bool] = {}  # cause -> placed in a transaction dropped
        self._unheld = UnheldCauses(self._holds_cause)

    @property
    def replaying(self) -> bool:
        """Whether the stream has not yet reached where this sink stood (it drops what it
        applied before): a repair whose change is between is not pending again yet."""
        return bool(self._waiting) or self._skipping is not None

    def __call__(self, changes: list[Change], marked: bool = False) -> list[Change]:
        """``changes`` without what this sink holds already; ``marked``: they hold changes
        a repair beside the stream holds back (:meth:`_withheld_or_released`)."""
        kept = self._replayed(changes)
        return self._withheld_or_released(kept) if marked else kept

    def _replayed(self, changes: list[Change]) -> list[Change]:
        if not self._waiting and self._skipping is None:
            return self._without_repairs_held(changes)
        kept: list[Change] = []
        skipped = False
        for change in changes:
            if isinstance(change, Begin) and change.gtid.key in self._waiting:
                self._skipping = change.gtid
            if self._skipping is None:
                if isinstance(change, Commit):
                    self._check_not_passed(change.position)
                kept.append(change)
                continue
            skipped = True
            if isinstance(change, Commit):
                self._note_skipped(self._skipping)
                for passing in (self._waiting, self._recorded):
                    if same_transaction(passing.get(self._skipping.key), self._skipping):
                        del passing[self._skipping.key]
                self._skipping = None
            elif isinstance(change, (Rowless, Ddl)) and self._unrepaired is not None and \
                    self._skipping.key in self._recorded:  # (as of its record: a cause)
                self._skipped_causes.add(str(self._skipping))  # (a statement's repairs too)
                self._unheld.skipped_cause(str(self._skipping))
            elif isinstance(change, Abort):
                self._skipping = None  # it will be read again whole
        return self._without_repairs_held(kept) if skipped else changes

    def _note_skipped(self, transaction: Gtid) -> None:
        if self._placements is not None:
            name = _named(transaction)
            if self._placements.holds_placement(name):
                self._skipped.add(name)
                self._placed_held.clear()
                self._unheld.skipped_placement()

    def _without_repairs_held(self, changes: list[Change]) -> list[Change]:
        """Without the repairs this sink holds already (see the class's description)."""
        if not self._skipped and not self._skipped_causes:
            return changes
        kept = [c for c in changes if not (isinstance(c, Rows) and c.repair and
                                           self._holds(c))]
        if len(kept) != len(changes):
            log.info("%s: a repair it holds from before the restart, read again, is not "
                     "given to it a second time", self.name)
        return kept

    def _withheld_or_released(self, changes: list[Change]) -> list[Change]:
        """A table's changes held back for its repair beside the stream: a sink that holds
        the repair from before the restart gets them where they are (withheld), since the
        repair read again, whose records fold them in, is not given to it; every other sink
        gets them where the repair lets them go (released), or in its records. And a row
        event told as held while repairs wait, or as logged (:meth:`_as_held_or_logged`)."""
        kept: list[Change] = []
        for change in changes:
            if not isinstance(change, (Rows, Ddl)):
                kept.append(change)
            elif isinstance(change, Rows) and (change.as_held_for or change.as_logged_for):
                kept += self._as_held_or_logged(change)
            elif change.withheld:
                if self._holds_cause(change.withheld):
                    kept.append(replace(change, withheld=""))
            elif not (change.released and self._holds_cause(change.released)):
                kept.append(change)
        return kept

    def _as_held_or_logged(self, rows: Rows) -> list[Change]:
        """A row event while repairs of its table wait: told against the rows the stream
        holds for a sink that does not hold every one of those repairs; as the binlog logged
        it for one that does (a repair read again in a replay: its rows are the source's)."""
        causes = rows.as_held_for or rows.as_logged_for
        holds = all(self._holds_cause(c) for c in causes)
        if holds == bool(rows.as_logged_for):
            return [replace(rows, as_held_for=(), as_logged_for=())]
        return []

    def unheld(self, causes: frozenset[str] | None) -> frozenset[str] | None:
        """Of the causes of the repairs not yet placed, those whose repair this sink does not
        hold already: one read again in a replay is pending, but the sink will not be given
        it (a record naming it would have it given again after the next restart)."""
        if not causes or (not self._skipped and not self._skipped_causes):
            return causes
        return self._unheld.of(causes)

    def _holds_cause(self, cause: str) -> bool:
        if self._recorded_as_placed(cause):
            return True
        if self._placements is None or not self._skipped:
            return False
        held = self._placed_held.get(cause)
        if held is None:
            held = self._placed_held[cause] = self._placements.placed_in_any(cause,
                                                                             self._skipped)
        return held

    def _recorded_as_placed(self, cause: str) -> bool:
        """Whether the sink's record says it holds the repair of ``cause``: every
        transaction it names was skipped here and is not one the record names as unplaced
        (a name ending "and others" does not say which it covers: not held)."""
        if self._unrepaired is None:
            return False
        transactions = named(cause)
        return OTHERS not in transactions and all(
            c in self._skipped_causes and c not in self._unrepaired for c in transactions)

    def _holds(self, rows: Rows) -> bool:
        """Whether the sink holds the repair ``rows`` are records of: by their cause, since a
        sink holds all of a repair or none of it (it skipped a transaction one of its
        records was placed in, or its record says so), however many shares it took."""
        if self._placements is not None and self._placements.first(rows) in self._skipped:
            return True
        return self._holds_cause(cause_of(rows.repair))

    def _check_not_passed(self, position: BinlogPosition) -> None:
        durable = self.durable
        if not self._waiting or durable is None or not durable.file or not position.file:
            return
        if binlog_ordinal(position.file, position.pos) > binlog_ordinal(durable.file,
                                                                         durable.pos):
            missing = ",".join(str(g) for g in self._waiting.values())
            raise SourceError(
                f"{self.name}: the binlog passed this sink's checkpoint ({durable.file}:"
                f"{durable.pos}) without the transaction it names ({missing}); the source's "
                "binlog is not the one the checkpoint was taken from (reset, restored or "
                "another server). Replication stops so that nothing is applied twice or "
                "skipped; start the sink from a new data directory, or set its checkpoint "
                "to a position of this source.")


def _transactions_until(position: BinlogPosition | None,
                        start: GtidState) -> dict[int | str, Gtid]:
    """Per domain, the transaction ``position`` names that a stream from ``start`` brings
    (the domains it is not passed in yet)."""
    if position is None:
        return {}
    return {g.key: g for g in position.gtid_state if not same_transaction(start.get(g.key), g)}


def _transactions_named(causes: frozenset[str] | None) -> frozenset[str] | None:
    """Each transaction the causes of a sink's recorded unplaced repairs name: repairs read
    at one watermark are named together ("0-1-3, 0-1-4"), and a replay may read them apart.
    None (not known) when one names only some ("..., and others")."""
    if not causes:
        return causes
    transactions = frozenset(c for cause in causes for c in named(cause))
    return None if OTHERS in transactions else transactions


def segments(batch: list[Change]) -> list[list[Change]]:
    """The batch cut after each transaction holding a schema statement: the repair stage
    builds a table's view from the store, which must then hold the statement."""
    parts: list[list[Change]] = []
    start, schema = 0, False
    for i, change in enumerate(batch):
        if isinstance(change, Ddl):
            schema = True
        elif isinstance(change, (Commit, Abort)) and schema:
            parts.append(batch[start:i + 1])
            start, schema = i + 1, False
    if start < len(batch):
        parts.append(batch[start:])
    return parts or [batch]


IDLE_LOOK = 0.5  # seconds without a batch after which a repair beside the stream is looked at


class Pipeline:
    def __init__(self, handoff: Handoff, sinks: list[Sink], start: GtidState,
                 flush_interval: float = 0.2, repairer: Repairer | None = None,
                 applied: Applied | None = None,
                 capture: CaptureFilter = EVERY_USER_TABLE,
                 xa: PreparedXa | None = None,
                 placements: RepairPlacements | None = None) -> None:
        self.handoff = handoff
        self.xa = xa  # prepared XA transactions: those completed and checkpointed are let go
        self.capture = capture  # the last guard: no sink is given a table not captured
        self._captured: dict[tuple[str, str], bool] = {}
        self._touched: dict[tuple[str, str], bool] = {}  # tables column rules may name
        self.sinks = sinks
        self.repairer = repairer  # turns changes without binlog rows into records
        self.applied = applied  # told after each sink's apply (the latency metrics)
        self.flush_interval = flush_interval
        self.placements = placements if placements is not None else RepairPlacements()
        self._filters = [_ReplayFilter(s.name, s.applied, start, self.placements,
                                       s.unrepaired, s.unrepaired_at)
                         for s in sinks]
        self.state = start  # after the last transaction every sink has applied
        self.transactions = 0
        # the seconds spent waiting on each stage: the repairs, and each sink's apply (where
        # a backlog's time goes, in /metrics)
        self.stage_seconds: dict[str, float] = {}
        self.last_commit_timestamp: int | None = None  # the source's, of the newest applied
        self._progress: asyncio.Future[None] | None = None
        self._finishing = 0  # parts being repaired and applied while a repair was out
        self._failed_finishing = False  # one of them failed (_finishing_repairs)
        # each sink's: the causes of the repairs not yet placed after the last part it was
        # given (Sink.keep_up)
        self._unrepaired: dict[str, frozenset[str] | None] = {}
        # where each sink stood after its last apply that ended whole, and whether one failed
        self._part_end = {s.name: s.applied for s in sinks}
        self._part_failed = False
        self._later_batches = self._later_parts = 0  # after the one being applied
        if repairer is not None:
            repairer.input_waiting = self._input_waiting

    def progress(self) -> asyncio.Future[None]:
        """A future resolved after the next batch of transactions is applied."""
        if self._progress is None or self._progress.done():
            self._progress = asyncio.get_running_loop().create_future()
        return self._progress

    async def run(self) -> None:
        """Until the replicator's stream ends (returns) or fails, or a checkpoint cannot be
        written (raises the error)."""
        flusher = asyncio.create_task(self._flush_periodically())
        taking: asyncio.Future[list[list[Change]]] | None = None
        try:
            while True:
                if taking is None:
                    taking = asyncio.ensure_future(self.handoff.get())
                waited: set[asyncio.Future[Any]] = {taking, flusher}
                await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED,
                                   timeout=IDLE_LOOK if self._reading_beside else None)
                if flusher.done():
                    taking.cancel()
                    flusher.result()  # a failed checkpoint stops the pipeline
                if not taking.done():  # quiet: a repair beside the stream may need us
                    await self._idle()
                    continue
                batches, taking = taking.result(), None
                if not batches:
                    break
                for i, batch in enumerate(batches):
                    self._later_batches = len(batches) - i - 1
                    await self._apply(batch)
        finally:
            if taking is not None and not taking.done():
                taking.cancel()
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        await self.flush()

    async def _apply(self, batch: list[Change]) -> None:
        if self.repairer is None:
            await self._apply_part(batch)
            return
        parts = segments(batch)
        for i, part in enumerate(parts):
            self._later_parts = len(parts) - i - 1
            async with self._finishing_repairs():
                repaired = await self._timed(REPAIRS, self.repairer.process(part))
                await self._apply_part(self._captured_only(repaired))
                while self.repairer.holding:  # the last transaction, for a repair beside it
                    resumed = await self._timed(REPAIRS, self.repairer.resume())
                    await self._apply_part(self._captured_only(resumed))

    async def _timed(self, stage: str, work: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await work
        finally:
            took = time.perf_counter() - started
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + took

    def _input_waiting(self) -> bool:
        """Whether the stream has more for the pipeline than the part being passed on."""
        return self._later_parts > 0 or self._later_batches > 0 or self.handoff.waiting

    @property
    def _reading_beside(self) -> bool:
        return self.repairer is not None and self.repairer.reading_beside

    async def _idle(self) -> None:
        assert self.repairer is not None
        async with self._finishing_repairs():
            changes = await self._timed(REPAIRS, self.repairer.idle())
            if changes:
                await self._apply_part(self._captured_only(changes))

    @contextlib.asynccontextmanager
    async def _finishing_repairs(self) -> AsyncIterator[None]:
        """A repair out when a part starts may reach its watermark in it: it leaves the
        repairer's lists then, but its rows are out only once the part is applied. Until
        then no checkpoint: one written meanwhile (the repairer reads the source in a thread,
        the flush loop runs) would pass the change repaired without its rows, and a kill
        then lost them. A repair that starts in the part is safe: its change is applied with
        the part, no earlier. A part that failed so (a full disk under the repair's rows)
        leaves the repair pending for good: the pause that follows keeps the checkpoints
        before its change."""
        held = self.repairer is not None and self.repairer.pending
        self._finishing += held
        try:
            yield
        except BaseException:
            self._failed_finishing |= held
            raise
        finally:
            self._finishing -= held

    def _captured_only(self, changes: list[Change]) -> list[Change]:
        """Without the rows a repair read of tables the service does not capture (a cascade
        into an excluded child table), and every row as the column rules store it: the
        decoder and the repair apply both already; this is the last guard before a sink."""
        kept = [self._stored(c) if isinstance(c, Rows) else c for c in changes
                if not isinstance(c, Rows) or self._captures(c.layout)]
        return kept if len(kept) != len(changes) or any(
            a is not b for a, b in zip(kept, changes, strict=True)) else changes

    def _stored(self, rows: Rows) -> Rows:
        if rows.layout.image is not None or not self._ruled(rows.layout):
            return rows
        projection = project_layout(rows.layout, self.capture.columns)
        if projection is None:
            return rows
        log.warning("%s: rows reached the sinks without the column rules applied; applied "
                    "now", rows.layout.qualified_name)
        return replace(rows, layout=projection.layout, images=None,
                       rows=[projection.row(row) for row in rows.rows])

    def _ruled(self, layout: TableLayout) -> bool:
        key = (layout.database, layout.table)
        known = self._touched.get(key)
        if known is None:
            known = self._touched[key] = self.capture.columns.touches(TableName(*key))
        return known

    def _captures(self, layout: TableLayout) -> bool:
        key = (layout.database, layout.table)
        known = self._captured.get(key)
        if known is None:
            known = self._captured[key] = self.capture.captures(*key)
        return known

    async def _apply_part(self, batch: list[Change]) -> None:
        unrepaired = self._unrepaired_now()
        marked = self.repairer is not None and self.repairer.take_marked()
        try:
            for sink, keep in zip(self.sinks, self._filters, strict=True):
                changes = keep(batch, marked)
                if changes:
                    try:
                        await self._timed(sink.name, sink.apply(changes))
                    except BaseException:
                        self._part_failed = True  # (it may have committed some of them)
                        raise
                    self._part_end[sink.name] = sink.applied
                    # (no await between: a sink's commit, waiting for its lock, reads it next)
                    self._unrepaired[sink.name] = keep.unheld(unrepaired)
                    if self.applied is not None:
                        self.applied(sink.name, changes)
        finally:
            # Even when a sink failed (a full disk): the sinks before it hold the part, and
            # one resumed in this process skips its transactions; unrecorded, the repairs
            # placed in them were given to it again and its rows told as the view held them
            # (soak seed 91: a delete's before-image from before its repair). A placement
            # in a transaction a sink does not hold is never asked about for it.
            if self.repairer is not None:
                self.placements.record(batch)
        for change in batch:
            if isinstance(change, Commit):
                self.state = change.position.gtid_state
                self.transactions += 1
                self.last_commit_timestamp = change.timestamp
        progress, self._progress = self._progress, None
        if progress is not None and not progress.done():
            progress.set_result(None)

    @property
    def repair_pending(self) -> bool:
        """While a repair waits for its watermark no checkpoint is written (it would pass the
        change being repaired; a restart replays from the last one instead)."""
        return self.repairer is not None and (self.repairer.pending or self._finishing > 0 or
                                              self._failed_finishing)

    def repairs_waiting(self) -> list[dict[str, Any]]:
        """What holds the checkpoint back while :attr:`repair_pending` (for /health)."""
        if self.repairer is None:
            return []
        waiting = self.repairer.waiting()
        if self._finishing > 0:
            waiting.append({"stage": "its rows are being applied", "tables": [], "cause": "",
                            "count": self._finishing})
        return waiting

    async def flush(self) -> None:
        """Every sink's checkpoint that :meth:`may_checkpoint` (the pipeline ends)."""
        held = [sink for sink in self.sinks if not self.may_checkpoint(sink)]
        if held:
            log.warning("no checkpoint now for %s (%s): a restart replays from the last one",
                        ", ".join(s.name for s in held), self._why_no_checkpoint(held[0]))
        await asyncio.gather(*(sink.flush() for sink in self.sinks if sink not in held))

    def may_checkpoint(self, sink: Sink) -> bool:
        """Whether ``sink``'s checkpoint may be written where it stands now
        (:meth:`_why_no_checkpoint` says why not)."""
        return not self._why_no_checkpoint(sink)

    def _why_no_checkpoint(self, sink: Sink) -> str:
        """Empty, or why no checkpoint of ``sink`` may be written now: while a repair waits
        for its watermark (it would pass the change being repaired); while the replay has
        not reached where the sink stood (a pipeline started again in the process: a
        repair whose change is between is not pending again yet, and the store stands
        past its checkpoint); after a part failed with the sink elsewhere than its last
        whole apply left it (a repair placed in the part, whose change the sink committed
        before the failure, is in no list)."""
        if self.repair_pending:
            return "a repair waits for its watermark"
        if self._filters[self.sinks.index(sink)].replaying:
            return "the replay has not reached where it stood"
        if self._part_failed and sink.applied != self._part_end.get(sink.name):
            return "a part failed half applied"
        return ""

    async def _flush_periodically(self) -> None:
        """Each sink on its own cadence: one waiting for a broker does not hold back the
        others' checkpoints."""
        loops = [asyncio.create_task(self._flush_loop(sink)) for sink in self.sinks]
        try:
            await asyncio.gather(*loops)
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    def unrepaired_for(self, sink: str) -> frozenset[str] | None:
        """The causes of the repairs not yet placed after the last part ``sink`` was given
        (None: not known), for its :meth:`Sink.keep_up`."""
        return self._unrepaired.get(sink)

    def _unrepaired_now(self) -> frozenset[str] | None:
        """The causes of the repairs not yet placed, as the repairer stands (after the part
        it last passed on); None while one is being read (its cause is not at hand)."""
        if self.repairer is None or not self.repairer.pending:
            return frozenset()
        if self.repairer.placing_beside:  # (part of its rows out: not told by its cause)
            return None
        return self.repairer.waiting_causes()

    async def _flush_loop(self, sink: Sink) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            if not self.may_checkpoint(sink):
                await sink.keep_up(lambda: self.unrepaired_for(sink.name))
                continue
            try:
                await sink.flush()
            except CdcError as exc:
                if not exc.retriable:
                    raise
                log.warning("%s: checkpoint not written, retrying: %s", sink.name, exc)
                continue
            await self._let_go_of_xa()

    async def _let_go_of_xa(self) -> None:
        """Completed XA transactions every sink's checkpoint covers are not read again."""
        if self.xa is None or not self.xa.completing:  # (every flush: the usual case is none)
            return
        durable = [s.durable for s in self.sinks]
        if all(p is not None for p in durable):
            await asyncio.to_thread(self.xa.prune, [p.gtid_state for p in durable if p])
