"""The 3-node Apache Kafka cluster of the fault tests (``kafka_cluster``, tests/apache_kafka.py)
does what they rely on: a partition replicated to all three nodes keeps taking writes with
``acks=all`` while its leader is killed (``kill -9``) and after it comes back, and an
idempotent producer's retries leave every message there exactly once, in order.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.apache_kafka import ApacheKafka
from tests.helpers import pace

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MESSAGES = 600


async def _replicas(cluster: ApacheKafka, topic: str, isr: list[int] | None = None
                    ) -> tuple[list[int], list[int]]:
    """(replicas, in-sync replicas) of partition 0, once the node answering knows the
    partition (a topic just created reaches each node's metadata a moment later) and, with
    ``isr``, once the in-sync replicas are those (a dead node leaves them when its session
    expires); as they are after a minute otherwise."""
    replicas: tuple[list[int], list[int]] = ([], [])
    for _ in range(600):
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        if described["partitions"]:
            (partition,) = described["partitions"]
            replicas = sorted(partition["replicas"]), sorted(partition["isr"])
            if isr is None or replicas[1] == isr:
                return replicas
        await pace(0.1)
    return replicas


async def test_the_leader_killed_under_acks_all_loses_and_doubles_nothing(
        kafka_cluster: ApacheKafka) -> None:
    cluster = kafka_cluster
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])
    finally:
        await admin.close()
    assert (await _replicas(cluster, topic))[0] == [1, 2, 3]

    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                enable_idempotence=True, linger_ms=5)
    await producer.start()
    deliveries = []
    try:
        async def produce(first: int, last: int) -> None:
            for n in range(first, last):
                deliveries.append(await producer.send(topic, str(n).encode()))
                await pace(0.005)

        await produce(0, MESSAGES // 3)
        leader = await asyncio.to_thread(cluster.leader_of, topic, 0)
        assert leader in (1, 2, 3)
        # Batches are in flight when it dies; the rest are sent while it is away.
        sending = asyncio.ensure_future(produce(MESSAGES // 3, 2 * MESSAGES // 3))
        await pace(0.1)
        await asyncio.to_thread(cluster.kill, leader)
        await sending
        await asyncio.wait_for(asyncio.gather(*deliveries), 120)
        successor = await asyncio.to_thread(cluster.leader_of, topic, 0)
        assert successor in set(cluster.nodes) - {leader}, successor
        alive = sorted(set(cluster.nodes) - {leader})
        assert (await _replicas(cluster, topic, isr=alive))[1] == alive

        await asyncio.to_thread(cluster.start, leader)
        await produce(2 * MESSAGES // 3, MESSAGES)
        offsets = await asyncio.wait_for(asyncio.gather(*deliveries), 120)
    finally:
        await producer.stop()
    assert [m.offset for m in offsets] == list(range(MESSAGES))  # acknowledged once each

    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        values: list[int] = []
        while len(values) < MESSAGES:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            values += [int(m.value) for ms in batch.values() for m in ms]
        assert (await consumer.end_offsets([partition]))[partition] == MESSAGES
    finally:
        await consumer.stop()
    assert values == list(range(MESSAGES))  # every message, once, in order

    # The restarted node catches up and is in sync again.
    assert (await _replicas(cluster, topic, isr=[1, 2, 3]))[1] == [1, 2, 3]
