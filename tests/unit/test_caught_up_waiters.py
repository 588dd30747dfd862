"""A client waiting for the store to reach a GTID state (``REQUEST-DATA ... UNTIL``, a stream
caught up to ``AFTER``) is woken by every commit: each wake checks the state's GTIDs from the
first one not reached yet, so a state of many domains costs a commit one check, not one per
domain (100 clients with states of 6,000 domains stalled the event loop 300-480 ms a commit:
found by attack). A new pipeline, started over from a checkpoint, checks them all again."""

from __future__ import annotations

from cdcserver.app.service import _Unreached
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.store.index import StoreIndex


class _Counting(StoreIndex):
    """The store's index (a real one, in the test's directory), counting its checks."""

    checks = 0

    def reached(self, state: GtidState, gtid: Gtid) -> bool:
        self.checks += 1
        return super().reached(state, gtid)


def test_each_wake_checks_from_the_first_gtid_not_reached(tmp_path) -> None:
    index = _Counting(str(tmp_path / "index.sqlite"))
    try:
        target = [Gtid(domain, 1, 5) for domain in range(1000)]
        left = _Unreached(target, index)
        pipeline = object()
        half = GtidState([Gtid(domain, 1, 5) for domain in range(500)])
        assert not left.reached(pipeline, half)
        assert index.checks == 501  # the 500 reached, and the first not
        for _ in range(100):  # commits that reach nothing more of it
            assert not left.reached(pipeline, half)
        assert index.checks == 601
        assert left.reached(pipeline, GtidState(target))
        assert index.checks == 1101
        index.checks = 0  # started over from a checkpoint: reached again from the start
        assert not left.reached(object(), half)
        assert index.checks == 501
        behind = GtidState([Gtid(domain, 1, 4) for domain in range(1000)])
        assert not _Unreached(target, index).reached(pipeline, behind)
    finally:
        index.close()
