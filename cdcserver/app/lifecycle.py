"""Components: the service's long-lived parts, each started and stopped as one.

A component is built complete in its constructor from what it needs, and does nothing until
:meth:`Component.start`. :func:`running` starts a list of them in order under one
``AsyncExitStack``; the stack stops the ones that started in reverse order, also when a later
one fails to start or the body raises, and the error goes on (hypercorn's ``serve`` and
aiokafka's producer are built the same way). A component whose ``start`` fails cleans up what
it began itself: its ``stop`` is not called.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, Protocol


class Component(Protocol):
    async def start(self) -> None:
        """Begin: bind, open, spawn the loops; raise (having undone its own start) if it
        cannot."""

    async def stop(self) -> None:
        """End what start began; called once, only after start returned."""


@contextlib.asynccontextmanager
async def running(components: Sequence[Component]) -> AsyncIterator[None]:
    """``components`` started in order; on leaving, those started are stopped in reverse."""
    async with contextlib.AsyncExitStack() as stack:
        for component in components:
            await component.start()
            stack.push_async_callback(component.stop)
        yield


class Loops:
    """The background loops of one component: spawned at its start, cancelled at its stop.
    A loop's own failure is its business (it logs); it does not stop the others."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, loop: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(loop, name=name))

    async def cancel(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
