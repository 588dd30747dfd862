"""What a full data directory must free before replication resumes
(:mod:`cdcserver.app.diskroom`)."""

from __future__ import annotations

import asyncio
import os

import pytest

from cdcserver.app.diskroom import ROOM_NEEDED, RoomWanted, until_room
from cdcserver.core.errors import DiskFull
from cdcserver.core.gtid import BinlogPosition, GtidState
from tests.helpers import small_tmpfs


def at(gtid: str, pos: int) -> BinlogPosition:
    """A start position, a new object each time (as each start computes it)."""
    return BinlogPosition(GtidState.parse(gtid), "mysql-bin.000001", pos)


def test_the_room_wanted_doubles_while_resumes_from_the_same_checkpoint_fill_the_disk_again():
    room = RoomWanted()
    room.started_from(at("0-1-1", 100))
    assert room.after(DiskFull("full")) == ROOM_NEEDED and room.why == ""
    room.started_from(at("0-1-1", 100))  # resumed from the same place, and full again
    assert room.after(DiskFull("full")) == 2 * ROOM_NEEDED
    assert "before the checkpoint moved" in room.why
    room.started_from(at("0-1-1", 100))
    assert room.after(DiskFull("full")) == 4 * ROOM_NEEDED
    room.started_from(at("0-1-2", 200))  # the checkpoint moved: the work that fills it is new
    assert room.after(DiskFull("full")) == ROOM_NEEDED


def test_a_failed_repairs_scratch_is_wanted_besides():
    room = RoomWanted()
    room.started_from(at("0-1-1", 100))
    assert room.after(DiskFull("full", needed=50 << 20)) == ROOM_NEEDED + (50 << 20)
    assert "50 MiB" in room.why


async def test_until_room_waits_for_the_bytes_wanted_not_just_a_probes(tmp_path):
    with small_tmpfs(str(tmp_path / "fs"), "64m") as fs:
        probe = os.path.join(fs, ".room-probe")
        ballast = os.path.join(fs, "ballast")
        with open(ballast, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 24 << 20)  # 40 MiB free: a probe fits
        await asyncio.wait_for(until_room(probe, 0.01), 10)
        waiting = asyncio.ensure_future(until_room(probe, 0.01, 48 << 20))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting), 0.5)
        os.unlink(ballast)
        await asyncio.wait_for(waiting, 10)
        assert not os.path.exists(probe)
