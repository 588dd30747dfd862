"""The waiting repairs kept in watermark order (:class:`PendingRepairs`) answer as a walk over
all of them does (the walk the repair stage made before, which grew with the square of the
repairs in a long replay), over seeded random sequences of repairs, row events and commits."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.difference import Scope, Stand, past_watermark
from cdcserver.reread.pendingrepairs import Pending, PendingRepairs

TABLES = [TableName("db", name) for name in ("a", "b", "c")]
TAKEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _point(rng: random.Random) -> SnapshotPoint:
    file = f"mysql-bin.{rng.randint(1, 3):06d}"
    sequence = rng.randint(1, 20)
    return SnapshotPoint(GtidState([Gtid(0, 1, sequence)]), file, sequence * 100, TAKEN)


def _repair(rng: random.Random, n: int) -> Pending:
    tables = rng.sample(TABLES, rng.randint(1, 2))
    cause = f"0-1-{rng.randint(1, 12)}"  # (causes repeat: one transaction, several repairs)
    return Pending(_point(rng), cause, [Scope(t, None, "CASCADE", None) for t in tables],
                   [], started=float(n))


def _stand(rng: random.Random) -> Stand:
    sequence = rng.randint(1, 20)
    file = "" if rng.random() < 0.2 else f"mysql-bin.{rng.randint(1, 3):06d}"
    # at a watermark's GTID state but an earlier offset now and then: reached by its state
    pos = sequence * 100 - (rng.choice((0, 0, 50)) if file else 0)
    return Stand(BinlogPosition(GtidState([Gtid(0, 1, sequence)]), file, pos))


@pytest.mark.parametrize("seed", range(40))
def test_every_question_is_answered_as_a_walk_over_all_of_them(seed):
    rng = random.Random(seed)
    walked: list[Pending] = []
    kept = PendingRepairs()
    for n in range(300):
        choice = rng.random()
        if choice < 0.4:
            repair = _repair(rng, n)
            walked.append(repair)
            kept.add(repair)
        elif choice < 0.5 and walked:
            repair = rng.choice(walked)
            walked.remove(repair)
            kept.remove(repair)
        elif choice < 0.8:
            table = rng.choice(TABLES)
            stand = _stand(rng)
            file, pos = stand.position.file, stand.position.pos
            before = [p for p in walked if table in p.tables and
                      not past_watermark(file, pos, p.point)]
            passed = [p for p in walked if table in p.tables and
                      past_watermark(file, pos, p.point)]
            assert _ids(kept.before(table, file, pos)) == sorted(_ids(before)), seed
            assert _ids(kept.passed(table, file, pos)) == sorted(_ids(passed)), seed
            assert kept.concerns(table) == any(table in p.tables for p in walked)
        else:
            stand = _stand(rng)
            due = [p for p in walked if stand.reached(p.point)]
            walked = [p for p in walked if not any(p is d for d in due)]
            assert kept.take_reached(stand) == due, seed  # (in the order they came)
        assert list(kept) == walked, seed
        assert kept.causes() == frozenset(p.cause for p in walked), seed
        assert len(kept) == len(walked) and bool(kept) == bool(walked)


def test_the_cause_set_is_the_same_object_until_a_repair_comes_or_goes():
    rng = random.Random(7)
    kept = PendingRepairs([_repair(rng, n) for n in range(5)])
    causes = kept.causes()
    assert kept.causes() is causes
    kept.add(_repair(rng, 6))
    assert kept.causes() is not causes


def _ids(repairs: list[Pending]) -> list[float]:
    return sorted(p.started for p in repairs)
