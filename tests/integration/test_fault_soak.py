"""The fault soak, short (bench/bench_faults.py runs it long): every kind of
infrastructure fault of tests/faultsoak.py at least once while the chaos workload runs;
nothing lost, nothing doubled, no exit of the service by itself, every fault recovered from,
the resuming client's ledger whole and in order, and so is the ledger's Kafka topic as a
read_committed consumer reads it (the service publishes exactly once to a broker in a
network namespace of its own, whose link the soak cuts too). A failure prints its seed."""

from __future__ import annotations

import asyncio

import pytest

from tests import faultsoak
from tests.apache_kafka import ApacheKafka
from tests.helpers import PASSWORD, USER
from tests.netfault import Host

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

SEED = 5501
KINDS = (*faultsoak.KINDS, *faultsoak.KAFKA_KINDS)


async def test_every_kind_of_fault_once_loses_and_doubles_nothing(tmp_path, users_file: str):
    with Host() as host, Host() as kafka_host:
        server = faultsoak.source_in(host, str(tmp_path / "mariadb"))
        kafka = ApacheKafka(tmp_path / "kafka", host=kafka_host)
        try:
            await asyncio.to_thread(kafka.start)
            server.execute("CREATE DATABASE soak")
            figures = await faultsoak.run(
                server, host, "soak", str(tmp_path / "data"), users_file, USER, PASSWORD,
                seed=SEED, faults=len(KINDS), kinds=KINDS, steps_between=(3, 10),
                fault_seconds=(1.5, 4.0),
                log_path=str(tmp_path / "service.log"), every_kind=True, kafka=kafka,
                kafka_host=kafka_host)
        finally:
            server.stop()
            await asyncio.to_thread(kafka.close)
    print(figures.report())
    assert set(figures.faults) == set(KINDS), figures.faults
    assert figures.kafka_rows == figures.ledger_rows, figures.report()
    assert figures.exact, f"{figures.report()}\nservice log: {tmp_path / 'service.log'}"
