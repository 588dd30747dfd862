"""Creating the topics the sink publishes to (``create_topics = true``), over one admin client
kept open.

Starting an admin client asks the broker for the whole cluster's metadata, and listing the
topics asked for it again: with thousands of topics (a migration tool's shadow tables, each
with a topic of its own) every table's first change decoded megabytes of metadata on the
service's event loop, which serves the clients too. The sink now keeps one client, asks the
broker to create a topic, and takes "already exists" as the answer it is.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka.connect import common

log = logging.getLogger("cdcserver.sinks.kafka")


class TopicCreator:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._admin: AIOKafkaAdminClient | None = None

    async def create(self, names: list[str], partitions: int, compact: bool = False) -> None:
        """Create the topics of ``names`` that do not exist yet, with ``partitions``
        partitions (``compact``: ``cleanup.policy=compact``, for topics read for each key's
        last value). A broker's answer it may change (a timeout, another controller) raises,
        to be tried again; one it will not (a policy, an authorization) is logged, and the
        topic is then left to the broker (``auto.create.topics.enable``) or to the operator."""
        configs = {"cleanup.policy": "compact"} if compact else {}
        admin = await self._started()
        try:
            response = await admin.create_topics(
                [NewTopic(n, partitions, self.config.replication_factor, topic_configs=configs)
                 for n in names])
        except BaseException:
            await self.close()  # a client whose connection is in doubt is not kept
            raise
        for topic, code, *message in response.topic_errors:
            if code in (0, TopicAlreadyExistsError.errno):
                continue
            error = for_code(code)
            said = f": {message[0]}" if message and message[0] else ""
            if error.retriable:
                raise error(f"creating the topic {topic}{said}")
            log.warning("kafka: the broker refused to create the topic %s (%s%s)", topic,
                        error.__name__, said)

    async def _started(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**common(self.config))
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self._admin = admin
        return self._admin

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()


async def create_topics(config: KafkaConfig, names: list[str], partitions: int,
                        compact: bool = False) -> None:
    """:meth:`TopicCreator.create` once, with a client of its own."""
    creator = TopicCreator(config)
    try:
        await creator.create(names, partitions, compact)
    finally:
        await creator.close()
