"""The re-read mechanism on its own: a real source, a real store and its views, and the
repair stage fed a transaction with a ``Rowless`` marker.

The source's rows are changed with ``sql_log_bin = 0``, so no row event exists for them: only
a re-read can bring the stream back to the table. Also: rows read at a watermark are the
binlog decoder's own values, on every type.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from cdcserver.app.runner import ReplicationRunner
from cdcserver.core.changes import (
    Begin,
    Commit,
    Ddl,
    Rowless,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.config import SourceConfig, parse_source_url
from cdcserver.core.errors import DiskFull
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.handoff import Handoff
from cdcserver.core.names import TableName
from cdcserver.mariadb.charsets import CollationTable
from cdcserver.replication.connection import BinlogConnection
from cdcserver.replication.decoder import EventDecoder
from cdcserver.reread import fold as fold_module
from cdcserver.reread.readview import ReadView
from cdcserver.reread.repair import Repairer
from cdcserver.reread.tableview import ViewsClosed
from cdcserver.reread.view import Views
from cdcserver.schema import ddl
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.layouts import layout_of
from cdcserver.sinks.pipeline import Pipeline
from cdcserver.sinks.store import StoreSink
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore
from tests.conftest import RunningService, Source
from tests.server.test_types import _fill

pytestmark = pytest.mark.mariadb


def _layout(source: Source, table: str) -> TableLayout:
    text = str(source.query(f"SHOW CREATE TABLE `{source.database}`.`{table}`")[0][1])
    statement = ddl.parse(text, source.database)
    assert isinstance(statement, ddl.CreateTable) and statement.definition is not None
    return layout_of(TableName(source.database, table), statement.definition)


def _position(source: Source) -> BinlogPosition:
    file, pos = source.query("SHOW MASTER STATUS")[0][:2]
    return BinlogPosition(source.gtid_state(), str(file), int(pos))


def _rows(source: Source, layout: TableLayout) -> list[tuple[Any, ...]]:
    view = ReadView(parse_source_url(source.url), [TableName(layout.database, layout.table)])
    try:
        return view.rows(layout)
    finally:
        view.close()


class _Stream:
    """A store fed by hand, the way the pipeline feeds it."""

    def __init__(self, path: str) -> None:
        self.catalog = Catalog(os.path.join(path, "avro"))
        self.store = AvroStore(path, self.catalog)
        self.store.open()
        self.sequence = 1000

    async def transaction(self, changes: list[Any], position: BinlogPosition,
                          repairer: Repairer | None = None) -> list[Any]:
        self.sequence += 1
        batch = [Begin(Gtid(9, 1, self.sequence), 0), *changes, Commit(position, 0)]
        if repairer is not None:
            batch = await repairer.process(batch)
        await self.store.apply(batch)
        return batch


async def test_a_rowless_change_is_repaired_by_a_read_at_the_watermark(tmp_path,
                                                                      source: Source):
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(6,2))",
                   f"INSERT INTO {db}.t VALUES (1, 'a', 1.50), (2, 'b', 2), (3, 'c', NULL)")
    layout = _layout(source, "t")
    stream = _Stream(str(tmp_path / "data"))
    await stream.transaction([Rows(layout, RowsKind.INSERT, 0, _rows(source, layout))],
                             _position(source))
    conn = source.server.connect(source.database)
    with conn.cursor() as cur:  # changes no row event will tell
        for statement in ("SET SESSION sql_log_bin = 0", "DELETE FROM t WHERE id = 1",
                          "UPDATE t SET v = 'B', n = 2.25 WHERE id = 2",
                          "INSERT INTO t VALUES (4, 'd', 4)"):
            cur.execute(statement)
    conn.close()
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url(source.url), stream.catalog, views)
    marker = Rowless(source.database, "t", "a test's hidden change", layout=layout)
    batch = await stream.transaction([marker], _position(source), repairer)
    repairs = [c for c in batch if isinstance(c, Rows)]
    assert {r.kind: list(r.rows) for r in repairs} == {
        RowsKind.DELETE: [(1, "a", pytest.approx(1.5))],
        RowsKind.UPDATE: [(2, "b", 2), (2, "B", pytest.approx(2.25))],
        RowsKind.INSERT: [(4, "d", 4)],
    }
    assert all("hidden change" in r.repair for r in repairs)
    assert isinstance(batch[-1], Commit) and repairer.stats.repairs == 1
    # The view now holds the table: a second repair finds nothing to do.
    batch = await stream.transaction([marker], _position(source), repairer)
    assert not [c for c in batch if isinstance(c, Rows)]
    views.close()
    stream.store.close()


def _seen_during(monkeypatch: pytest.MonkeyPatch, obj: Any, method: str,
                 probe: Any) -> list[Any]:
    """What ``probe()`` returns each time ``obj.method`` is called (in its thread)."""
    seen: list[Any] = []
    original = getattr(obj, method)

    def spied(*args: Any) -> Any:
        seen.append(probe())
        return original(*args)

    monkeypatch.setattr(obj, method, spied)
    return seen


async def test_a_repair_read_again_after_a_schema_statement_holds_the_checkpoint_back(
        tmp_path, source: Source, monkeypatch: pytest.MonkeyPatch):
    """Found by the soak (seed 50007): a repair waiting for its watermark is read again after
    a schema statement on its table. While that read ran, the repair was in neither the
    waiting list nor the one to read again, so the pipeline saw none pending and wrote a
    checkpoint past the change being repaired; a kill -9 then lost the repair (the rows a
    rollback to a savepoint left unsent never went out)."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE {db}.u (id INT PRIMARY KEY)", f"INSERT INTO {db}.t VALUES (1, 1)")
    layout = _layout(source, "t")
    stream = _Stream(str(tmp_path / "data"))
    await stream.transaction([Rows(layout, RowsKind.INSERT, 0, _rows(source, layout))],
                             _position(source))
    behind = _position(source)  # the stream is here; the source moves on
    source.execute(f"INSERT INTO {db}.u VALUES (1)")
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url(source.url), stream.catalog, views)
    marker = Rowless(source.database, "t", "a test's hidden change", layout=layout)
    await stream.transaction([marker], behind, repairer)
    assert repairer.pending, "the watermark is ahead of the stream"
    pending_while_read = _seen_during(monkeypatch, repairer, "_read", lambda: repairer.pending)
    index = Ddl(source.database, "ALTER TABLE t ADD INDEX (v)", 0, "alter",
                (TableChange("alter", source.database, "t", layout, changed=False),),
                behind.file, behind.pos)
    await stream.transaction([index], behind, repairer)
    assert pending_while_read == [True]
    assert repairer.pending
    views.close()
    stream.store.close()


async def test_a_repair_reaching_its_watermark_holds_the_checkpoint_until_its_rows_are_out(
        tmp_path, source: Source, monkeypatch: pytest.MonkeyPatch):
    """Found by CI's chaos test (seed 20261130, application sessions): a repair reaching its
    watermark left the waiting list, then read the difference in a thread. The pipeline's
    flush loop ran meanwhile, saw no repair out, and wrote a checkpoint past the change
    repaired without its rows; a kill -9 then lost them (rows a rollback to a savepoint left
    unsent, deleted later: "delete of a key not held")."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {db}.t VALUES (1, 1)")
    layout = _layout(source, "t")
    store = _Stream(str(tmp_path / "data")).store
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url(source.url), store.catalog, views)
    applied: list[Any] = []
    pipeline = Pipeline(Handoff(asyncio.get_running_loop()), [StoreSink(store)], GtidState(),
                        repairer=repairer, applied=lambda sink, changes: applied.extend(changes))
    behind = _position(source)
    source.execute(f"INSERT INTO {db}.t VALUES (2, 2)")  # the change repaired, ahead
    await pipeline._apply([Begin(Gtid(9, 1, 1), 0),
                           Rows(layout, RowsKind.INSERT, 0, [(1, 1)]),
                           Rowless(source.database, "t", "a test's hidden change",
                                   layout=layout), Commit(behind, 0)])
    assert pipeline.repair_pending, "the watermark is ahead of the stream"
    held_while_read = _seen_during(monkeypatch, repairer, "_difference",
                                   lambda: pipeline.repair_pending)
    ahead = _position(source)
    await pipeline._apply([Begin(Gtid(9, 1, 2), 0), Commit(ahead, 0)])
    assert held_while_read == [True]
    assert not pipeline.repair_pending
    repaired = [row for c in applied if isinstance(c, Rows) and c.repair for row in c.rows]
    assert repaired == [(2, 2)]
    views.close()
    store.close()


async def test_a_full_disks_pause_keeps_the_checkpoint_before_a_pending_repairs_change(
        tmp_path, source: Source, monkeypatch: pytest.MonkeyPatch):
    """Found by the soak (seed 64: a SET NULL missing from the stream): a full disk's pause
    wrote the store's checkpoint past a change whose repair was pending; the repair went on
    in memory only, and a restart before it was placed (a failing disk) never read the
    change again. The pause now keeps the checkpoint before the change, and the next
    pipeline, which replays it from there, repairs it once: it does not also take the
    repair over (read twice, a big table's repair filled the full disk again for ever)."""
    db = f"`{source.database}`"
    first = _named(1, _position(source))  # (the stream's first transaction ends here)
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {db}.t VALUES (1, 1)")
    layout = _layout(source, "t")
    path = str(tmp_path / "data")
    store, sink, views = _stored_stream(tmp_path)
    applied: list[Any] = []

    def pipeline_from(start: GtidState, repairer: Repairer, before: Pipeline | None = None
                      ) -> Pipeline:
        return Pipeline(Handoff(asyncio.get_running_loop()), [sink], start,
                        repairer=repairer, placements=before.placements if before else None,
                        applied=lambda _, changes: applied.extend(changes))

    pipeline = pipeline_from(GtidState(), Repairer(parse_source_url(source.url),
                                                   store.catalog, views))
    inserted = [Begin(Gtid(9, 1, 1), 0), Rows(layout, RowsKind.INSERT, 0, [(1, 1)]),
                Commit(first, 0)]
    await pipeline._apply(inserted)
    await pipeline.flush()
    assert store.durable == first
    behind = _named(2, _position(source))
    source.execute(f"INSERT INTO {db}.t VALUES (2, 2)")  # the change repaired, ahead
    hidden = [Begin(Gtid(9, 1, 2), 0),
              Rowless(source.database, "t", "a test's hidden change", layout=layout),
              Commit(behind, 0)]
    await pipeline._apply(hidden)
    assert pipeline.repair_pending, "the watermark is ahead of the stream"

    data_dir = DataDir(path)
    runner = ReplicationRunner(SourceConfig(url=source.url), data_dir, store.catalog, [sink],
                               flush_interval=1, disk_full_retry=0.01)
    runner.pipeline = pipeline
    await asyncio.wait_for(runner._pause_until_room(DiskFull("no room")), 10)
    assert store.durable == first, "the checkpoint passed a change not repaired"
    assert sink.applied == behind

    # The next pipeline, as the runner sets it up: from the checkpoint, the store skipping
    # what it applied; the change comes again, and is repaired once
    unfinished = pipeline.repairer.carry_over()
    pipeline.placements.forget(unfinished)
    repairer = Repairer(parse_source_url(source.url), store.catalog, views)
    repairer.take_over(unfinished)
    reads = _seen_during(monkeypatch, repairer, "_difference", lambda: True)
    pipeline = pipeline_from(first.gtid_state, repairer, pipeline)
    applied.clear()
    await pipeline._apply(hidden)
    await pipeline._apply([Begin(Gtid(9, 1, 3), 0), Commit(_named(3, _position(source)), 0)])
    assert not pipeline.repair_pending
    assert len(reads) == 1, "the repair was read twice"
    repaired = [row for c in applied if isinstance(c, Rows) and c.repair for row in c.rows]
    assert repaired == [(2, 2)]
    views.close()
    store.close()


async def test_a_store_ahead_of_a_replay_gets_before_images_with_the_repairs_it_holds(
        tmp_path, source: Source):
    """Found by the soak (seed 100: an update's and a delete's before-image without a
    cascade's repair the store held). A resume in the process replays from the checkpoint;
    the store, ahead, skips what it applied, repairs placed in it included, and the replay
    reads those repairs again, waiting for new watermarks beside a new one of other rows
    that the store does not hold. An update of a row one of the first kind repaired was
    told against the stream's rows without that repair, because the store did not hold
    every repair waiting for the table. It holds every one that includes the row: the
    binlog's before-image is its row. A sink behind (a Kafka sink that rewound), which
    holds none of them, still gets the update told against the stream's rows."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
                   f"CREATE TABLE {db}.u (id INT PRIMARY KEY)",
                   f"INSERT INTO {db}.t VALUES (1, 1), (2, 2)")
    layout = _layout(source, "t")
    store, sink, views = _stored_stream(tmp_path)
    given: list[Any] = []

    behind = _Behind()

    def pipeline_from(start: GtidState, before: Pipeline | None = None) -> Pipeline:
        sinks: list[Any] = [sink, behind] if before else [sink]
        return Pipeline(Handoff(asyncio.get_running_loop()), sinks, start,
                        repairer=Repairer(parse_source_url(source.url), store.catalog, views),
                        placements=before.placements if before else None,
                        applied=lambda name, changes: given.extend(changes)
                        if name == sink.name else None)

    def hidden(statement: str) -> None:  # a change no row event tells
        conn = source.server.connect(source.database)
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(statement)
        conn.close()

    def marker(key: int) -> Rowless:
        return Rowless(source.database, "t", f"a test's hidden change of {key}", ("id",),
                       ((key,),), layout)

    def transaction(n: int, at: BinlogPosition, *changes: Any) -> list[Any]:
        return [Begin(Gtid(9, 1, n), 0), *changes, Commit(_named(n, at), 0)]

    first = _position(source)
    pipeline = pipeline_from(GtidState())
    await pipeline._apply(transaction(1, first, Rows(layout, RowsKind.INSERT, 0,
                                                     [(1, 1), (2, 2)])))
    await pipeline.flush()
    hidden(f"UPDATE {db}.t SET v = 3 WHERE id = 2")
    replayed = transaction(2, first, marker(2))  # repaired at once: the source is there
    source.execute(f"UPDATE {db}.t SET v = 5 WHERE id = 1")
    updated = _position(source)
    replayed += transaction(3, updated, Rows(layout, RowsKind.UPDATE, 0, [(1, 1), (1, 5)]))
    hidden(f"UPDATE {db}.t SET v = 10 WHERE id = 1")
    replayed += transaction(4, updated, marker(1))
    await pipeline._apply(replayed)
    assert not pipeline.repair_pending
    assert [r.rows for r in given if isinstance(r, Rows) and r.repair] == \
        [[(2, 2), (2, 3)], [(1, 5), (1, 10)]]

    # Resumed in the process from the checkpoint (after transaction 1): the store skips
    # 2 to 4 and their repairs, read again at the source's new position; the sink behind
    # holds transaction 1 only
    source.execute(f"INSERT INTO {db}.u VALUES (1)")
    behind.applied = _named(1, first)
    pipeline = pipeline_from(_named(1, first).gtid_state, pipeline)
    await pipeline._apply(replayed)
    hidden(f"UPDATE {db}.t SET v = 30 WHERE id = 2")
    await pipeline._apply(transaction(5, updated, marker(2)))  # not the store's: new
    source.execute(f"UPDATE {db}.t SET v = 11 WHERE id = 1")
    given.clear()
    behind.given.clear()
    await pipeline._apply(transaction(6, updated, Rows(layout, RowsKind.UPDATE, 0,
                                                       [(1, 10), (1, 11)])))
    assert pipeline.repair_pending, "the watermarks are ahead of the stream"
    assert [r.rows for r in given if isinstance(r, Rows)] == [[(1, 10), (1, 11)]]
    assert [r.rows for r in behind.given if isinstance(r, Rows)] == [[(1, 5), (1, 11)]]
    views.close()
    store.close()


def _stored_stream(tmp_path: Any) -> tuple[AvroStore, StoreSink, Views]:
    """A store in ``tmp_path``/data, its sink, and the repair stage's views beside it."""
    store = _Stream(str(tmp_path / "data")).store
    return store, StoreSink(store), Views(str(tmp_path / "views.sqlite"))


class _Behind:
    """A sink that keeps what it is given, behind the store (in memory: what is tested is
    which variant of a change the pipeline gives it)."""

    name = "behind"
    after: tuple[str, ...] = ()
    active = True
    unrepaired = None
    unrepaired_at = None

    def __init__(self) -> None:
        self.applied: BinlogPosition | None = None
        self.durable: BinlogPosition | None = None
        self.given: list[Any] = []

    async def apply(self, changes: list[Any]) -> None:
        self.given += changes

    async def flush(self) -> BinlogPosition | None:
        return self.durable

    async def keep_up(self, unrepaired: Any) -> None:
        pass


def _named(sequence: int, position: BinlogPosition) -> BinlogPosition:
    """``position`` after the hand-made transaction 9-1-``sequence``."""
    return replace(position, gtid_state=GtidState([Gtid(9, 1, sequence)]))


async def test_a_view_folded_again_before_the_store_holds_a_column_rename_has_the_new_names(
        tmp_path, source: Source):
    """Found by the soak (seeds 50014, 70015: deletes whose renamed columns were NULL): a
    repair waiting for its watermark is read again after each schema statement on its table.
    The read keys the table's view like the source (``id``, ``row_end``: versioning was
    added there since), not like the stream (``id``), so the view is folded again from the
    store. After ``RENAME COLUMN`` the store does not hold the statement yet; the view the
    stream had was renamed, but the one folded again kept the old names, and the repair's
    images then named the renamed column NULL."""
    db = f"`{source.database}`"
    layout, stream = await _streamed(tmp_path, source, "a INT, v INT", (1, 10, 100))
    behind = _position(source)  # the stream is here; the source moves on
    source.execute(f"ALTER TABLE {db}.t RENAME COLUMN a TO b",
                   f"ALTER TABLE {db}.t ADD SYSTEM VERSIONING",
                   f"INSERT INTO {db}.u VALUES (1)")
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url(source.url), stream.catalog, views)
    marker = Rowless(source.database, "t", "a test's hidden change", layout=layout)
    await stream.transaction([marker], behind, repairer)
    assert repairer.pending, "the watermark is ahead of the stream"
    renamed = layout_of(TableName(source.database, "t"), _definition(
        "CREATE TABLE t (id INT PRIMARY KEY, b INT, v INT)", source.database))
    rename = Ddl(source.database, "ALTER TABLE t RENAME COLUMN a TO b", 0, "alter",
                 (TableChange("alter", source.database, "t", renamed, previous=layout,
                              renamed_columns=(("a", "b"),)),), behind.file, behind.pos)
    await stream.transaction([rename], behind, repairer)
    held = [row for row, _ in views.tables[TableName(source.database, "t")].rows()]
    assert [(r["id"], r.get("b"), "a" in r) for r in held] == [(1, 10, False)], held
    views.close()
    stream.store.close()


async def test_two_repairs_due_together_keyed_otherwise_do_not_insert_a_row_twice(
        tmp_path, source: Source):
    """Found by the soak (seed 80005: 22 "insert of a held key (repair)"): two repairs of a
    table reached their watermarks in one commit. The first inserted the rows the stream
    lacked; the second, keyed like a later read of the source (``id``, ``row_end``: the
    source had versioning by then), folded its view again from the store, which did not hold
    the first one's rows yet, and inserted them again: a key held, inserted."""
    db = f"`{source.database}`"
    layout, stream = await _streamed(tmp_path, source, "v INT", (1, 1))
    behind = _position(source)
    conn = source.server.connect(source.database)
    with conn.cursor() as cur:  # a change no row event tells
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("INSERT INTO t VALUES (2, 2)")
    conn.close()
    source.execute(f"INSERT INTO {db}.u VALUES (1)")
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url(source.url), stream.catalog, views)
    marker = Rowless(source.database, "t", "a test's hidden change", layout=layout)
    await stream.transaction([marker], behind, repairer)
    source.execute(f"ALTER TABLE {db}.t ADD SYSTEM VERSIONING", f"INSERT INTO {db}.u VALUES (2)")
    await stream.transaction([marker], behind, repairer)
    assert len(repairer._pending) == 2
    batch = await stream.transaction([], _position(source), repairer)
    told = [(c.kind, row[0]) for c in batch if isinstance(c, Rows) for row in c.rows]
    # the first inserts it; the second, keyed with row_end, replaces it (it was held)
    assert [kind for kind, key in told if key == 2] == \
        [RowsKind.INSERT, RowsKind.DELETE, RowsKind.INSERT], told
    views.close()
    stream.store.close()


async def _streamed(tmp_path: Any, source: Source, columns: str, row: tuple[Any, ...]
                    ) -> tuple[TableLayout, _Stream]:
    """``t`` (``id INT PRIMARY KEY, columns``) holding ``row`` on the source and in a stream
    fed by hand; ``u``, a table to move the source on with."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, {columns})",
                   f"CREATE TABLE {db}.u (id INT PRIMARY KEY)",
                   f"INSERT INTO {db}.t VALUES ({', '.join(map(repr, row))})")
    layout = _layout(source, "t")
    stream = _Stream(str(tmp_path / "data"))
    await stream.transaction([Rows(layout, RowsKind.INSERT, 0, [row])], _position(source))
    return layout, stream


def _definition(text: str, database: str) -> Any:
    statement = ddl.parse(text, database)
    assert isinstance(statement, ddl.CreateTable) and statement.definition is not None
    return statement.definition


async def test_rows_read_again_are_the_binlog_decoders_values_on_every_type(
        tmp_path, cdc: RunningService, source: Source):
    """The same rows three ways: decoded from the binlog (what the stream is made of), read
    at a watermark, and folded back from the store's Avro files into a view."""
    _fill(source)
    layout = _layout(source, "types")
    address = parse_source_url(source.url)
    connection = BinlogConnection(address, 4242, GtidState(), blocking=False, file=str(
        source.query("SHOW BINARY LOGS")[0][0]), pos=4, by_position=True)
    connection.open()
    history = SchemaHistory(None, lambda t: str(source.query(
        f"SHOW CREATE TABLE `{t.database}`.`{t.table}`")[0][1]))
    decoder = EventDecoder(CollationTable(dict(source.query(
        "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS"))), GtidState(),
        checksums=connection.checksums, history=history)
    changes: list[Any] = []
    try:
        for packet in connection.packets():
            decoder.feed(packet, changes)
    finally:
        connection.close()
    binlog: dict[int, tuple[Any, ...]] = {}
    for change in changes:
        if isinstance(change, Rows) and change.layout.table == "types":
            pairs = list(change.rows)
            if change.kind == RowsKind.UPDATE:
                pairs = pairs[1::2]
            for row in pairs:
                if change.kind == RowsKind.DELETE:
                    binlog.pop(row[0], None)
                else:
                    binlog[row[0]] = tuple(row)
    read = {row[0]: row for row in _rows(source, layout)}
    names = [c.name for c in layout.columns]
    assert read.keys() == binlog.keys()
    for key, row in read.items():
        mismatched = {n: (a, b) for n, a, b in zip(names, row, binlog[key], strict=True)
                      if a != b or type(a) is not type(b)}
        assert not mismatched, f"row {key}: (read again, binlog) {mismatched}"
    await cdc.caught_up(source)
    views = Views(str(tmp_path / "views.sqlite"))
    try:
        folded = views.fold(cdc.service.data.catalog, TableName(source.database, "types"), ("id",))
        for row, count in folded.rows():
            assert count == 1
            mismatched = {n: (row[n], b) for n, b in zip(names, binlog[row["id"]], strict=True)
                          if row[n] != b or type(row[n]) is not type(b)}
            assert not mismatched, f"row {row['id']}: (folded, binlog) {mismatched}"
    finally:
        views.close()


async def test_closing_the_views_stops_a_fold_and_waits_for_it(tmp_path, monkeypatch,
                                                                source: Source):
    """A pipeline cancelled while a thread folds a view closes the views: the fold stops at
    its next block and the database closes only after (closing it under the thread would
    crash the process). No MariaDB rows are involved: the store is fed by hand."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.big (id INT PRIMARY KEY, v VARCHAR(20))")
    layout = _layout(source, "big")
    stream = _Stream(str(tmp_path / "data"))
    for block in range(3):  # three transactions: three Avro blocks to fold
        rows = [(block * 100 + n, f"v{n}") for n in range(100)]
        await stream.transaction([Rows(layout, RowsKind.INSERT, 0, rows)], _position(source))
    views = Views(str(tmp_path / "views.sqlite"))
    folding, done = threading.Event(), threading.Event()
    original = fold_module.decode_records

    def slow_decode(*args: Any) -> Any:  # the fold holds the views when close is called
        folding.set()
        assert wait_for(lambda: views._closing.is_set(), 30)
        return original(*args)

    monkeypatch.setattr(fold_module, "decode_records", slow_decode)
    outcome: list[BaseException | None] = []

    def fold_holding_the_views() -> None:
        try:
            views.fold(stream.catalog, TableName(source.database, "big"), ("id",))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)
        finally:
            done.set()

    def fold() -> None:
        views.locked(fold_holding_the_views)

    worker = threading.Thread(target=fold)
    worker.start()
    assert folding.wait(30)
    await asyncio.to_thread(views.close)
    assert done.is_set(), "the views closed while the fold still ran"
    worker.join()
    assert isinstance(outcome[0], ViewsClosed)
    with pytest.raises(ViewsClosed):
        views.locked(lambda: None)
    stream.store.close()


@pytest.mark.parametrize("batch", [7, 20_000])
async def test_a_keyed_fold_of_random_changes_holds_the_last_row_of_each_key(
        tmp_path, monkeypatch, source: Source, batch: int):
    """A fold collapses each batch of records to each key's last state before writing it:
    random inserts, deletes and updates (some moving a row to another key) over many
    transactions, folded in batches smaller than a transaction and larger than the whole
    stream, give the table a Python dict of the same changes gives. No MariaDB rows are
    involved: the store is fed by hand."""
    import random

    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.churn (id INT PRIMARY KEY, v VARCHAR(20))")
    layout = _layout(source, "churn")
    stream = _Stream(str(tmp_path / "data"))
    rng, table = random.Random(batch), {}
    for _ in range(40):
        changes = []
        for _ in range(rng.randint(1, 30)):
            choice = rng.random()
            if choice < 0.4 or not table:
                key = rng.randint(0, 200)
                if key in table:
                    continue
                table[key] = f"v{rng.randint(0, 99)}"
                changes.append(Rows(layout, RowsKind.INSERT, 0, [(key, table[key])]))
            elif choice < 0.6:
                key = rng.choice(sorted(table))
                changes.append(Rows(layout, RowsKind.DELETE, 0, [(key, table.pop(key))]))
            else:
                key = rng.choice(sorted(table))
                moved = rng.randint(0, 200) if rng.random() < 0.3 else key
                if moved != key and moved in table:
                    continue
                before = (key, table.pop(key))
                table[moved] = f"u{rng.randint(0, 99)}"
                changes.append(Rows(layout, RowsKind.UPDATE, 0, [before, (moved, table[moved])]))
        await stream.transaction(changes, _position(source))
    monkeypatch.setattr(fold_module, "FOLD_BATCH", batch)
    views = Views(str(tmp_path / "views.sqlite"))
    try:
        folded = views.locked(views.fold, stream.catalog,
                              TableName(source.database, "churn"), ("id",))
        assert {row["id"]: (row["v"], count) for row, count in folded.rows()} == \
            {key: (value, 1) for key, value in table.items()}
    finally:
        views.close()
        stream.store.close()


def wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_read_that_meets_a_newer_schema_statement_is_told_to_read_again(source: Source):
    """Error 1412 (a table's definition changed after the consistent snapshot opened) is a
    race with a schema statement, not a fault of the table: the repair reads again at a new
    watermark instead of quarantining the table (the soak quarantined hundreds that way)."""
    from cdcserver.core.errors import DefinitionChanged
    from cdcserver.dump import rawrows

    table = f"`{source.database}`.raced"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO {table} VALUES (1, 1)")
    reader = source.server.connect(source.database)
    try:
        with reader.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        source.execute(f"ALTER TABLE {table} ADD COLUMN w INT, ALGORITHM=COPY")
        with pytest.raises(DefinitionChanged, match="1412"):
            list(rawrows.query_rows(reader, f"SELECT id, v FROM {table}"))
    finally:
        if reader.open:
            reader.close()


def test_a_read_of_a_myisam_table_holds_its_writes_off_until_it_closes(source: Source):
    """A consistent snapshot holds InnoDB's rows, not MyISAM's: a repair's read of a MyISAM
    table saw writes made after its watermark, and the stream then carried them again (the
    100,000-statement soak: inserts of keys the stream held, before-images of rows it had
    not yet changed). Another session now holds the table's writes off from before the
    watermark until the read closes."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY, v INT) ENGINE=MyISAM",
                   f"INSERT INTO `{db}`.m VALUES (1, 1)")
    layout = _layout(source, "m")
    view = ReadView(parse_source_url(source.url), [TableName(db, "m")])
    written = threading.Event()

    def write() -> None:
        source.execute(f"INSERT INTO `{db}`.m VALUES (2, 2)")
        written.set()

    writer = threading.Thread(target=write)
    try:
        writer.start()
        assert not written.wait(1.0), "a write went in after the watermark"
        assert view.rows(layout) == [(1, 1)]
    finally:
        view.close()
    writer.join(30)
    assert written.is_set() and source.query(f"SELECT COUNT(*) FROM `{db}`.m")[0][0] == 2


def test_a_read_of_a_myisam_table_without_the_lock_tables_privilege_goes_on_unheld(
        source: Source, caplog: pytest.LogCaptureFixture):
    """docs/operations.md: without ``LOCK TABLES`` the read goes on, with a warning that
    names the tables and the grant."""
    db, user = source.database, f"nolock{os.getpid()}"
    source.execute(f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY, v INT) ENGINE=MyISAM",
                   f"INSERT INTO `{db}`.m VALUES (1, 1)")
    for host in ("127.0.0.1", "localhost"):
        source.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY 'pw'",
                       f"GRANT SELECT, RELOAD, BINLOG MONITOR ON *.* TO '{user}'@'{host}'")
    try:
        view = ReadView(parse_source_url(source.server.url(user, "pw")),
                        [TableName(db, "m")])
        try:
            assert view.rows(_layout(source, "m")) == [(1, 1)]
        finally:
            view.close()
        assert "grant the replication user LOCK TABLES" in caplog.text
    finally:
        for host in ("127.0.0.1", "localhost"):
            source.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
