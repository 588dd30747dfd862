"""How long to wait before trying again: one policy for every reconnect loop.

The delays double from ``first`` up to ``maximum`` with random jitter (tenacity's
``wait_exponential_jitter``), so services restarted together do not knock on a source or a
broker in step. The loops stay ours (they stop on the service's stop event, fail over between
sources, report their state to ``/health``); tenacity computes the waits.

A connection that fails soon after it succeeded is not a fresh start: ``Backoff`` counts an
attempt as failed until a connection has stayed up ``stable_after`` seconds, so a connection
that the other side keeps cutting (two replicas with one server_id) backs off like one that
never connects, instead of retrying every tenth of a second forever. ``flaps`` counts those
short-lived connections in a row, for the caller to look for a cause that will not heal.
"""

from __future__ import annotations

import time

from tenacity import RetryCallState, wait_exponential_jitter


class Backoff:
    def __init__(self, first: float = 0.1, maximum: float = 30.0,
                 stable_after: float = 10.0) -> None:
        self.first = first
        self.maximum = maximum
        self.stable_after = stable_after
        self._wait = wait_exponential_jitter(multiplier=first, max=maximum, jitter=first)
        self.attempt = 0  # failures since the last stable connection
        self.flaps = 0  # connections in a row that failed within stable_after
        self._connected_at: float | None = None

    def connected(self) -> None:
        self._connected_at = time.monotonic()

    def failed(self) -> float:
        """A failure (to connect, or of a connection): the seconds to wait before the next
        attempt."""
        if self._connected_at is not None:
            lasted = time.monotonic() - self._connected_at
            self._connected_at = None
            if lasted >= self.stable_after:
                self.attempt = self.flaps = 0
            else:
                self.flaps += 1
        self.attempt += 1
        return self.delay(self.attempt)

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (from 1)."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(self._wait(state))
