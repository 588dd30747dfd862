"""A bounded hand-over of change batches from the replication thread to the event loop.

The replication thread blocks in :meth:`Handoff.put` while the batches in flight exceed the
capacity (in binlog bytes), so a slow sink slows the binlog reader instead of growing memory.
The consumer takes everything available at once; the producer wakes it only when it is
actually waiting, so a busy pipeline costs one lock per batch and no loop wake-ups.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from cdcserver.core.changes import Change


class HandoffClosed(Exception):
    """The consumer is gone; the producer should stop."""


class Handoff:
    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int = 8 << 20) -> None:
        self._loop = loop
        self.capacity = capacity
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._batches: deque[list[Change]] = deque()
        self._weight = 0
        self._finished = False
        self._error: BaseException | None = None
        self._closed = False
        self._consumer_waiting = False
        self._wakeup = asyncio.Event()

    @property
    def in_flight(self) -> int:
        """Binlog bytes handed over and not yet taken (the queue depth metric)."""
        return self._weight

    @property
    def waiting(self) -> bool:
        """Whether :meth:`get` would answer at once (batches wait, or the stream ended)."""
        with self._lock:
            return bool(self._batches) or self._finished

    # -- producer (replication thread) -------------------------------------------------

    def put(self, batch: list[Change], weight: int) -> None:
        with self._lock:
            while (self._batches and self._weight + weight > self.capacity
                   and not self._closed):
                self._space.wait()
            if self._closed:
                raise HandoffClosed
            self._batches.append(batch)
            self._weight += weight
            self._wake_consumer()

    def finish(self, error: BaseException | None = None) -> None:
        """No more batches: the stream ended, or failed with ``error``."""
        with self._lock:
            self._finished = True
            self._error = error
            self._wake_consumer()

    def _wake_consumer(self) -> None:
        if self._consumer_waiting:
            self._consumer_waiting = False
            try:
                self._loop.call_soon_threadsafe(self._wakeup.set)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    # -- consumer (event loop) ---------------------------------------------------------

    async def get(self) -> list[list[Change]]:
        """All batches available, waiting for at least one. ``[]`` when the stream ended;
        raises the producer's error once everything before it was taken."""
        while True:
            with self._lock:
                if self._batches:
                    batches = list(self._batches)
                    self._batches.clear()
                    self._weight = 0
                    self._space.notify_all()
                    return batches
                if self._finished:
                    if self._error is not None:
                        raise self._error
                    return []
                self._consumer_waiting = True
                self._wakeup.clear()
            await self._wakeup.wait()

    def close(self) -> None:
        """The consumer stops: a blocked or later ``put`` raises HandoffClosed."""
        with self._lock:
            self._closed = True
            self._space.notify_all()
