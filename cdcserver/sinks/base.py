"""What every sink is: the questions the pipeline, the runner and the monitoring ask of it.

A sink implements :class:`Sink`: ``open`` gets it ready for a source (a broker is waited for
there), ``starting_at`` says where replication starts, ``apply`` writes changes (not
necessarily durably), ``flush`` makes everything applied durable and returns the position it
covers, ``close`` lets go of what ``open`` took. ``active`` says whether it takes part in
replication now (a Kafka sink behind the publisher lease stands by while another instance
publishes); ``status`` is what ``/health``, ``/metrics`` and ``cdcserver status`` show of it,
asked the same way of every sink. A sink that reads another's results names it in ``after``
and is given each batch after it (:func:`ordered`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cdcserver.core.changes import Change
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import BinlogPosition


class ReplicationControl(Protocol):
    """What a sink may ask of replication: a sink that joins or leaves while the service runs
    (the publisher lease) has replication start over from where every sink stands."""

    def feeding(self) -> bool:
        """Replication runs: not stopped for a purged binlog, nor paused for a full disk."""
        ...

    async def restart(self) -> None: ...


@dataclass(frozen=True)
class SourceInfo:
    """What the sinks learn when replication first reaches the source."""

    mariadb: bool  # MariaDB (True) or MySQL
    control: ReplicationControl | None = None


@dataclass(frozen=True)
class SinkMetric:
    """One figure of a sink for /metrics."""

    name: str
    kind: Literal["counter", "gauge"]
    documentation: str
    value: float


@dataclass(frozen=True)
class SinkStatus:
    name: str
    role: str = ""  # behind a lease: "publisher" or "standby"; "" for a sink always active
    waiting: str = ""  # why it cannot deliver yet ("": it can)
    metrics: tuple[SinkMetric, ...] = field(default=())
    # the Kafka sink's initial snapshot, a table each ({"table", "state", "rows", "total",
    # "seconds"}); empty when it takes none
    snapshot: tuple[dict[str, Any], ...] = field(default=())


class Sink(Protocol):
    name: str
    after: tuple[str, ...]  # the sinks that apply each batch before this one

    @property
    def durable(self) -> BinlogPosition | None: ...

    @property
    def applied(self) -> BinlogPosition | None:
        """Where what it holds ends: a pipeline started again in the same process (a sink
        added, a full disk, a repair that could not reach the source) starts at the
        earliest checkpoint, and skips for each sink what it applied already (its checkpoint,
        for a sink that keeps nothing it has not made durable)."""
        ...

    @property
    def unrepaired(self) -> frozenset[str] | None:
        """The causes (GTIDs) of the repairs not yet placed when :attr:`unrepaired_at` was
        reached, as it recorded them (None: it records none). A pipeline started again gives
        it a repair read again only if its cause is one of them or ``unrepaired_at`` did not
        cover its cause: it holds the others already (of the causes past ``unrepaired_at``,
        the pipeline's placements tell which it holds)."""
        ...

    @property
    def unrepaired_at(self) -> BinlogPosition | None:
        """Where :attr:`unrepaired` was recorded: ``applied`` for a sink that keeps nothing
        past its record (Kafka's last commit); the store's checkpoint, which it passes in a
        pipeline started again in the process. (None: at ``applied``.)"""
        ...

    @property
    def active(self) -> bool: ...

    async def open(self, source: SourceInfo) -> None: ...

    def starting_at(self, position: BinlogPosition) -> None: ...

    async def apply(self, changes: list[Change]) -> None: ...

    async def flush(self) -> BinlogPosition | None: ...

    async def keep_up(self, unrepaired: Callable[[], frozenset[str] | None]) -> None:
        """While no checkpoint may be written (a repair waits for its watermark): the work a
        flush would do that does not move the checkpoint, so that memory does not grow with
        every transaction meanwhile. ``unrepaired()``: the causes of the repairs not yet
        placed as of the last batch this sink was given (None: not known now), for a sink
        that records what it applied beside its checkpoint (:attr:`unrepaired`)."""

    async def close(self) -> None: ...

    def status(self) -> SinkStatus: ...


def ordered(sinks: Sequence[Sink]) -> list[Sink]:
    """The active sinks in the order they must apply a batch: each after the sinks its
    ``after`` names (the Kafka sink numbers versions as the store created them), otherwise
    as given."""
    active = [sink for sink in sinks if sink.active]
    by_name = {sink.name: sink for sink in active}
    result: list[Sink] = []
    visiting: set[str] = set()

    def place(sink: Sink) -> None:
        if sink in result:
            return
        if sink.name in visiting:
            raise ConfigError(f"sinks wait for each other: {sorted(visiting)}")
        visiting.add(sink.name)
        for name in sink.after:
            if name in by_name:
                place(by_name[name])
        visiting.discard(sink.name)
        result.append(sink)

    for sink in active:
        place(sink)
    return result
