"""The event builder the Kafka sink formats its messages from: a transaction stays open across
the markers the pipeline puts inside it (a foreign key's cascade, a quarantine, a release),
and only its ``Commit`` or an ``Abort`` ends it.

The fault soak found the builder taking every change it did not know for an ``Abort``: a
transaction whose foreign key cascaded (a ``Rowless`` marker) before more row events stopped
the service with "rows outside a transaction", again at each start."""

from __future__ import annotations

from cdcserver.core.changes import (
    Abort,
    Begin,
    ColumnDef,
    Commit,
    Ddl,
    Quarantine,
    Release,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.mariadb.constants import ColumnType
from cdcserver.messages.events import SHAPES_PER_TABLE, CommitEvent, EventBuilder, RowBatch

LAYOUT = TableLayout("db", "t", (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))
WHEN = 1_700_000_000


def _insert(*ids: int) -> Rows:
    return Rows(LAYOUT, RowsKind.INSERT, 0, [(i,) for i in ids])  # type: ignore[arg-type]


def _commit(gtid: Gtid) -> Commit:
    return Commit(BinlogPosition(GtidState([gtid]), "bin.000001", 100 * gtid.sequence), WHEN)


def _rows(events: list[object]) -> list[tuple[object, int, Gtid]]:
    return [(row.after, row.event_number, row.gtid) for e in events
            if isinstance(e, RowBatch) for row in e.rows]


def test_markers_inside_a_transaction_do_not_end_it():
    gtid = Gtid(0, 1, 7)
    events = list(EventBuilder().events([
        Begin(gtid, WHEN), _insert(1),
        Rowless("db", "child", "a foreign key's cascade"),
        _insert(2),
        Quarantine("db", "other", "its rows do not decode"),
        _insert(3),
        Release("db", "other", "resynced"),
        _insert(4),
        _commit(gtid)]))
    assert _rows(events) == [((1,), 1, gtid), ((2,), 2, gtid), ((3,), 3, gtid),
                             ((4,), 4, gtid)]
    assert isinstance(events[-1], CommitEvent)


def test_a_transaction_split_across_batches_stays_open():
    gtid = Gtid(0, 1, 8)
    builder = EventBuilder()
    first = list(builder.events([Begin(gtid, WHEN), _insert(1), Rowless("db", "c", "fk")]))
    second = list(builder.events([_insert(2), _commit(gtid)]))
    assert _rows(first + second) == [((1,), 1, gtid), ((2,), 2, gtid)]


def test_an_abort_ends_the_transaction_and_it_is_read_again_whole():
    gtid = Gtid(0, 1, 9)
    builder = EventBuilder()
    events = list(builder.events([Begin(gtid, WHEN), _insert(1), Abort("reconnecting"),
                                  Begin(gtid, WHEN), _insert(1), _insert(2), _commit(gtid)]))
    assert _rows(events)[-2:] == [((1,), 1, gtid), ((2,), 2, gtid)]
    try:
        list(builder.events([_insert(3)]))  # after the commit, no transaction is open
    except AssertionError as exc:
        assert "outside a transaction" in str(exc)
    else:
        raise AssertionError("rows after the commit were taken into no transaction")


def test_the_shapes_of_a_table_no_ddl_touched_stay_few_across_thousands_of_ddls():
    """After any DDL the decoder hands every table a new layout object: the builder kept a
    shape (a schema) for each until it held 4,096 and dropped them all at once. Now each
    table keeps its last few, and a table's go at its own schema statement."""
    builder = EventBuilder()
    other = TableLayout("db", "other", LAYOUT.columns, (0,))
    for n in range(1, 2_001):
        gtid = Gtid(0, 1, n)
        ledger = TableLayout("db", "ledger", LAYOUT.columns, (0,))  # a new object each time
        alter = Ddl("db", "ALTER TABLE other ...", WHEN, "alter",
                    (TableChange("alter", "db", "other", other),))
        list(builder.events([Begin(gtid, WHEN), alter, _commit(gtid)]))
        list(builder.events([Begin(gtid, WHEN), Rows(ledger, RowsKind.INSERT, 0, [(n,)]),  # type: ignore[arg-type]
                             _commit(gtid)]))
    assert len(builder._shapes) <= 2 * SHAPES_PER_TABLE
    drop = Ddl("db", "DROP TABLE ledger", WHEN, "drop", (TableChange("drop", "db", "ledger"),))
    list(builder.events([Begin(Gtid(0, 1, 9999), WHEN), drop, _commit(Gtid(0, 1, 9999))]))
    assert {s.table.table for s in builder._shapes.values()} == {"other"}
