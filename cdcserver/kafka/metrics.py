"""The Kafka sink's metrics, read from the sink when Prometheus scrapes.

With ``publisher_lock`` the sink exists only while this instance publishes, and each turn
gets a new one: the counters add up every sink this process had (a replaced sink's figures are
final once it is closed), so they only grow; the gauges are the current sink's, 0 while there
is none (standing by).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cdcserver.core.pipeline import Sink
from cdcserver.kafka.sink import KafkaSink

_COUNTERS = (  # SinkStats field, metric, help
    ("messages", "cdc_kafka_messages", "messages produced (one sent again counts once)"),
    ("acknowledged", "cdc_kafka_messages_acknowledged", "messages the broker acknowledged"),
    ("resent", "cdc_kafka_messages_resent", "messages sent again after a failed delivery"),
    ("reconnects", "cdc_kafka_delivery_failures", "deliveries that failed (the broker did "
     "not acknowledge within request_timeout): each makes the sink reconnect and send "
     "everything unacknowledged again"),
    ("transactions", "cdc_kafka_transactions", "transactions published"),
)


class KafkaCollector(Collector):
    def __init__(self, sinks: Sequence[Sink], capacity: int) -> None:
        self.sinks = sinks  # the service's, as they change
        self.capacity = capacity  # max_buffer_bytes
        self._current: KafkaSink | None = None
        self._before = dict.fromkeys((field for field, _, _ in _COUNTERS), 0)

    def collect(self) -> Iterator[Any]:
        sink = next((s for s in self.sinks if isinstance(s, KafkaSink)), None)
        if sink is not None and sink is not self._current:
            if self._current is not None:  # replaced: its figures are final
                for name in self._before:
                    self._before[name] += getattr(self._current.stats, name)
            self._current = sink
        counted = self._current
        for name, metric, documentation in _COUNTERS:
            value = self._before[name] + (getattr(counted.stats, name) if counted else 0)
            yield CounterMetricFamily(metric, documentation, value=value)
        yield GaugeMetricFamily("cdc_kafka_buffered_bytes", "bytes of messages held until the "
                                "broker acknowledges them", value=sink.buffered_bytes if sink
                                else 0)
        yield GaugeMetricFamily("cdc_kafka_buffer_capacity_bytes", "the most bytes held "
                                "(max_buffer_bytes); then replication waits",
                                value=self.capacity)
        yield GaugeMetricFamily("cdc_kafka_unacknowledged_messages", "messages held until "
                                "the broker acknowledges them",
                                value=sink.held_messages if sink else 0)
        yield GaugeMetricFamily("cdc_kafka_oldest_unacknowledged_seconds", "how long the "
                                "oldest message the broker has not acknowledged has waited "
                                "(0: none)", value=sink.oldest_unacknowledged() if sink else 0)
