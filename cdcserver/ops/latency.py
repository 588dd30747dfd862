"""Commit latency: from a transaction's commit on the source to the moment the store shows it
(``cdc_commit_to_store_seconds``), and to the moment it is written to a client following the
table (``cdc_commit_to_client_seconds``).

The source's commit time is the binlog event header's timestamp, in whole seconds
(https://mariadb.com/kb/en/2-binlog-event-header/): each figure is the true latency plus the
commit's fraction of a second, so it over-states by up to 1 s, and the buckets start at 1 s.
A source clock ahead of this host's makes a latency negative; it counts as 0.

Both hooks run on the event loop (the pipeline after each sink's ``apply``, the tails and
streams after each write), so the histograms are plain counters read at scrape time, as the
other metrics are. A batch of transactions committed in the same second is one observation
with a count, which keeps a catch-up of millions of transactions cheap.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from cdcserver.core.changes import Abort, Change, Commit, Rows
from cdcserver.core.names import TableName

STORE_SINK = "avro"  # the pipeline sink whose apply makes a transaction visible to clients
BUCKETS = (1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_RESOLUTION = ("the source's commit time has 1 s resolution, so each figure is up to 1 s "
               "more than the true latency")


class LatencyHistogram:
    """A Prometheus histogram observed in bulk: ``count`` observations of one value."""

    def __init__(self, name: str, documentation: str,
                 buckets: Sequence[float] = BUCKETS) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, seconds: float, count: int = 1) -> None:
        seconds = max(0.0, seconds)
        self.counts[bisect.bisect_left(self.bounds, seconds)] += count
        self.sum += seconds * count

    def family(self) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                     sum_value=self.sum)


class CommitLatency(Collector):
    """Both histograms, and what they need: for each table, the source commit time of the
    newest transaction the store shows for it."""

    def __init__(self) -> None:
        self.to_store = LatencyHistogram(
            "cdc_commit_to_store_seconds", "from a transaction's commit on the source to the "
            f"moment the store shows it to clients ({_RESOLUTION})")
        self.to_client = LatencyHistogram(
            "cdc_commit_to_client_seconds", "from a transaction's commit on the source to "
            "the moment it is written to a client following its table, one observation per "
            f"write, for the newest transaction it carries ({_RESOLUTION})")
        self._visible: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[HistogramMetricFamily]:
        yield self.to_store.family()
        yield self.to_client.family()

    def applied(self, sink: str, changes: list[Change]) -> None:
        """The pipeline's hook: ``sink`` applied ``changes``; the store's commits are visible
        from now on."""
        if sink != STORE_SINK:
            return
        now = time.time()
        touched: set[tuple[str, str]] = set()
        second, count = 0, 0  # a run of commits within one second of the source's clock
        for change in changes:
            if isinstance(change, Rows):
                touched.add((change.layout.database, change.layout.table))
            elif isinstance(change, Commit):
                if change.timestamp != second and count:
                    self.to_store.observe(now - second, count)
                    count = 0
                second = change.timestamp
                count += 1
                for table in touched:
                    self._visible[table] = second
                touched.clear()
            elif isinstance(change, Abort):
                touched.clear()
        if count:
            self.to_store.observe(now - second, count)

    def delivered(self, table: TableName, writes: int) -> None:
        """The listener's hook: ``writes`` clients were just sent what the store shows of
        ``table``."""
        second = self._visible.get((table.database, table.table))
        if second is not None and writes:
            self.to_client.observe(time.time() - second, writes)
