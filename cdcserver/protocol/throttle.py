"""Throttling repeated failed logins, per client address.

After ``limit`` failed authentications from one address within ``window`` seconds, that
address's further attempts are refused for ``lockout`` seconds without being checked, so a
password cannot be guessed at line speed. A success clears the address's failures. The table
of addresses is bounded: the oldest entries go first when it holds ``max_hosts``.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


class LoginThrottle:
    def __init__(self, limit: int = 5, window: float = 60.0, lockout: float = 60.0,
                 max_hosts: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.lockout = lockout
        self.max_hosts = max_hosts
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._locked_until: dict[str, float] = {}

    def wait(self, host: str) -> float:
        """Seconds until ``host`` may try again (0: now)."""
        until = self._locked_until.get(host)
        if until is None:
            return 0.0
        remaining = until - self.clock()
        if remaining <= 0:
            del self._locked_until[host]
            return 0.0
        return remaining

    def failed(self, host: str) -> None:
        now = self.clock()
        failures = self._failures.pop(host, None) or deque()
        failures.append(now)
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if len(failures) >= self.limit:
            self._locked_until[host] = now + self.lockout
            failures.clear()
        else:
            self._failures[host] = failures  # most recent last
        while len(self._failures) > self.max_hosts:
            self._failures.popitem(last=False)
        if len(self._locked_until) > self.max_hosts:
            for stale in [h for h, t in self._locked_until.items() if t <= now]:
                del self._locked_until[stale]

    def succeeded(self, host: str) -> None:
        self._failures.pop(host, None)
