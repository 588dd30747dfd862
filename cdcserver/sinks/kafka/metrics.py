"""The Kafka sink's figures for /metrics, as its :meth:`status` reports them.

With ``publisher_lock`` a sink exists only while this instance publishes, and each turn gets
a new one: the lease (:mod:`cdcserver.sinks.kafka.publisher`) adds up the counters of every
sink this process had (:class:`Totals`), so they only grow; the gauges are the current sink's,
0 while there is none (standing by).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cdcserver.sinks.base import SinkMetric


@dataclass
class SinkStats:
    """Counted as it happens (:meth:`KafkaSink.status` reports them)."""

    messages: int = 0  # produced (a message sent again after a failure counts once)
    acknowledged: int = 0
    resent: int = 0  # sent again after a failed delivery
    reconnects: int = 0  # failed deliveries: each one reconnects and sends again
    transactions: int = 0
    commits: int = 0  # Kafka transactions committed (exactly-once)
    rewinds: int = 0  # Kafka transactions aborted: publishing again from the last commit
    new_epochs: int = 0  # producers started again after a commit sent twice (exactly-once)
    topics: set[str] = field(default_factory=set)


class Measured(Protocol):
    """What the figures read of a sink (:class:`~cdcserver.sinks.kafka.sink.KafkaSink`)."""

    stats: SinkStats

    @property
    def buffered_bytes(self) -> int: ...

    @property
    def held_messages(self) -> int: ...

    def oldest_unacknowledged(self) -> float: ...


COUNTERS = (  # SinkStats field, metric, help
    ("messages", "cdc_kafka_messages", "messages produced (one sent again counts once)"),
    ("acknowledged", "cdc_kafka_messages_acknowledged", "messages the broker acknowledged"),
    ("resent", "cdc_kafka_messages_resent", "messages sent again after a failed delivery"),
    ("reconnects", "cdc_kafka_delivery_failures", "deliveries that failed (the broker did "
     "not acknowledge within request_timeout): each makes the sink reconnect and send "
     "everything unacknowledged again"),
    ("transactions", "cdc_kafka_transactions", "transactions published"),
    ("commits", "cdc_kafka_commits", "Kafka transactions committed (exactly-once delivery)"),
    ("rewinds", "cdc_kafka_rewinds", "Kafka transactions aborted after a failure "
     "(exactly-once): the sink publishes again from its last commit"),
    ("new_epochs", "cdc_kafka_producer_epochs", "producers started again in a new epoch after "
     "a commit slow enough for its request to have timed out and been sent again "
     "(exactly-once): the epoch fences the first copy, which the network may still deliver"),
)


class Totals:
    """Counters over the sinks one after the other: a replaced sink's figures are final."""

    def __init__(self) -> None:
        self._before = dict.fromkeys((name for name, _, _ in COUNTERS), 0)

    def retire(self, stats: SinkStats) -> None:
        for name in self._before:
            self._before[name] += getattr(stats, name)

    def figures(self, current: Measured | None, capacity: int) -> tuple[SinkMetric, ...]:
        stats = current.stats if current is not None else None
        counters = [SinkMetric(metric, "counter", documentation,
                               self._before[name] + (getattr(stats, name) if stats else 0))
                    for name, metric, documentation in COUNTERS]
        return (*counters, *gauges(current, capacity))


def gauges(sink: Measured | None, capacity: int) -> tuple[SinkMetric, ...]:
    return (
        SinkMetric("cdc_kafka_buffered_bytes", "gauge", "bytes of messages held until the "
                   "broker acknowledges them", sink.buffered_bytes if sink else 0),
        SinkMetric("cdc_kafka_buffer_capacity_bytes", "gauge", "the most bytes held "
                   "(max_buffer_bytes); then replication waits", capacity),
        SinkMetric("cdc_kafka_unacknowledged_messages", "gauge", "messages held until the "
                   "broker acknowledges them", sink.held_messages if sink else 0),
        SinkMetric("cdc_kafka_oldest_unacknowledged_seconds", "gauge", "how long the oldest "
                   "message the broker has not acknowledged has waited (0: none)",
                   sink.oldest_unacknowledged() if sink else 0),
    )
