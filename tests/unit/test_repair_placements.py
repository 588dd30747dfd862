"""A repair read again in a replay (cdcserver/sinks/pipeline.py, ``RepairPlacements``): when
the Kafka sink rewinds, replication starts over from its commit while the store is further
ahead; a repair the store already holds is read again and placed in a later transaction. The
fault soak (seed 57) found the store taking it a second time, its before-image the row before
the first repair. Each sink's replay filter now drops a repair whose first placement it
skipped, and passes it to a sink that did not hold it."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from cdcserver.core.changes import (
    Begin,
    Change,
    ColumnDef,
    Commit,
    Rowless,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.mariadb.constants import ColumnType
from cdcserver.sinks.pipeline import Pipeline, RepairPlacements, _named, _ReplayFilter

LAYOUT = TableLayout("db", "c2", (ColumnDef("id", ColumnType.LONG, nullable=False),
                                  ColumnDef("pid", ColumnType.LONG)), (0,))
NOTE = '{"reason": "ON DELETE SET NULL of db.p (DELETE of 1 rows)", "cause": "0-1-3"}'


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


def _transaction(n: int, *rows: Rows) -> list[Change]:
    return [Begin(Gtid(0, 1, n), 0), *rows, Commit(_position(n), 0)]


def _repair(before: int | None) -> Rows:
    return Rows(LAYOUT, RowsKind.UPDATE, 0, [(182, before), (182, None)], repair=NOTE)


def _change(n: int) -> Rows:
    return Rows(LAYOUT, RowsKind.INSERT, 0, [(n, 1)])


def _repairs(changes: list[Change]) -> list[Rows]:
    return [c for c in changes if isinstance(c, Rows) and c.repair]


def test_a_repair_read_again_is_not_given_to_the_sink_that_holds_it():
    placements = RepairPlacements()
    first_run = [*_transaction(3, _change(3)), *_transaction(4, _change(4), _repair(336)),
                 *_transaction(5, _change(5))]
    placements.record(first_run)  # the store applied through 5; Kafka committed 2
    store = _ReplayFilter("avro", _position(5), GtidState([Gtid(0, 1, 2)]), placements)
    kafka = _ReplayFilter("kafka", _position(2), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_transaction(3, _change(3)), *_transaction(4, _change(4)),
              *_transaction(5, _change(5)), *_transaction(6, _change(6), _repair(336))]
    to_store, to_kafka = store(replay), kafka(replay)
    placements.record(replay)
    assert to_kafka == replay  # it held neither: every change, the repair once
    assert [c for c in to_store if isinstance(c, Begin)] == [Begin(Gtid(0, 1, 6), 0)]
    assert _repairs(to_store) == []  # it holds the first one, from transaction 4
    assert _change(6) in to_store
    # a later repair of the same rows, for a new cause, reaches both
    later = _transaction(7, Rows(LAYOUT, RowsKind.UPDATE, 0, [(182, None), (182, 9)],
                                 repair=NOTE.replace("0-1-3", "0-1-7")))
    assert len(_repairs(store(later))) == 1 and len(_repairs(kafka(later))) == 1


async def test_a_part_a_later_sink_failed_on_still_records_its_repairs_placements():
    """Soak seed 91: the store wrote a part whose transaction 4 carried a repair, and the
    next sink's apply failed on a full disk. Replication resumed in the same process and the
    store skipped transaction 4 (it held it), but the placement had not been recorded: the
    repair read again would reach it a second time, and a row event of its table was told
    to it as the view held the row before the repair (a delete's before-image untrue)."""
    from cdcserver.core.errors import DiskFull

    class Applying:
        def __init__(self, name: str, error: BaseException | None = None) -> None:
            self.name, self.error = name, error
            self.applied, self.unrepaired = None, None
            self.unrepaired_at = None
            self.given: list[Change] = []

        async def apply(self, changes: list[Change]) -> None:
            if self.error is not None:
                raise self.error
            self.given += changes

    store, kafka = Applying("avro"), Applying("kafka", DiskFull("no space left"))
    repairer = SimpleNamespace(pending=False, take_marked=lambda: False)
    pipeline = Pipeline(None, [store, kafka], GtidState([Gtid(0, 1, 2)]),  # type: ignore
                        repairer=repairer)  # type: ignore[arg-type]
    part = [*_transaction(3, _change(3)), *_transaction(4, _change(4), _repair(336))]
    try:
        await pipeline._apply_part(part)
    except DiskFull:
        pass
    else:
        raise AssertionError("the second sink's failure was not raised")
    assert store.given == part
    resumed = _ReplayFilter("avro", _position(4), GtidState([Gtid(0, 1, 2)]),
                            pipeline.placements)
    replay = [*_transaction(3, _change(3)), *_transaction(4, _change(4)),
              *_transaction(5, _change(5), _repair(336))]
    assert _repairs(resumed(replay)) == []  # it holds the first placement, in 4


def test_a_repair_whose_first_placement_the_sink_did_not_hold_reaches_it():
    """The store had applied the cause but not the repair's transaction when Kafka rewound:
    the repair read again is the store's first."""
    placements = RepairPlacements()
    placements.record([*_transaction(3, _change(3)), *_transaction(6, _repair(336))])
    store = _ReplayFilter("avro", _position(4), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_transaction(3, _change(3)), *_transaction(4, _change(4)),
              *_transaction(7, _repair(336))]
    assert len(_repairs(store(replay))) == 1


def test_placements_are_bounded():
    """(Each record is O(1): the set of transactions placed in was built again from every
    placement kept, 10,000 at the bound, on each part with a repair; this test took 9 s.)"""
    placements = RepairPlacements()
    for n in range(RepairPlacements.LIMIT + 5):
        placements.record(_transaction(n + 1, Rows(LAYOUT, RowsKind.UPDATE, 0, [],
                                                   repair=f"note {n}")))
    assert len(placements._placed) == RepairPlacements.LIMIT
    assert not placements.holds_placement(_named(Gtid(0, 1, 5)))  # dropped at the bound
    assert placements.holds_placement(_named(Gtid(0, 1, RepairPlacements.LIMIT + 5)))


def test_a_transaction_holds_placements_until_its_last_is_forgotten():
    placements = RepairPlacements()
    other = Rows(LAYOUT, RowsKind.UPDATE, 0, [], repair=NOTE.replace("0-1-3", "0-1-5"))
    placements.record(_transaction(4, _repair(336), other))
    marker = [Rowless("db", "c2", "ON DELETE SET NULL of db.p")]
    placements.forget([(marker, "0-1-3")])
    assert placements.holds_placement(_named(Gtid(0, 1, 4)))  # the other repair's
    placements.forget([(marker, "0-1-5")])
    assert not placements.holds_placement(_named(Gtid(0, 1, 4)))


def test_a_repair_left_unfinished_reaches_every_sink_again():
    """A repair beside the stream places its rows a share at a time. The store held the first
    share when Kafka rewound; the repair, carried over unfinished, is done again against the
    view (which holds that share), so every share it places now is rows the store lacks. The
    first fix took the new shares for the first one read again and dropped them: the suite's
    soak (seed 5501) found the rows missing from the store."""
    placements = RepairPlacements()
    placements.record([*_transaction(3, _change(3)), *_transaction(4, _repair(336))])
    unfinished = [([Rowless("db", "c2", "ON DELETE SET NULL of db.p")], "0-1-3")]
    placements.forget(unfinished)
    store = _ReplayFilter("avro", _position(4), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_transaction(3, _change(3)), *_transaction(4), *_transaction(6, _repair(337)),
              *_transaction(7, _repair(338))]
    assert [r.rows for r in _repairs(store(replay))] == [[(182, 337), (182, None)],
                                                         [(182, 338), (182, None)]]


def test_forgetting_a_repair_forgets_every_table_it_placed_rows_of():
    """By cause, not by the tables its markers name: a cascade's repair follows foreign keys
    into further tables. Other causes' repairs are kept."""
    placements = RepairPlacements()
    other = NOTE.replace("0-1-3", "0-1-5")
    placements.record(_transaction(4, _repair(336)))
    placements.record(_transaction(6, Rows(LAYOUT, RowsKind.UPDATE, 0, [], repair=other)))
    placements.forget([([Rowless("db", "parent", "cascade")], "0-1-3")])
    assert placements.first(_repair(1)) is None
    assert placements.first(Rows(LAYOUT, RowsKind.UPDATE, 0, [], repair=other)) is not None


def _cause(n: int, table: str = "c2") -> list[Change]:
    """Transaction ``n``, whose change a repair must make up for (a cascade into ``table``)."""
    return _transaction(n, _change(n), Rowless("db", table, "ON DELETE SET NULL of db.p"))


def _repair_of(cause: int, row: int) -> Rows:
    return Rows(LAYOUT, RowsKind.UPDATE, 0, [(row, 1), (row, None)],
                repair=NOTE.replace("0-1-3", f"0-1-{cause}"))


def test_a_sink_that_recorded_its_unplaced_repairs_gets_only_those_again():
    """The exactly-once Kafka sink committed while the repair of transaction 4 waited for its
    watermark: its record says it published through 5, the repair of 4 not yet placed
    (that of 3 was placed, in 5). After a restart (no placements known in the new process),
    the replay reads both repairs again, in later transactions: the sink gets 4's only."""
    kafka = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                          frozenset({"0-1-4"}))
    replay = [*_cause(3), *_cause(4), *_transaction(5, _change(5)),
              *_transaction(6, _change(6), _repair_of(3, 30), _repair_of(4, 40)),
              *_cause(7), *_transaction(8, _repair_of(7, 70))]
    given = kafka(replay)
    assert [c.gtid.sequence for c in given if isinstance(c, Begin)] == [6, 7, 8]
    assert [r.rows[0][0] for r in _repairs(given)] == [40, 70]
    assert _change(6) in given


def _repair_of_merged(cause: str, row: int) -> Rows:
    return Rows(LAYOUT, RowsKind.UPDATE, 0, [(row, 1), (row, None)],
                repair=NOTE.replace("0-1-3", cause))


def test_a_recorded_cause_naming_several_repairs_holds_none_of_them():
    """Third review of the recorded repairs. Repairs read at one watermark are named
    together ("0-1-3, 0-1-4"), and a sink's record keeps that name; the replay after a
    restart may read them apart ("0-1-3"), which the record did not name as such, so the
    sink was taken to hold it and never got it (a loss). Each transaction a recorded name
    names is unplaced; a name ending "and others" does not say which: none is held by the
    record then (a duplicate at worst)."""
    replay = [*_cause(3), *_cause(4), *_transaction(5, _change(5)),
              *_transaction(6, _repair_of(3, 30), _repair_of(4, 40))]
    merged = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                           frozenset({"0-1-3, 0-1-4"}))
    assert [r.rows[0][0] for r in _repairs(merged(replay))] == [30, 40]
    others = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                           frozenset({"0-1-1, and others"}))
    assert [r.rows[0][0] for r in _repairs(others(replay))] == [30, 40]
    # read together again: held only where every transaction it names is held
    again = [*_cause(3), *_cause(4), *_transaction(5, _change(5)),
             *_transaction(6, _repair_of_merged("0-1-3, 0-1-4", 34))]
    one = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                        frozenset({"0-1-4"}))
    assert [r.rows[0][0] for r in _repairs(one(again))] == [34]
    none = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                         frozenset())
    assert _repairs(none(again)) == []


def test_a_store_past_its_checkpoint_holds_the_repairs_its_checkpoint_covers():
    """Replication started again in the process (a disk fault) beside a Kafka sink behind the
    store: the store stands at 8, past its checkpoint at 5 (written with no repair pending:
    it holds every repair of the changes up to 5). It was taken to know nothing of what it
    holds, and was given a repair of 3 read again a second time (a duplicate in its stream);
    the repair of 7, whose change it applied past its checkpoint and whose placement this
    process never saw, it is given."""
    store = _ReplayFilter("avro", _position(8), GtidState([Gtid(0, 1, 2)]), RepairPlacements(),
                          frozenset(), _position(5))
    replay = [*_cause(3), *_transaction(5), *_cause(7), *_transaction(8),
              *_transaction(9, _repair_of(3, 30), _repair_of(7, 70))]
    assert [r.rows[0][0] for r in _repairs(store(replay))] == [70]


def test_a_sink_without_such_a_record_gets_every_repair_read_again():
    """The store records none (its checkpoint is never written while a repair is pending):
    only the placements known in this process say what it holds."""
    store = _ReplayFilter("avro", _position(5), GtidState([Gtid(0, 1, 2)]), None, None)
    replay = [*_cause(3), *_transaction(5), *_transaction(6, _repair_of(3, 30))]
    assert len(_repairs(store(replay))) == 1


def test_a_repair_the_sink_holds_is_not_recorded_as_unplaced_for_it():
    """Review of fad90ef: after a restart, the replay reads again the repair of a cause the
    Kafka sink published; the repairer counts it pending until its watermark, and a commit
    made meanwhile recorded it as not yet placed, so the restart after that gave it to the
    sink a second time. The sink's own filter now takes out the causes it holds."""
    kafka = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                          frozenset({"0-1-4"}))
    kafka([*_cause(3), *_cause(4), *_transaction(5)])
    assert kafka.unheld(frozenset({"0-1-3", "0-1-4", "0-1-6"})) == {"0-1-4", "0-1-6"}
    placements = RepairPlacements()
    placements.record(_transaction(4, _repair_of(3, 30)))
    store = _ReplayFilter("avro", _position(5), GtidState([Gtid(0, 1, 2)]), placements)
    store([*_cause(3), *_transaction(4), *_transaction(5)])
    assert store.unheld(frozenset({"0-1-3", "0-1-7"})) == {"0-1-7"}
    assert store.unheld(None) is None


def test_no_unplaced_causes_are_told_while_a_repair_beside_the_stream_is_half_placed():
    """Review of fad90ef: a repair beside the stream places its records a share at a time;
    a record naming its cause as not placed, written between two shares, would have the
    shares already out given again after a restart. No such record is written then."""
    def unrepaired(placing: bool, causes: frozenset[str] | None) -> frozenset[str] | None:
        repairer = SimpleNamespace(pending=True, placing_beside=placing,
                                   waiting_causes=lambda: causes)
        return Pipeline._unrepaired_now(SimpleNamespace(repairer=repairer))  # type: ignore

    assert unrepaired(False, frozenset({"0-1-9"})) == {"0-1-9"}
    assert unrepaired(True, frozenset({"0-1-9"})) is None
    assert unrepaired(False, None) is None  # (one being read)


def test_the_causes_waiting_are_those_health_lists(tmp_path):
    """The pipeline asks for the causes of the repairs waiting after every part
    (``waiting_causes``, which builds no /health entries: a lagging stream may hold thousands
    of repairs); they are the causes ``waiting()`` lists, and none while one is being read."""
    from cdcserver.core.config import parse_source_url
    from cdcserver.core.names import TableName
    from cdcserver.dump.snapshot import SnapshotPoint
    from cdcserver.reread.pendingrepairs import Pending, PendingRepairs
    from cdcserver.reread.repair import Repairer
    from cdcserver.reread.view import Views
    from cdcserver.store.catalog import Catalog

    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url("mysql://cdc@127.0.0.1:1"),
                        Catalog(str(tmp_path / "avro")), views)
    try:
        assert repairer.waiting_causes() == frozenset()
        point = SnapshotPoint(GtidState([Gtid(0, 1, 9)]), "mysql-bin.000001", 900,
                              dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        marker = Rowless("db", "child", "ON DELETE CASCADE of db.parent")
        repairer._pending = PendingRepairs(Pending(point, f"0-1-{n}", [], [marker])
                                           for n in (3, 4))
        repairer._again = [([marker], "0-1-5")]
        repairer._inline = [([marker], "0-1-6")]
        repairer._queued = {TableName("db", "child"): [([marker], "0-1-7")]}
        listed = frozenset(entry["cause"] for entry in repairer.waiting())
        assert listed == {"0-1-3", "0-1-4", "0-1-5", "0-1-6", "0-1-7"}
        assert repairer.waiting_causes() == listed
        repairer._reading = 1
        assert repairer.waiting_causes() is None
    finally:
        views.close()


def _withheld(cause: int, row: int) -> Rows:
    return Rows(LAYOUT, RowsKind.INSERT, 0, [(row, 1)], withheld=f"0-1-{cause}")


def _released(cause: int, row: int) -> Rows:
    return Rows(LAYOUT, RowsKind.INSERT, 0, [(row, 1)], released=f"0-1-{cause}")


def _rows_given(changes: list[Change]) -> list[int]:
    return [c.rows[0][0] for c in changes if isinstance(c, Rows)]


def test_a_tables_changes_held_for_its_repair_beside_the_stream_read_again():
    """The repair of transaction 3 is read beside the stream again in a replay, and the
    table's changes wait for it (withheld where they are, released after its records, which
    fold in those up to its watermark). The Kafka sink published through 5, the repair
    included, and is not given it again: it gets the table's changes after 5 where they
    are (row 60; its checkpoint covers 40), none released. The store holds nothing of it:
    the records and what is released, not what is withheld."""
    kafka = _ReplayFilter("kafka", _position(5), GtidState([Gtid(0, 1, 2)]), None,
                          frozenset())
    store = _ReplayFilter("avro", _position(2), GtidState([Gtid(0, 1, 2)]), None, None)
    replay = [*_cause(3), *_transaction(4, _withheld(3, 40)), *_transaction(5),
              *_transaction(6, _change(6), _withheld(3, 60)),
              *_transaction(7, _repair_of(3, 30), _repair_of(3, 31)),
              *_transaction(8, _released(3, 80), _change(8))]
    to_kafka, to_store = kafka(replay, True), store(replay, True)
    assert _rows_given(to_kafka) == [6, 60, 8]
    assert all(not r.withheld for r in to_kafka if isinstance(r, Rows))
    assert _rows_given(to_store) == [3, 6, 30, 31, 80, 8]
    # unmarked, as every part without such changes is passed: nothing sorted
    assert kafka(_transaction(9, _change(9))) == _transaction(9, _change(9))


def test_changes_withheld_for_a_repair_no_sink_holds_reach_every_sink_when_released():
    """No replay: each sink gets the table's changes where its repair lets them go."""
    store = _ReplayFilter("avro", _position(2), GtidState([Gtid(0, 1, 2)]), None, None)
    kafka = _ReplayFilter("kafka", _position(2), GtidState([Gtid(0, 1, 2)]), None,
                          frozenset())
    part = [*_transaction(3, _withheld(2, 30)), *_transaction(4, _released(2, 40))]
    assert _rows_given(store(part, True)) == _rows_given(kafka(part, True)) == [40]


def test_the_store_ahead_of_a_rewound_kafka_sink_gets_the_tables_changes_where_they_are():
    """The Kafka sink rewound to 2 in the process; the store had applied through 8, the
    repair of 3 (beside the stream) first placed in 5 and the changes it held released in
    6. The repair read again is not the store's; the table's changes after 8, withheld
    for it, are, where they are; released again, they are not."""
    placements = RepairPlacements()
    placements.record([*_transaction(5, _repair_of(3, 30)), *_transaction(6, _change(6))])
    store = _ReplayFilter("avro", _position(8), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_cause(3), *_transaction(5, _withheld(3, 50)), *_transaction(8),
              *_transaction(9, _withheld(3, 90)), *_transaction(10, _repair_of(3, 30)),
              *_transaction(11, _released(3, 110))]
    assert _rows_given(store(replay, True)) == [90]


def test_a_repair_in_shares_read_again_reaches_no_sink_that_held_its_first_placement():
    """Review of c83efe8: a repair beside the stream places its records a share at a time.
    Read again in a replay, its first share was recorded as the repair's placement in
    place of the first one, so the store, which holds the first, took the later shares."""
    placements = RepairPlacements()
    placements.record([*_transaction(5, _repair_of(3, 30)), *_transaction(6, _repair_of(3, 31))])
    store = _ReplayFilter("avro", _position(8), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_cause(3), *_transaction(5), *_transaction(6), *_transaction(8)]
    store(replay)
    for n, row in ((10, 30), (11, 31), (12, 32)):  # its shares, again, one part each
        part = _transaction(n, _repair_of(3, row), _change(n))
        assert _rows_given(store(part)) == [n]
        placements.record(part)


def test_a_repair_with_nothing_to_place_is_held_by_the_sink_its_changes_were_released_to():
    """Review of c83efe8: a repair beside the stream with no difference placed no record,
    so the store, ahead, was not known to hold it: read again, its records (which fold in
    the changes it was released) and its released changes reached it a second time."""
    placements = RepairPlacements()
    placements.record(_transaction(6, _released(3, 60)))
    store = _ReplayFilter("avro", _position(8), GtidState([Gtid(0, 1, 2)]), placements)
    replay = [*_cause(3), *_transaction(6), *_transaction(8),
              *_transaction(9, _withheld(3, 90)), *_transaction(10, _repair_of(3, 30)),
              *_transaction(11, _released(3, 110))]
    assert _rows_given(store(replay, True)) == [90]


def test_the_store_at_its_checkpoint_holds_every_repair_of_what_it_covers():
    """Review of c83efe8: after a start the pipeline knows no placements, and the store
    recorded none, so a replay from the Kafka sink's earlier checkpoint gave the store the
    repairs of changes its checkpoint covers again (their records fold in changes it
    has). No checkpoint of it is written while a repair is pending: it holds them all, of
    the changes up to its checkpoint; past it (a pipeline started again in the process) the
    placements say (test_a_store_past_its_checkpoint_holds_the_repairs_its_checkpoint_covers)."""
    from cdcserver.sinks.store import StoreSink

    at = StoreSink(SimpleNamespace(position=_position(8), durable=_position(8)))  # type: ignore
    past = StoreSink(SimpleNamespace(position=_position(9), durable=_position(8)))  # type: ignore
    assert at.unrepaired == past.unrepaired == frozenset()
    assert at.unrepaired_at == past.unrepaired_at == _position(8)
    first = StoreSink(SimpleNamespace(position=_position(9), durable=None))  # type: ignore
    assert first.unrepaired is None  # (no checkpoint yet: it records nothing)
    store = _ReplayFilter("avro", _position(8), GtidState([Gtid(0, 1, 2)]), None,
                          at.unrepaired, at.unrepaired_at)
    replay = [*_cause(3), *_transaction(8), *_transaction(9, _repair_of(3, 30), _change(9))]
    assert _rows_given(store(replay)) == [9]


def test_a_statement_let_go_without_its_repair_leaves_the_cause_placed_in_part():
    """Review of eb15d8b: a repair beside the stream that failed lets its held statement go
    (and the rows it retypes), and the pipeline reads the repair itself. A commit of the
    exactly-once Kafka sink meanwhile recorded the cause as not placed, so after a restart
    the sink was given the statement again. Until that repair is out, no such record."""
    from cdcserver.reread.repair import Repairer

    def placing(let_go: set[str], waiting: list[str]) -> bool:
        state = SimpleNamespace(_beside={}, _let_go_out=set(let_go),
                                waiting=lambda: [{"cause": c} for c in waiting])
        return Repairer.placing_beside.fget(state)  # type: ignore[attr-defined]

    assert placing({"0-1-4"}, ["0-1-4", "0-1-6"])
    assert not placing({"0-1-4"}, ["0-1-6"])  # its repair is out
    assert not placing(set(), ["0-1-4"])


def test_a_row_event_told_as_held_goes_as_logged_to_a_sink_that_holds_every_repair_waiting():
    """Soak seed 81: the Kafka sink rewound and the pipeline started again from its commit,
    the store further ahead. A cascade's SET NULL, repaired at 3147 in the first run (the
    store holds it), was read again and waited for its new watermark; a delete of that row
    at 4233, after the store's position, was told against the stream's view (no repair
    yet: ``pid`` 88) and the store, which holds ``pid`` NULL, got that before-image. A sink
    that holds every repair waiting for the table gets the binlog's row (the source's);
    one that holds any fewer, the row told as held."""
    placements = RepairPlacements()
    placements.record(_transaction(5, _repair_of(3, 30)))
    store = _ReplayFilter("avro", _position(6), GtidState([Gtid(0, 1, 2)]), placements)
    kafka = _ReplayFilter("kafka", _position(2), GtidState([Gtid(0, 1, 2)]), placements)
    logged = Rows(LAYOUT, RowsKind.DELETE, 0, [(30, None)], as_logged_for=("0-1-3",))
    told = Rows(LAYOUT, RowsKind.DELETE, 0, [(30, 8)], as_held_for=("0-1-3",))
    replay = [*_cause(3), *_transaction(5), *_transaction(6), *_transaction(7, logged, told)]
    to_store, to_kafka = store(replay, True), kafka(replay, True)
    assert [r.rows for r in to_store if isinstance(r, Rows)] == [[(30, None)]]
    assert [r.rows for r in to_kafka if isinstance(r, Rows)] == [[(3, 1)], [(30, 8)]]
    assert all(not (r.as_held_for or r.as_logged_for) for r in to_store + to_kafka
               if isinstance(r, Rows))
    # a repair waiting that the store does not hold as well: the row told as held
    both = Rows(LAYOUT, RowsKind.DELETE, 0, [(31, 9)], as_held_for=("0-1-3", "0-1-9"))
    raw = Rows(LAYOUT, RowsKind.DELETE, 0, [(31, None)], as_logged_for=("0-1-3", "0-1-9"))
    assert [r.rows for r in store(_transaction(8, raw, both), True)
            if isinstance(r, Rows)] == [[(31, 9)]]


async def test_the_binlogs_row_goes_beside_the_told_one_only_while_every_change_is_pending():
    """Review of 8795c88: the binlog's row event goes beside the one told as held (for a
    sink holding every repair waiting) only when every change without rows of the table is
    a pending repair. One found in the open transaction (a cascade there, then an update of
    a row it changed) is no sink's yet: the binlog's before-image is then no sink's row."""
    import datetime as dt

    from cdcserver.core.names import TableName
    from cdcserver.dump.snapshot import SnapshotPoint
    from cdcserver.reread.difference import Scope
    from cdcserver.reread.pendingrepairs import Pending, PendingRepairs
    from cdcserver.reread.watermark import Watermarks

    table = TableName("db", "c2")
    point = SnapshotPoint(GtidState([Gtid(0, 1, 9)]), "bin.000001", 900, dt.datetime.now(dt.UTC))
    event = Rows(LAYOUT, RowsKind.DELETE, 0, [(30, None)], "bin.000001", 700)
    told = Rows(LAYOUT, RowsKind.DELETE, 0, [(30, 8)], "bin.000001", 700)

    def stage(found: list[Rowless]) -> SimpleNamespace:
        state = SimpleNamespace(
            _pending=PendingRepairs([Pending(point, "0-1-3",
                                             [Scope(table, LAYOUT, "SET NULL", None)], [])]),
            _overlay={}, _found=found, _inline=[], _reissue=[], marked=False,
            views=SimpleNamespace(locked=lambda f, *a: f(*a)),
            _told_as_held=lambda rows, key, overlay: [told])
        state._unplaced_change_of = lambda t: Watermarks._unplaced_change_of(state, t)
        return state

    pending_only = stage([])
    out = await Watermarks._as_held(pending_only, event)  # type: ignore[arg-type]
    assert [(r.rows, r.as_logged_for, r.as_held_for) for r in out] == [
        ([(30, None)], ("0-1-3",), ()), ([(30, 8)], (), ("0-1-3",))]
    assert pending_only.marked
    in_transaction = stage([Rowless("db", "c2", "ON DELETE SET NULL of db.p")])
    assert await Watermarks._as_held(in_transaction, event) == [told]  # type: ignore[arg-type]
