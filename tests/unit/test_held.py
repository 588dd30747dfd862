"""The changes a repair beside the stream holds (``cdcserver/reread/held.py``): in a file, in
their order, read back a share at a time, decoded, and gone with the repair."""

from __future__ import annotations

import datetime as dt
import os
import threading
from decimal import Decimal

from cdcserver.core.changes import (
    ColumnDef,
    Commit,
    RowImages,
    Rowless,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.mariadb.constants import ColumnType
from cdcserver.reread.beside import BesideRepair
from cdcserver.reread.held import HeldChanges

LAYOUT = TableLayout("shop", "items", (ColumnDef("id", ColumnType.LONG, nullable=False),
                                       ColumnDef("price", ColumnType.NEWDECIMAL)), (0,))


def _rows(first: int, count: int, kind: RowsKind = RowsKind.INSERT) -> Rows:
    return Rows(LAYOUT, kind, 1_700_000_000, [(i, Decimal(f"{i}.50"))
                                              for i in range(first, first + count)],
                "mysql-bin.000001", 1000 + first, start=900 + first)


def test_changes_come_back_in_their_order_a_share_at_a_time(tmp_path):
    held = HeldChanges(str(tmp_path / "r.held"))
    for n in range(10):
        held.add(_rows(n * 3, 3))
    assert held and held.rows == 30
    first = held.take(7)  # whole entries: 3 + 3 + 3 rows, the first past the limit
    assert [r.rows[0][0] for r in first] == [0, 3, 6] and held.rows == 21
    held.add(_rows(100, 2, RowsKind.DELETE))  # joins the end of the line meanwhile
    rest = held.take(1000)
    assert [r.rows[0][0] for r in rest] == [9, 12, 15, 18, 21, 24, 27, 100]
    assert rest[-1].kind == RowsKind.DELETE and rest[-1].rows[1] == (101, Decimal("101.50"))
    assert (rest[0].file, rest[0].pos, rest[0].start) == ("mysql-bin.000001", 1009, 909)
    assert not held and held.rows == 0 and held.held == 32
    assert held.take(10) == []
    held.close()


def test_undecoded_images_are_not_kept(tmp_path):
    held = HeldChanges(str(tmp_path / "r.held"))
    images = RowImages(b"\x00" * 64, 0, 64)
    held.add(Rows(LAYOUT, RowsKind.INSERT, 0, [(1, Decimal("1"))], images=images))
    (back,) = held.take(10)
    held.close()
    assert back.images is None and list(back.rows) == [(1, Decimal("1"))]


def test_the_file_goes_with_the_repair(tmp_path):
    path = str(tmp_path / "r.held")
    held = HeldChanges(path)
    held.add(_rows(0, 1))
    assert os.path.exists(path)
    held.close()
    held.close()  # twice: the repair's cancel and close both end it
    assert not os.path.exists(path)


def test_released_changes_are_marked_and_count_as_placed(tmp_path):
    """A repair beside the stream lets its held changes go, after its records: those the
    source's read held already are dropped, the others are marked released (a sink that
    holds the repair from before a restart had them where they were). A repair with no
    difference to place counts as placed in part once one is out: the exactly-once Kafka
    sink commits then only once all of it is (a record calling it not placed would have a
    replay give that sink its records again, which fold in what it was released)."""
    marker = Rowless("shop", "items", "MODIFY a rewrites its values", layout=LAYOUT)
    repair = BesideRepair([marker], "0-1-7", None, None, None, [],  # type: ignore[arg-type]
                          str(tmp_path / "r"), threading.Event())
    repair.point = SnapshotPoint(GtidState([Gtid(0, 1, 9)]), "mysql-bin.000001", 1003,
                                 dt.datetime.now(dt.UTC))
    for first in (1, 5, 9):  # ending at 1001, 1005, 1009: the first is the read's already
        repair.held.add(_rows(first, 1))
    assert not repair.placed_any
    commit = Commit(BinlogPosition(GtidState([Gtid(0, 1, 12)]), "mysql-bin.000001", 2000), 0)
    out = repair.release(commit)
    assert [r.rows[0][0] for r in out] == [5, 9] and repair.dropped == 1
    assert all(r.released == "0-1-7" and (r.file, r.pos, r.start) == ("mysql-bin.000001",
                                                                       2000, 0) for r in out)
    assert repair.placed_any
    repair.close()


def test_a_transaction_discarded_takes_back_what_it_held(tmp_path):
    """Review of c83efe8: an ``Abort`` (the stream reads the open transaction again, after
    a reconnect or a rollback the binlog holds) left the changes it held in the file, to be
    released twice, or though rolled back."""
    held = HeldChanges(str(tmp_path / "r.held"))
    held.begin()
    held.add(_rows(0, 2))
    held.begin()  # the next transaction
    held.add(_rows(10, 3))
    held.add(_rows(20, 1))
    held.roll_back()
    assert held.rows == 2 and held.held == 2
    held.begin()  # read again, the part that stands
    held.add(_rows(10, 3))
    assert [r.rows[0][0] for r in held.take(100)] == [0, 10] and not held
    held.roll_back()  # nothing of its own left to take back once read
    assert not held and held.held == 5
    held.close()
