"""The Avro store as a sink of the pipeline.

The store itself lives as long as the service (the listener serves from it even while the
source is unreachable); this is its part in replication: it applies changes, writes
checkpoints, and records where a new store started.
"""

from __future__ import annotations

from collections.abc import Callable

from cdcserver.core.changes import Change
from cdcserver.core.gtid import BinlogPosition
from cdcserver.sinks.base import SinkStatus, SourceInfo
from cdcserver.store.store import AvroStore


class StoreSink:
    name = "avro"
    after: tuple[str, ...] = ()

    def __init__(self, store: AvroStore) -> None:
        self.store = store

    @property
    def durable(self) -> BinlogPosition | None:
        return self.store.durable

    @property
    def applied(self) -> BinlogPosition | None:
        """Every transaction it committed, checkpointed or not (the files hold them)."""
        return self.store.position if self.store.position is not None else self.store.durable

    @property
    def unrepaired(self) -> frozenset[str] | None:
        """None of the repairs of the changes its checkpoint covers is unplaced (none is
        written while one is pending): the empty set, so that a replay from another sink's
        earlier checkpoint gives it none of those again. Past its checkpoint (a pipeline
        started again in the process), what it applied since is told by the pipeline's
        placements (:attr:`unrepaired_at`). None before its first checkpoint: it covers
        nothing."""
        return frozenset() if self.store.durable is not None else None

    @property
    def unrepaired_at(self) -> BinlogPosition | None:
        return self.store.durable

    @property
    def active(self) -> bool:
        return True

    async def open(self, source: SourceInfo) -> None:
        """Nothing to wait for: the service opened the store before the listener."""

    def starting_at(self, position: BinlogPosition) -> None:
        self.store.set_origin(position)

    async def apply(self, changes: list[Change]) -> None:
        self.store.apply_now(changes)

    async def flush(self) -> BinlogPosition | None:
        return await self.store.flush()

    async def keep_up(self, unrepaired: Callable[[], frozenset[str] | None]) -> None:
        await self.store.persist_index()

    async def close(self) -> None:
        """Nothing to let go of: the service closes the store after the listener."""

    def status(self) -> SinkStatus:
        """The store's own figures are the service's (``cdc_store_*``): nothing more here."""
        return SinkStatus(self.name)
