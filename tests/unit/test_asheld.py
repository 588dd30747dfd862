"""Row events between a change without rows and its repair, told against the rows the stream
holds (cdcserver/reread/asheld.py): every before-image is the row held."""

from __future__ import annotations

from cdcserver.core.changes import ColumnDef, Rows, RowsKind, TableLayout
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.reread.asheld import as_held
from cdcserver.reread.view import Views

LAYOUT = TableLayout("shop", "items", (ColumnDef("id", ColumnType.LONG, nullable=False),
                                       ColumnDef("v", ColumnType.LONG)), primary_key=(0,))


def _view(tmp_path):
    views = Views(str(tmp_path / "views.sqlite"))
    view = views.new(TableName("shop", "items"), ("id",))
    for row in ({"id": 1, "v": 1}, {"id": 2, "v": 2}):
        view.put(row)
    return views, view


def _told(result: list[Rows]) -> list[tuple[str, list[tuple[int, ...]]]]:
    return [(r.kind.value, [tuple(row) for row in r.rows]) for r in result]


def test_before_images_are_the_rows_held(tmp_path):
    views, view = _view(tmp_path)
    overlay: dict = {}
    update = Rows(LAYOUT, RowsKind.UPDATE, 0, [(1, 5), (1, 6)])  # the binlog's before: v=5
    assert _told(as_held(update, view, overlay)) == [("update", [(1, 1), (1, 6)])]
    again = Rows(LAYOUT, RowsKind.DELETE, 0, [(1, 6)])  # this transaction's own row, held
    assert _told(as_held(again, view, overlay)) == [("delete", [(1, 6)])]
    views.close()


def test_rows_the_stream_never_had_and_keys_it_holds(tmp_path):
    views, view = _view(tmp_path)
    overlay: dict = {}
    assert _told(as_held(Rows(LAYOUT, RowsKind.DELETE, 0, [(3, 3)]), view, overlay)) == []
    assert _told(as_held(Rows(LAYOUT, RowsKind.UPDATE, 0, [(4, 4), (4, 44)]), view,
                         overlay)) == [("insert", [(4, 44)])]
    assert _told(as_held(Rows(LAYOUT, RowsKind.INSERT, 0, [(2, 22), (5, 5)]), view,
                         overlay)) == [("update", [(2, 2), (2, 22)]), ("insert", [(5, 5)])]
    views.close()


def test_a_change_that_agrees_with_the_rows_held_is_the_same_object(tmp_path):
    views, view = _view(tmp_path)
    rows = Rows(LAYOUT, RowsKind.UPDATE, 0, [(2, 2), (2, 3)])
    assert as_held(rows, view, {}) == [rows]
    views.close()
