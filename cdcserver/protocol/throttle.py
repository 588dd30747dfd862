"""Slowing down password guessing, in budgets that junk logins can neither flush nor fill.

What is limited is *guesses*: new wrong passwords. Each known user at each address may have
``limit`` new passwords checked within ``window`` seconds at once, and each address
``per_address`` in all; a further new password waits for its turn (the moment the oldest of the
budget it exceeds leaves the window), and is then checked like any other. A login whose turn is
more than ``max_wait`` seconds away is refused (``THROTTLED``) without being checked. Logins
for user names that do not exist (junk: any name, each a new one) share one budget per
address, so they create no entry of their own.

Why this shape:

* A client that keeps retrying one stale password (a misconfigured Spark executor behind the
  same NAT as good ones) spends one guess a window, however often it retries: a repeated wrong
  password teaches an attacker nothing, so it is answered at once and not counted.
* An attacker gets ``limit`` guesses per window per user and address, and ``per_address`` per
  address over every user (password spraying), whether it uses one connection or a thousand:
  turns are given out in order, each one later than the last.
* Junk cannot flush the table: unknown names never get an entry of their own, and an entry
  that holds turns or wrong passwords within the window is never evicted (only idle ones
  are, least recently used first), so 10,000 logins with made-up names do not reset
  ``victim``'s budget. When ``max_keys`` entries are all in use (guessing from that many
  addresses at once), a new address shares one budget per user with every other new one:
  memory stays bounded and ``victim`` still gets ``limit`` new passwords a window from them.
  An IPv6 client's address is its /64, which one host can hold whole.
* A password that logged in since the service started is never delayed or refused: it is
  remembered (as a salted hash of name and password, in memory), and a login with it skips
  the budgets. Guessing cannot exploit that: only a correct password is ever remembered, and
  a remembered one that no longer verifies (the users file changed) is forgotten.
* What a correct password not seen yet waits for: only new wrong passwords tried for the same
  user from the same address, or more than ``per_address`` from that address; a correct
  login gives its turn back. Guessing from other addresses, and for other users below the
  address's budget, never delays it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

UNKNOWN = "\x00unknown"  # the budget that logins for names that do not exist share
EVERY_USER = "\x00address"  # the address's budget over every user
OVERFLOW = "\x00overflow"  # the address of every new entry while the table is full
IDLE_SCAN = 64  # the oldest entries looked at for an idle one to evict
MAX_GOOD = 10_000  # correct logins remembered (only a correct password adds one)


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
    wrong: dict[bytes, float] = field(default_factory=dict)  # wrong attempt -> last tried

    def idle(self) -> bool:
        return not self.turns and not self.wrong


class LoginThrottle:
    def __init__(self, limit: int = 5, window: float = 60.0, max_wait: float = 60.0,
                 max_keys: int = 10_000, per_address: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.max_wait = max_wait
        self.max_keys = max_keys
        self.per_address = per_address if per_address is not None else 4 * limit
        self.clock = clock
        self._keys: OrderedDict[tuple[str, str], _Guesses] = OrderedDict()
        self._good: OrderedDict[bytes, None] = OrderedDict()  # logins that succeeded
        self._salt = os.urandom(16)
        self.delayed = 0  # attempts that had to wait for their turn, for the metrics
        self.refused = 0  # attempts refused unchecked

    def turn(self, host: str, user: str, digest: bytes, known: bool = True) -> Turn:
        """Take the attempt's turn; call :meth:`failed` or :meth:`succeeded` after checking.
        ``known``: whether the user exists (a made-up name shares its address's budget)."""
        if self._remembered(user, digest) in self._good:
            return Turn(0.0)  # this password logged in before: never made to wait
        now = self.clock()
        mine = self._guesses(host, user if known else UNKNOWN, now)
        if _attempt(user, digest) in mine.wrong:
            return Turn(0.0)  # already known wrong: nothing to learn from it
        address = self._guesses(host, EVERY_USER, now)
        at = max(self._next(mine, self.limit, now), self._next(address, self.per_address, now))
        if at - now > self.max_wait:
            self.refused += 1
            return Turn(at - now, refused=True)
        for guesses in (mine, address):
            _insert(guesses.turns, at)
        if at > now:
            self.delayed += 1
        return Turn(at - now, slot=at)

    def failed(self, host: str, user: str, digest: bytes, known: bool = True) -> None:
        now = self.clock()
        guesses = self._guesses(host, user if known else UNKNOWN, now)
        attempt = _attempt(user, digest)
        guesses.wrong.pop(attempt, None)
        guesses.wrong[attempt] = now  # most recent last
        self._good.pop(self._remembered(user, digest), None)  # the password changed

    def succeeded(self, host: str, user: str, turn: Turn, digest: bytes = b"") -> None:
        if digest:
            good = self._remembered(user, digest)
            self._good.pop(good, None)
            self._good[good] = None
            while len(self._good) > MAX_GOOD:
                self._good.popitem(last=False)
        if turn.slot is None:
            return
        for key in ((_network(host), user), (_network(host), EVERY_USER),
                    (OVERFLOW, user), (OVERFLOW, EVERY_USER)):
            guesses = self._keys.get(key)
            if guesses is not None:
                try:
                    guesses.turns.remove(turn.slot)
                except ValueError:
                    pass  # already out of the window

    def _remembered(self, user: str, digest: bytes) -> bytes:
        return hashlib.sha256(self._salt + _attempt(user, digest)).digest()

    def _next(self, guesses: _Guesses, limit: int, now: float) -> float:
        turns = guesses.turns
        return now if len(turns) < limit else max(now, turns[-limit] + self.window)

    def _guesses(self, host: str, user: str, now: float) -> _Guesses:
        key = (_network(host), user)
        guesses = self._keys.pop(key, None)
        if guesses is None and len(self._keys) >= self.max_keys and \
                not self._evict_idle(now):
            key = (OVERFLOW, user)  # every entry is in use: new ones share one per user
            guesses = self._keys.pop(key, None)
        guesses = guesses or _Guesses()
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
        return guesses

    def _evict_idle(self, now: float) -> bool:
        """Drop a least recently used entry with nothing in the window (among the oldest
        ``IDLE_SCAN``); False if there is none. An entry still holding turns or wrong
        passwords is never dropped: its budget is what it is there for."""
        horizon = now - self.window
        for key in list(itertools.islice(self._keys, IDLE_SCAN)):
            guesses = self._keys[key]
            if key[0] != OVERFLOW and all(t <= horizon for t in guesses.turns) and \
                    all(t <= horizon for t in guesses.wrong.values()):
                del self._keys[key]
                return True
        return False


class FailureLog:
    """Failed logins in the log, without letting them flood it: the first ``first`` of each
    ``interval`` one line each (the name cut to the longest a user may have, and escaped),
    then one line saying how many more there were, from how many addresses."""

    def __init__(self, log: Callable[..., None], first: int = 10, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.first = first
        self.interval = interval
        self.clock = clock
        self._since = clock()
        self._count = 0
        self._more: set[str] = set()  # the addresses of those not logged one by one

    def failed(self, peer: str, host: str, user: str) -> None:
        now = self.clock()
        if now - self._since >= self.interval:
            self.summary(now)
        self._count += 1
        if self._count <= self.first:
            self.log("%s: authentication failed for user %s", peer, shown_name(user))
        else:
            self._more.add(host)

    def tick(self) -> None:
        """Called now and then: the summary of an interval that has ended."""
        now = self.clock()
        if now - self._since >= self.interval:
            self.summary(now)

    def summary(self, now: float | None = None) -> None:
        """Say how many were not logged one by one, and start a new interval."""
        if self._count > self.first:
            self.log("%d more failed logins in the last %.0f s, from %d addresses",
                     self._count - self.first, self.interval, len(self._more))
        self._since = self.clock() if now is None else now
        self._count = 0
        self._more = set()


def shown_name(user: str, longest: int = 43) -> str:
    """A user name as the log shows it: quoted and escaped (no control character reaches
    the log), cut at ``longest`` characters (a longer one cannot exist)."""
    cut = user[:longest]
    return repr(cut) + (f" (+{len(user) - longest} characters)" if len(user) > longest else "")


def _network(host: str) -> str:
    """The address a budget belongs to: an IPv6 client's /64 (one host may hold all of its
    addresses), any other as it is."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _attempt(user: str, digest: bytes) -> bytes:
    """What a wrong attempt is remembered by: the name and password together (a budget shared
    by made-up names would otherwise take one name's password for another's)."""
    return hashlib.sha1(user.encode("utf-8", "surrogatepass") + b"\x00" + digest).digest()


def _insert(turns: deque[float], at: float) -> None:
    """Keep the turns ascending (a turn given by the address's budget can be earlier than
    the last one of a user's)."""
    if not turns or turns[-1] <= at:
        turns.append(at)
        return
    index = len(turns)
    while index and turns[index - 1] > at:
        index -= 1
    turns.insert(index, at)
