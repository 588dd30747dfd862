"""Where the pipeline lets a sink move its checkpoint while repairs are pending
(``Pipeline._settle``, ``Sink.settle``), and what a part that failed under a repair's rows
leaves pending. A review of 9c9f467 and fdf319e found both holes; each test fails without its
fix. (Fake sinks and a fake repair stage: what is tested is the pipeline's bookkeeping.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdcserver.core.changes import Begin, Change, Commit
from cdcserver.core.errors import DiskFull
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.handoff import Handoff
from cdcserver.sinks.pipeline import Pipeline


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


def _transaction(n: int) -> list[Change]:
    return [Begin(Gtid(0, 1, n), 0), Commit(_position(n), 0)]


class _Sink:
    after: tuple[str, ...] = ()
    active = True
    unrepaired = None

    def __init__(self, name: str, applied: BinlogPosition | None) -> None:
        self.name = name
        self.applied = self.durable = applied
        self.given: list[Change] = []
        self.settled: list[BinlogPosition | None] = []
        self.fail = False

    async def apply(self, changes: list[Change]) -> None:
        if self.fail:
            raise DiskFull("no room")
        self.given += changes
        self.applied = next((c.position for c in reversed(changes)
                             if isinstance(c, Commit)), self.applied)

    def settle(self) -> None:
        self.settled.append(self.applied)


class _Repairs:
    """A repair stage with a repair pending until told otherwise."""

    def __init__(self) -> None:
        self.pending = False
        self.holding = False
        self.input_waiting: Any = None
        self.placing_beside = False

    async def process(self, part: list[Change]) -> list[Change]:
        return part


def _pipeline(sinks: list[_Sink], repairs: _Repairs, start: int) -> Pipeline:
    pipeline = Pipeline(Handoff(asyncio.get_running_loop()), sinks,  # type: ignore[arg-type]
                        _position(start).gtid_state, repairer=repairs)  # type: ignore[arg-type]
    pipeline._held_back = True  # (as the flush loop leaves it after a held-back checkpoint)
    return pipeline


async def test_a_sink_still_skipping_what_it_applied_before_a_restart_is_not_settled():
    """Started again at the store's checkpoint (2), the Kafka sink published up to 5 in the
    pipeline before: until the replay passes 5 it stands further on than the pipeline, maybe
    past a change whose repair the new pipeline has not read yet. Told to settle there, its
    next keep-up moved its checkpoint past that change."""
    store, kafka = _Sink("avro", _position(2)), _Sink("kafka", _position(5))
    pipeline = _pipeline([store, kafka], _Repairs(), start=2)
    for n in (3, 4):
        await pipeline._apply(_transaction(n))
        pipeline._next_settle = 0.0
    assert store.settled == [_position(3), _position(4)] and kafka.settled == []
    for n in (5, 6):
        await pipeline._apply(_transaction(n))
        pipeline._next_settle = 0.0
    # at 5 it stands where the pipeline does again
    assert kafka.settled == [_position(5), _position(6)]


async def test_a_part_that_failed_under_a_repairs_rows_leaves_the_repair_pending():
    """A repair pending when a part starts reaches its watermark in it and leaves the repair
    stage's lists; its rows are out only once the part is applied. The store ran out of room
    under them: the part failed, and the pipeline then said no repair was pending, so a full
    disk's pause wrote every checkpoint past the change repaired."""
    store = _Sink("avro", _position(1))
    repairs = _Repairs()
    pipeline = _pipeline([store], repairs, start=1)
    repairs.pending = True

    async def reaches_its_watermark(part: list[Change]) -> list[Change]:
        repairs.pending = False
        return part

    repairs.process = reaches_its_watermark  # type: ignore[method-assign]
    store.fail = True
    with pytest.raises(DiskFull):
        await pipeline._apply(_transaction(2))
    assert pipeline.repair_pending
