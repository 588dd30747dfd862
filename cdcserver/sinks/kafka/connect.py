"""Connections to Kafka from the configuration: producers, consumers, the admin client.

aiokafka speaks the Kafka protocol; this module only turns ``[kafka]`` settings into its
arguments (TLS context, SASL credentials, batching) in one place, so the sink, the position
recovery and the tests connect the same way.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import IllegalOperation, KafkaError

from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka import compression


def common(config: KafkaConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"bootstrap_servers": config.bootstrap.split(","),
                              "client_id": config.client_id,
                              "security_protocol": config.security_protocol}
    if config.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        kwargs["ssl_context"] = create_ssl_context(
            cafile=config.ssl_cafile or None, certfile=config.ssl_certfile or None,
            keyfile=config.ssl_keyfile or None)
    if config.security_protocol.startswith("SASL"):
        kwargs.update(sasl_mechanism=config.sasl_mechanism,
                      sasl_plain_username=config.sasl_username,
                      sasl_plain_password=config.sasl_password())
    return kwargs


def producer(config: KafkaConfig, transactional_id: str | None = None) -> AIOKafkaProducer:
    """A producer; with ``transactional_id`` a transactional one (its ``start`` fences every
    earlier producer with that id and aborts its open transaction)."""
    acks: Any = "all" if config.acks == "all" else int(config.acks)
    compression.install()  # the Java client's levels, not aiokafka's
    transactional: dict[str, Any] = {}
    if transactional_id is not None:
        transactional = {"transactional_id": transactional_id,
                         "transaction_timeout_ms": int(config.transaction_timeout * 1000)}
    return AIOKafkaProducer(
        **common(config), **transactional, acks=acks, enable_idempotence=config.idempotence,
        compression_type=None if config.compression == "none" else config.compression,
        linger_ms=config.linger_ms, max_batch_size=config.max_batch_bytes,
        max_request_size=max(config.max_batch_bytes, config.max_message_bytes + 65536,
                             1 << 20),
        request_timeout_ms=int(config.request_timeout * 1000))


# What a transactional producer raises once its transaction manager holds a fatal error (its
# sender died, fenced by another instance or failing): a send refused as "not in transaction",
# a begin refused by an assertion on the state transition.
REFUSALS = (IllegalOperation, AssertionError)


def refusal(producer: Any, error: BaseException) -> BaseException:
    """``error`` as the sink handles failures: a refusal becomes a :class:`KafkaError`
    caused by what killed the producer's sender (``ProducerFenced``: another instance), so
    that a fenced instance stops instead of fencing the other back; other errors as they are.
    (aiokafka keeps that cause on its sender task only.)"""
    if not isinstance(error, REFUSALS):
        return error
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    cause: BaseException = error
    if task is not None and task.done() and not task.cancelled() and task.exception():
        cause = task.exception()
    failure = KafkaError(f"the producer refuses to send ({error}): {cause!r}")
    failure.__cause__ = cause
    return failure


def consumer(config: KafkaConfig, **kwargs: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**common(config), enable_auto_commit=False,
                            auto_offset_reset="earliest", **kwargs)
