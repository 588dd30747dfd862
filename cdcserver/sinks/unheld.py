"""Of the causes of the repairs not yet placed, those whose repair one sink does not hold
(:meth:`~.pipeline._ReplayFilter.unheld`), kept from one part to the next.

The pipeline asks after every part. A replay after a crash holds thousands of repairs
waiting, one more each cascade, and asking each cause again every part made the replay's time
grow with their square (the exactly-once Kafka test's 9,200 cascades: a quarter of its event
loop). Whether a sink holds a repair changes only when its replay skips a transaction: a
cause naming it may now be recorded as placed, and a repair may have been placed in it. So
a cause is asked once, again only when a transaction it names was skipped since, and every
cause again only when a transaction holding a placement was.
"""

from __future__ import annotations

from collections.abc import Callable

from cdcserver.reread.markers import named


class UnheldCauses:
    """``holds(cause)``: whether the sink holds that repair now; it may turn true as the
    replay skips transactions (told by :meth:`skipped_cause`, :meth:`skipped_placement`)
    and, between those, gives the same answer."""

    def __init__(self, holds: Callable[[str], bool]) -> None:
        self._holds = holds
        self._asked: frozenset[str] = frozenset()
        self._unheld: frozenset[str] = frozenset()
        self._naming: dict[str, set[str]] = {}  # transaction -> unheld causes naming it
        self._skipped: set[str] = set()  # causes' transactions skipped since the last ask
        self._all_again = False

    def skipped_cause(self, transaction: str) -> None:
        """The replay skipped ``transaction``, a repair's cause: causes naming it are asked
        again."""
        self._skipped.add(transaction)

    def skipped_placement(self) -> None:
        """The replay skipped a transaction a repair was placed in: every cause is asked
        again (which repairs were placed there is not indexed)."""
        self._all_again = True

    def of(self, causes: frozenset[str]) -> frozenset[str]:
        """Those of ``causes`` whose repair the sink does not hold."""
        if self._all_again:
            self._all_again, self._asked, self._unheld = False, frozenset(), frozenset()
            self._naming.clear()
        elif causes is self._asked and not self._skipped:
            return self._unheld
        kept = self._unheld & causes
        maybe = {c for t in self._skipped for c in self._naming.get(t, ())} & kept
        self._skipped.clear()
        unheld = (kept - {c for c in maybe if self._holds(c)}) | \
            {c for c in causes - self._asked if not self._holds(c)}
        self._index(unheld)
        self._asked, self._unheld = causes, frozenset(unheld)
        return self._unheld

    def _index(self, unheld: frozenset[str]) -> None:
        for cause in self._unheld - unheld:
            for transaction in named(cause):
                naming = self._naming.get(transaction)
                if naming is not None:
                    naming.discard(cause)
                    if not naming:
                        del self._naming[transaction]
        for cause in unheld - self._unheld:
            for transaction in named(cause):
                self._naming.setdefault(transaction, set()).add(cause)
