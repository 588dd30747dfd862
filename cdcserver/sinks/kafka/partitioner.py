"""Kafka's default partitioner's hash of a message key (murmur2): compiled
(``_murmur2.pyx``) where the build made it, else aiokafka's, which is pure Python (a few
percent of the sink's thread at full speed)."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka.partitioner import murmur2 as python_murmur2

from mariadb_cdc_client.format.compiled import compiled_module

_compiled = compiled_module("cdcserver.sinks.kafka._murmur2")
murmur2: Callable[[bytes], int] = _compiled.murmur2 if _compiled is not None \
    else python_murmur2


def partition_of(key: bytes, count: int) -> int:
    """The partition the Java client's default partitioner gives ``key`` of ``count``."""
    return (murmur2(key) & 0x7FFFFFFF) % count
