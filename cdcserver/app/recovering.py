"""The service, started over from its checkpoint when the data directory's disk failed under it.

A failed write or fsync in the data directory (:class:`~cdcserver.core.errors.StoreDamaged`)
means what the store wrote since its last checkpoint may not be on disk. The runner pauses
replication until the directory takes a write and an fsync again (the listener serves
meanwhile, and ``/health`` says why); then the service stops, and a new one starts in the
same process from the checkpoint, as a restart after ``kill -9`` would: the store is repaired
back to the checkpoint, the binlog is read again from there, and clients, whose connections
end, resume from their GTID. Nothing the checkpoint covers is lost, nothing is stored twice.

The process does not exit for it: a supervisor has nothing to do, and a disk that fails again
is waited for again (the starts are spaced by a growing backoff). A listener configured on
port 0 (any free port) keeps the port it got, so clients find the service where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from cdcserver.app.diskroom import until_writable
from cdcserver.app.service import Service
from cdcserver.core.config import Config
from cdcserver.core.errors import StoreDamaged
from cdcserver.core.retry import Backoff
from cdcserver.store.layout import DataDir

log = logging.getLogger(__name__)


async def serve(config: Config, stop: asyncio.Event,
                started: Callable[[Service], None] | None = None) -> None:
    """Serve until ``stop`` is set; a failed disk starts the service over (see above).
    ``started`` is told of each service once it runs."""
    backoff = Backoff(first=1.0, maximum=60.0, stable_after=60.0)
    while True:
        service = Service(config)
        backoff.connected()
        try:
            await service.run(stop, started=started)
            return
        except StoreDamaged as exc:
            config = same_ports(config, service)
            log.error("the service stopped: the data directory's disk failed (%s); it "
                      "starts over from its checkpoint once the disk takes a write and "
                      "an fsync", exc)
        if await _stopped_within(stop, backoff.failed()):
            return
        await _writable_or_stopped(config, stop)
        if stop.is_set():
            return
        log.warning("starting over from the checkpoint")


def same_ports(config: Config, service: Service) -> Config:
    """``config`` with each listener given "any free port" pinned to the port it got."""
    def pinned(listen: str, address: tuple[str, int] | None) -> str:
        host, _, port = listen.rpartition(":")
        return f"{host}:{address[1]}" if port == "0" and address is not None else listen

    return replace(
        config,
        listener=replace(config.listener, listen=pinned(config.listener.listen,
                                                        service.listener.address)),
        metrics=replace(config.metrics, listen=pinned(config.metrics.listen,
                                                      service.monitoring.address)),
        admin=replace(config.admin, listen=pinned(config.admin.listen,
                                                  service.admin.address)))


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def _writable_or_stopped(config: Config, stop: asyncio.Event) -> None:
    probe = DataDir(config.store.data_dir).room_probe
    writable = asyncio.ensure_future(until_writable(probe, config.store.disk_full_retry))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({writable, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        writable.cancel()
        stopped.cancel()
