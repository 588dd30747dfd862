"""What a part that failed under a repair's rows leaves pending (a review of fdf319e found
the hole; the test fails without its fix). (A fake sink and a fake repair stage: what is
tested is the pipeline's bookkeeping.)"""

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
    unrepaired = unrepaired_at = None

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

    def take_marked(self) -> bool:
        return False


def _pipeline(sinks: list[_Sink], repairs: _Repairs, start: int) -> Pipeline:
    pipeline = Pipeline(Handoff(asyncio.get_running_loop()), sinks,  # type: ignore[arg-type]
                        _position(start).gtid_state, repairer=repairs)  # type: ignore[arg-type]
    return pipeline


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


async def test_no_checkpoint_while_the_replay_is_behind_where_the_sink_stood():
    """Third review of the recorded repairs. After a restart in the process the store stands
    past its checkpoint, where the replay starts: a repair whose change lies between is not
    pending again until the replay gets there, so a checkpoint where the store stands, with
    nothing pending yet, passed the change unrepaired (a kill then lost the repair)."""
    ahead = _Sink("avro", _position(5))
    pipeline = _pipeline([ahead], _Repairs(), start=2)
    assert not pipeline.may_checkpoint(ahead)  # type: ignore[arg-type]
    await pipeline._apply([*_transaction(3), *_transaction(4)])
    assert not pipeline.may_checkpoint(ahead)  # type: ignore[arg-type]
    await pipeline._apply(_transaction(5))  # (the replay reaches where it stood)
    assert pipeline.may_checkpoint(ahead)  # type: ignore[arg-type]
    assert ahead.given == []  # (it held them all)


async def test_no_checkpoint_of_a_sink_a_failed_part_moved():
    """Third review. A part failed after the store committed some of it (the disk filled
    under a later transaction): a repair that began and was placed inside the part is in no
    list, so the pause's checkpoint where the store stopped passed the change repaired
    without its rows. The store may checkpoint only where its last whole apply left it; a
    sink the failed part did not move may."""
    store, other = _Sink("avro", _position(1)), _Sink("kafka", _position(1))
    pipeline = _pipeline([store, other], _Repairs(), start=1)
    await pipeline._apply(_transaction(2))
    assert pipeline.may_checkpoint(store)  # type: ignore[arg-type]

    async def commits_some_then_fills(changes: list[Change]) -> None:
        store.applied = _position(3)  # (T3 committed, then no room for T4)
        raise DiskFull("no room")

    store.apply = commits_some_then_fills  # type: ignore[method-assign]
    with pytest.raises(DiskFull):
        await pipeline._apply([*_transaction(3), *_transaction(4)])
    assert not pipeline.may_checkpoint(store)  # type: ignore[arg-type]
    assert pipeline.may_checkpoint(other)  # type: ignore[arg-type]  (never reached)
    store.applied = _position(2)  # (had it rolled back to where the last whole part left it)
    assert pipeline.may_checkpoint(store)  # type: ignore[arg-type]
