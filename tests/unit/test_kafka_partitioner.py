"""The compiled murmur2 gives aiokafka's numbers (and so the Java client's partitions)."""

from __future__ import annotations

import random

import pytest
from aiokafka.partitioner import murmur2 as python_murmur2

from cdcserver.sinks.kafka import partitioner
from mariadb_cdc_client.format.compiled import compiled_module

compiled = compiled_module("cdcserver.sinks.kafka._murmur2", unless_pure_python=False)


@pytest.mark.skipif(compiled is None, reason="the C extensions are not built here")
def test_the_compiled_hash_is_aiokafkas_for_every_length_and_byte():
    rng = random.Random(53)
    keys = [b"", b"\xff", b'{"id":1}', bytes(range(256))] + [
        bytes(rng.randrange(256) for _ in range(n)) for n in range(0, 70) for _ in range(20)]
    assert [compiled.murmur2(k) for k in keys] == [python_murmur2(k) for k in keys]


def test_partitions_are_the_java_clients():
    """Values from Kafka's own tests of its default partitioner
    (Utils.murmur2 of these keys, as Java ints, then toPositive % partitions)."""
    assert partitioner.murmur2(b"21") & 0xFFFFFFFF == (-973932308) & 0xFFFFFFFF
    assert partitioner.murmur2(b"foobar") & 0xFFFFFFFF == (-790332482) & 0xFFFFFFFF
    assert partitioner.partition_of(b"21", 3) == (-973932308 & 0x7FFFFFFF) % 3
