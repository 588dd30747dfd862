"""The causes a sink does not hold, kept from part to part (:class:`UnheldCauses`), are
those asking each cause again would give, over seeded random replays: causes coming and
going (merged ones too), transactions skipped that causes name, and placements skipped."""

from __future__ import annotations

import random

import pytest

from cdcserver.reread.markers import named, together
from cdcserver.sinks.unheld import UnheldCauses


@pytest.mark.parametrize("seed", range(40))
def test_the_causes_kept_are_those_asked_anew(seed):
    rng = random.Random(seed)
    skipped: set[str] = set()  # transactions skipped: a cause naming only those is held
    placed_held: set[str] = set()  # causes whose repair was placed in a transaction skipped

    def holds(cause: str) -> bool:
        return cause in placed_held or all(t in skipped for t in named(cause))

    kept = UnheldCauses(holds)
    waiting: set[str] = set()
    for _ in range(400):
        choice = rng.random()
        if choice < 0.35:
            repairs = [([], f"0-1-{rng.randint(1, 60)}") for _ in range(rng.choice((1, 1, 3)))]
            waiting.add(together(repairs)[1])
        elif choice < 0.5 and waiting:
            waiting.discard(rng.choice(sorted(waiting)))
        elif choice < 0.7:
            transaction = f"0-1-{rng.randint(1, 60)}"
            skipped.add(transaction)
            kept.skipped_cause(transaction)
        elif choice < 0.75 and waiting:
            placed_held.add(rng.choice(sorted(waiting)))
            kept.skipped_placement()
        causes = frozenset(waiting)
        assert kept.of(causes) == frozenset(c for c in causes if not holds(c)), seed
        assert kept.of(causes) == kept.of(causes)  # (asked again: the same answer)


def test_a_cause_is_asked_once_while_nothing_is_skipped():
    asked: list[str] = []

    def holds(cause: str) -> bool:
        asked.append(cause)
        return cause == "0-1-2"

    kept = UnheldCauses(holds)
    assert kept.of(frozenset({"0-1-1", "0-1-2"})) == {"0-1-1"}
    assert kept.of(frozenset({"0-1-1", "0-1-2", "0-1-3"})) == {"0-1-1", "0-1-3"}
    assert sorted(asked) == ["0-1-1", "0-1-2", "0-1-3"]
    kept.skipped_cause("0-1-3")
    kept.of(frozenset({"0-1-1", "0-1-2", "0-1-3"}))
    assert sorted(asked) == ["0-1-1", "0-1-2", "0-1-3", "0-1-3"]
