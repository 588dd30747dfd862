"""The fault soak, short (bench/bench_faults.py runs it long): every kind of
infrastructure fault of tests/faultsoak.py at least once while the chaos workload runs;
nothing lost, nothing doubled, no exit of the service by itself, every fault recovered from,
the resuming client's ledger whole and in order. A failure prints its seed."""

from __future__ import annotations

import pytest

from tests import faultsoak
from tests.helpers import PASSWORD, USER
from tests.netfault import Host

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = 5501


async def test_every_kind_of_fault_once_loses_and_doubles_nothing(tmp_path, users_file: str):
    with Host() as host:
        server = faultsoak.source_in(host, str(tmp_path / "mariadb"))
        try:
            server.execute("CREATE DATABASE soak")
            figures = await faultsoak.run(
                server, host, "soak", str(tmp_path / "data"), users_file, USER, PASSWORD,
                seed=SEED, faults=len(faultsoak.KINDS), kinds=faultsoak.KINDS,
                steps_between=(5, 15), log_path=str(tmp_path / "service.log"),
                every_kind=True)
        finally:
            server.stop()
    print(figures.report())
    assert set(figures.faults) == set(faultsoak.KINDS), figures.faults
    assert figures.exact, f"{figures.report()}\nservice log: {tmp_path / 'service.log'}"
