"""Running the service as a process: the event loop (uvloop when installed), stopping on
SIGTERM/SIGINT, saying what a slow shutdown still waits for, and the exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from cdcserver.core.errors import CdcError, ConfigError

log = logging.getLogger("cdcserver")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> int:
    """Run ``main(stop)`` on uvloop (when installed) until it returns or SIGTERM/SIGINT."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watchdog = asyncio.create_task(_report_slow_shutdown(stop))
        try:
            await main(stop)
        finally:
            watchdog.cancel()

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(wrapper())
    except CdcError as exc:
        log.error("%s", exc)
        return EXIT_FAILED if not isinstance(exc, ConfigError) else EXIT_USAGE
    return EXIT_OK


SLOW_SHUTDOWN = 15.0


async def _report_slow_shutdown(stop: asyncio.Event) -> None:
    """If stopping takes long, say what is still running (every SLOW_SHUTDOWN seconds)."""
    await stop.wait()
    while True:
        await asyncio.sleep(SLOW_SHUTDOWN)
        current = asyncio.current_task()
        waiting = [f"{task.get_name()}: {_awaiting(task.get_coro())}"
                   for task in asyncio.all_tasks() if task is not current]
        log.warning("still stopping after %.0fs; waiting for: %s", SLOW_SHUTDOWN,
                    "; ".join(waiting) or "nothing")


def _awaiting(coro: Any) -> str:
    """Where a coroutine is suspended, following what it awaits."""
    chain = []
    while coro is not None and hasattr(coro, "cr_frame") and coro.cr_frame is not None:
        frame = coro.cr_frame
        chain.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}"
                     f":{frame.f_lineno})")
        coro = coro.cr_await
    return " -> ".join(chain) or "?"


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
