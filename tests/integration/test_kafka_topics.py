"""The sink creates its topics over one admin client kept open (cdcserver/sinks/kafka/topics.py),
against a real broker: each new table's topic no longer starts a client and lists the whole
cluster's topics (with thousands of topics, megabytes of metadata decoded on the service's
event loop for every table's first change), an existing topic is no error, and a topic the
broker refuses is said in the log without stopping the sink.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka.topics import TopicCreator
from tests.apache_kafka import ApacheKafka
from tests.helpers import eventually

pytestmark = [pytest.mark.kafka]


async def _partitions(bootstrap: str, prefix: str) -> dict[str, int]:
    """The partitions of each topic named ``prefix...`` (listed first: asking for the
    metadata of a topic by name may create it, where the broker creates topics so)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if t.startswith(prefix)]
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described}


async def _partitions_once_listed(bootstrap: str, prefix: str,
                                  expected: dict[str, int]) -> dict[str, int]:
    """:func:`_partitions`, asked until it gives ``expected`` (or 60 s): a broker answers a
    creation once its controller has it, and lists the topic once its own metadata has
    caught up, which a busy machine delays (CI beside two soaks: the last 2 of 20 topics
    were not listed yet)."""
    return await eventually(lambda: _partitions(bootstrap, prefix),
                            lambda found: found == expected, timeout=60,
                            what=f"the broker to list the topics {prefix}.*")


async def test_new_topics_are_created_over_one_client_without_listing_the_cluster(
        kafka_broker: ApacheKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"topics-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}.t{n}" for n in range(20)]
    started = listed = 0
    real_start, real_list = AIOKafkaAdminClient.start, AIOKafkaAdminClient.list_topics

    async def start(self: AIOKafkaAdminClient) -> None:
        nonlocal started
        started += 1
        await real_start(self)

    async def list_topics(self: AIOKafkaAdminClient) -> list[str]:
        nonlocal listed
        listed += 1
        return await real_list(self)

    monkeypatch.setattr(AIOKafkaAdminClient, "start", start)
    monkeypatch.setattr(AIOKafkaAdminClient, "list_topics", list_topics)
    creator = TopicCreator(KafkaConfig(bootstrap=kafka_broker.bootstrap))
    try:
        for name in names:  # one at a time, as each table's first change asks
            await creator.create([name], 3)
        await creator.create(names[:5], 3)  # again: they exist, which is no error
    finally:
        await creator.close()
    monkeypatch.undo()
    assert (started, listed) == (1, 0)
    expected = {n: 3 for n in names}
    assert await _partitions_once_listed(kafka_broker.bootstrap, prefix, expected) == expected


async def test_a_topic_the_broker_refuses_is_logged_and_the_others_created(
        kafka_broker: ApacheKafka, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"topics-{uuid.uuid4().hex[:8]}"
    # one broker: a replication factor of 3 is refused (INVALID_REPLICATION_FACTOR), for good
    refused = TopicCreator(KafkaConfig(bootstrap=kafka_broker.bootstrap, replication_factor=3))
    creator = TopicCreator(KafkaConfig(bootstrap=kafka_broker.bootstrap))
    try:
        with caplog.at_level(logging.WARNING, logger="cdcserver.sinks.kafka"):
            await refused.create([f"{prefix}.refused"], 1)
        await creator.create([f"{prefix}.kept"], 2)
    finally:
        await refused.close()
        await creator.close()
    assert any(f"refused to create the topic {prefix}.refused" in r.getMessage()
               and "InvalidReplicationFactor" in r.getMessage() for r in caplog.records)
    expected = {f"{prefix}.kept": 2}
    assert await _partitions_once_listed(kafka_broker.bootstrap, prefix, expected) == expected
