"""Fuzzing at CI's size (tests/fuzzing.py; bench/bench_fuzz.py runs a million inputs): the
session core and real sockets answer every generated input in the grammar, without a crash,
with memory bounded; the issue's own inputs are replayed; a normal client is served after."""

from __future__ import annotations

import pytest

from cdcserver.protocol.users import UsersFile
from tests import fuzzing, hardening


@pytest.fixture
async def running(tmp_path):
    listener = await hardening.listener(str(tmp_path), auth_timeout=2.0, idle_timeout=5.0)
    UsersFile(str(tmp_path / "cdcusers")).add(fuzzing.VICTIM, fuzzing.VICTIM_PASSWORD,
                                              "shop.other")
    yield listener
    await listener.server.stop()
    listener.store.close()


async def test_generated_inputs_to_the_session_core(running):
    figures = fuzzing.fuzz_core(running, inputs=60_000, seed=36)
    start, end = figures.rss_mib
    assert figures.inputs >= 60_000 and end - start < 64, figures.line()
    await fuzzing.served_afterwards(running, records=2)


async def test_generated_inputs_over_real_sockets(running):
    figures = await fuzzing.fuzz_sockets(running, inputs=3_000, seed=36)
    assert figures.inputs >= 3_000, figures.line()
    await fuzzing.served_afterwards(running, records=2)


async def test_the_issues_inputs_are_answered_and_leak_nothing(running):
    sent = await fuzzing.replay_regression(running)
    assert sent > fuzzing.JUNK_LOGINS
    await fuzzing.served_afterwards(running, records=2)


def test_the_generator_is_seeded():
    assert [fuzzing.Inputs(7).script() for _ in range(3)] == \
        [fuzzing.Inputs(7).script() for _ in range(3)]
