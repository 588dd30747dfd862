"""Whether the stream has reached a repair's watermark (``reread.difference.reached``), as
told against thousands of waiting repairs at each commit (``Stand``): the same answer as
the rule's two parts, at or past the watermark's binlog position, or at its GTID state."""

from __future__ import annotations

import datetime as dt

from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.difference import Stand, past_watermark, reached

TAKEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _point(state: str, file: str, pos: int) -> SnapshotPoint:
    return SnapshotPoint(GtidState.parse(state), file, pos, TAKEN)


def _at(state: str, file: str, pos: int) -> BinlogPosition:
    return BinlogPosition(GtidState.parse(state), file, pos)


def test_at_or_past_the_position_is_reached_whatever_the_state():
    point = _point("0-1-10", "bin.000002", 500)
    assert reached(_at("0-1-9", "bin.000002", 500), point)
    assert reached(_at("0-1-9", "bin.000003", 4), point)  # a later file
    assert not reached(_at("0-1-9", "bin.000002", 499), point)
    assert not reached(_at("0-1-9", "bin.000001", 900), point)  # an earlier file


def test_the_same_state_is_reached_before_the_position():
    """The read's position may lie past the last transaction's end (events that are no
    transaction's); the stream stands there once it has the same last transactions."""
    point = _point("0-1-10,1-2-7", "bin.000002", 900)
    assert reached(_at("1-2-7,0-1-10", "bin.000002", 500), point)
    assert not reached(_at("0-1-10,1-2-6", "bin.000002", 500), point)
    assert not reached(_at("0-1-10", "bin.000002", 500), point)  # a domain short
    assert not reached(_at("0-1-10,1-2-7,2-3-1", "bin.000002", 500), point)  # one more
    assert not reached(_at("0-5-10,1-2-7", "bin.000002", 500), point)  # another server's
    assert reached(_at("0-1-10,1-2-7", "", 0), point)  # a position without a file


def test_a_mysql_state_names_its_transactions_by_uuid_and_number():
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    point = _point(f"{uuid}:1-42", "bin.000002", 900)
    same = BinlogPosition(GtidState([Gtid(0, 7, 42, uuid)]), "bin.000002", 10)
    assert reached(same, point)
    assert not reached(BinlogPosition(GtidState([Gtid(0, 7, 41, uuid)]), "bin.000002", 10),
                       point)


def test_one_stand_tells_many_watermarks_as_reached_does_each():
    stand_at = _at("0-1-20", "bin.000002", 2000)
    stand = Stand(stand_at)
    points = [_point(f"0-1-{n}", "bin.000002", 100 * n) for n in range(1, 40)] + \
        [_point("0-1-20", "bin.000002", 5000), _point("0-1-21", "bin.000001", 10)]
    assert [stand.reached(p) for p in points] == [reached(stand_at, p) for p in points]
    assert [p.pos for p in points if stand.reached(p)] == \
        [100 * n for n in range(1, 21)] + [5000, 10]


def test_past_the_watermark_is_strictly_after_its_position():
    point = _point("0-1-10", "bin.000002", 500)
    assert past_watermark("bin.000002", 501, point)
    assert past_watermark("bin.000010", 4, point)  # (ordered by number, not by text)
    assert not past_watermark("bin.000002", 500, point)
    assert not past_watermark("", 900, point)  # no position: not known to be past
