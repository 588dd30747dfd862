"""What a full data directory must free before replication resumes
(:mod:`cdcserver.app.diskroom`)."""

from __future__ import annotations

import asyncio
import os

import pytest

from cdcserver.app.diskroom import ROOM_NEEDED, room_needed, until_room
from cdcserver.core.errors import DiskFull
from tests.helpers import small_tmpfs


def test_a_resume_after_a_failed_repair_waits_for_its_scratch_again():
    assert room_needed(DiskFull("full")) == (ROOM_NEEDED, "")
    needed, why = room_needed(DiskFull("full", needed=50 << 20))
    assert needed == ROOM_NEEDED + (50 << 20) and "50 MiB" in why
    # not a DiskFull (an OSError's ENOSPC): nothing known besides
    assert room_needed(OSError(28, "No space left on device")) == (ROOM_NEEDED, "")


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
