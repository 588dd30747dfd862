"""Slowing down password guessing without ever locking out a correct password.

What is limited is *guesses*: distinct wrong passwords for one user from one address. Each
``(address, user)`` may have its password checked for ``limit`` new passwords within ``window``
seconds at once; a further new password waits for its turn (the moment the oldest of those
leaves the window), and is then checked like any other. A password is never refused for being
right; it may only wait behind guesses for the same user from the same address.

Why this shape:

* A client that keeps retrying one stale password (a misconfigured Spark executor behind the
  same NAT as good ones) spends one guess a window, however often it retries: a repeated
  wrong password teaches an attacker nothing, so it is answered at once and not counted. Its
  neighbours, with other passwords or other user names, are never slowed.
* An attacker gets ``limit`` guesses per ``window`` per user and address, as fast as before,
  whether it uses one connection or a thousand: turns are given out in order, each one later
  than the last, and a correct guess answers as soon as its turn comes.
* Waiting is bounded: a login whose turn is more than ``max_wait`` seconds away is refused
  (``THROTTLED``) without being checked and without taking a turn. That can only happen while
  more than ``limit`` new passwords a window are being tried for that very user from that
  very address, which is guessing, not misconfiguration.

A correct login gives its turn back, so the right password, once it gets in, costs its
neighbours nothing. The table is bounded: the least recently used ``max_keys`` entries are
kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Turn:
    """When an attempt may be checked: ``wait`` seconds from now (0: at once). ``refused``:
    not at all (its turn would be more than ``max_wait`` away); ``wait`` then says when to
    try again."""

    wait: float
    refused: bool = False
    slot: float | None = None  # the turn taken, given back on success; None: not counted


@dataclass
class _Guesses:
    turns: deque[float] = field(default_factory=deque)  # ascending
    wrong: dict[bytes, float] = field(default_factory=dict)  # wrong digest -> last tried


class LoginThrottle:
    def __init__(self, limit: int = 5, window: float = 60.0, max_wait: float = 60.0,
                 max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.max_wait = max_wait
        self.max_keys = max_keys
        self.clock = clock
        self._keys: OrderedDict[tuple[str, str], _Guesses] = OrderedDict()
        self.delayed = 0  # attempts that had to wait for their turn, for the metrics
        self.refused = 0  # attempts refused unchecked

    def turn(self, host: str, user: str, digest: bytes) -> Turn:
        """Take the attempt's turn; call :meth:`failed` or :meth:`succeeded` after checking."""
        now = self.clock()
        guesses = self._guesses(host, user, now)
        if digest in guesses.wrong:
            return Turn(0.0)  # already known wrong: nothing to learn from it
        turns = guesses.turns
        at = now if len(turns) < self.limit else max(now, turns[-self.limit] + self.window)
        if at - now > self.max_wait:
            self.refused += 1
            return Turn(at - now, refused=True)
        turns.append(at)
        if at > now:
            self.delayed += 1
        return Turn(at - now, slot=at)

    def failed(self, host: str, user: str, digest: bytes) -> None:
        now = self.clock()
        guesses = self._guesses(host, user, now)
        guesses.wrong.pop(digest, None)
        guesses.wrong[digest] = now  # most recent last

    def succeeded(self, host: str, user: str, turn: Turn) -> None:
        guesses = self._keys.get((host, user))
        if guesses is not None and turn.slot is not None:
            try:
                guesses.turns.remove(turn.slot)
            except ValueError:
                pass  # already out of the window

    def _guesses(self, host: str, user: str, now: float) -> _Guesses:
        key = (host, user)
        guesses = self._keys.pop(key, None) or _Guesses()
        self._keys[key] = guesses  # most recently used last
        horizon = now - self.window
        while guesses.turns and guesses.turns[0] <= horizon:
            guesses.turns.popleft()
        wrong = guesses.wrong
        while wrong:
            oldest = next(iter(wrong))
            if wrong[oldest] > horizon:
                break
            del wrong[oldest]
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return guesses
