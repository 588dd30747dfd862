"""The Kafka sink's initial snapshot, its rule: a table's changes are published from its dump's
point on; what a transaction that started before the point did is in the dump's rows."""

from __future__ import annotations

import os

from cdcserver.core.changes import (
    Begin,
    ColumnDef,
    Commit,
    Ddl,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.sinks.kafka.dumpevents import marker
from cdcserver.sinks.kafka.snapshot import PointFilter, SnapshotState, TablePoint


def _layout(table: str) -> TableLayout:
    return TableLayout("db", table, (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))


def _transaction(sequence: int, pos: int, *changes: object) -> list[object]:
    gtid = Gtid(0, 1, sequence)
    return [Begin(gtid, 0, file="bin.000001", pos=pos), *changes,
            Commit(BinlogPosition(GtidState([gtid]), "bin.000001", pos + 90), 0)]


def _rows(table: str, key: int) -> Rows:
    return Rows(_layout(table), RowsKind.INSERT, 0, [(key,)])


def _kept_rows(changes: list[object]) -> list[tuple[str, int]]:
    return [(c.layout.table, c.rows[0][0]) for c in changes if isinstance(c, Rows)]


def test_each_tables_changes_before_its_own_point_are_dropped():
    points = {TableName("db", "a"): TablePoint("bin.000001", 1000, "0-1-10", "/a.dump"),
              TableName("db", "b"): TablePoint("bin.000001", 2000, "0-1-20", "/b.dump")}
    keep = PointFilter(points)
    batch = [*_transaction(9, 900, _rows("a", 1), _rows("b", 1), _rows("c", 1)),
             *_transaction(11, 1000, _rows("a", 2), _rows("b", 2)),  # starts at a's point
             *_transaction(21, 2000, _rows("a", 3), _rows("b", 3))]
    kept = keep(batch)  # type: ignore[arg-type]
    assert _kept_rows(kept) == [("c", 1), ("a", 2), ("a", 3), ("b", 3)]
    assert sum(isinstance(c, Commit) for c in kept) == 3  # the positions are all kept
    assert keep.points == {}  # past every point: nothing more to look at


def test_a_statement_is_dropped_only_when_every_table_it_names_is_held():
    keep = PointFilter({TableName("db", "a"): TablePoint("bin.000001", 1000, "0-1-10", "/a")})
    alter_a = Ddl("db", "ALTER TABLE a ADD c INT", 0, "alter",
                  (TableChange("alter", "db", "a", _layout("a")),))
    rename = Ddl("db", "RENAME TABLE a TO x, c TO y", 0, "rename",
                 (TableChange("drop", "db", "a"), TableChange("create", "db", "y")))
    kept = keep(_transaction(5, 500, alter_a, rename))  # type: ignore[arg-type]
    assert [c for c in kept if isinstance(c, Ddl)] == [rename]


def test_without_binlog_positions_the_gtid_state_decides():
    keep = PointFilter({TableName("db", "a"): TablePoint("", 0, "0-1-10", "/a")})
    batch = []
    for sequence in (10, 11):
        gtid = Gtid(0, 1, sequence)
        batch += [Begin(gtid, 0), _rows("a", sequence),
                  Commit(BinlogPosition(GtidState([gtid]), "", 0), 0)]
    assert _kept_rows(keep(batch)) == [("a", 11)]  # type: ignore[arg-type]


def test_the_points_are_read_back_as_written(tmp_path):
    path = os.path.join(tmp_path, "state", "kafka-snapshot.json")
    state = SnapshotState(path)
    state.points[TableName("d", "t")] = TablePoint("mysql-bin.000002", 400, "0-1-9", "/x")
    # names with dots: two tables that "d.v1.t" would name alike
    state.points[TableName("d.v1", "t")] = TablePoint("mysql-bin.000002", 500, "0-1-10")
    state.points[TableName("d", "v1.t")] = TablePoint("mysql-bin.000002", 600, "0-1-11")
    state.joined = True
    state.save()
    again = SnapshotState(path)
    assert again.points == state.points and again.joined
    with open(path, "w") as f:  # as a version before references wrote it: split at a dot
        f.write('{"joined": true, "tables": {"d.t": {"file": "f", "pos": 4, "gtid": "0-1-1"}}}')
    assert list(SnapshotState(path).points) == [TableName("d", "t")]
    state.save()
    assert again.earliest() == BinlogPosition(GtidState.parse("0-1-9"), "mysql-bin.000002", 400)
    again.discard()
    assert not os.path.exists(path) and not SnapshotState(path).points


def test_debeziums_snapshot_markers():
    assert [marker(n, 3, True, False) for n in (1, 2, 3)] == [
        "first", "true", "last_in_data_collection"]
    assert [marker(n, 2, False, True) for n in (1, 2)] == ["first_in_data_collection", "last"]
    assert marker(1, 1, True, True) == "last"
