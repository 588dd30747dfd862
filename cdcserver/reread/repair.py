"""The repair stage: changes the binlog carries no rows for become ordinary change records.

The pipeline passes every batch through :meth:`Repairer.process` before the sinks. Where a
transaction holds :class:`~cdcserver.core.changes.Rowless` markers (the decoder recognised a foreign
key's cascade, a partition's truncation, a value-rewriting ALTER...), the stage, before the
transaction goes on:

1. finds the rows concerned in the stream's own view of the table (:mod:`.view`): for a cascade
   the rows whose foreign-key columns held the parent keys the transaction deleted or changed
   (following further cascading foreign keys from there), otherwise every row;
2. reads exactly those rows from the source in one consistent read (:mod:`.readview`), whose
   binlog position and GTID state are the *watermark* S;
3. waits for the stream to reach S: right away if the transaction itself ends at S (the
   source had nothing newer), else at the later transaction after which the stream's GTID
   state is S's; changes the stream carries for those rows after S are its own truth, so such
   rows leave the repair (the merge step of DBLog's watermark algorithm);
4. at that point compares the view with the rows read and appends the difference to that
   transaction as ordinary records (``insert``, ``update_before``/``update_after``,
   ``delete``; ``Rows.repair`` says why), so a consumer that applies the stream holds the
   table as the source has it.

The checkpoint never passes a rowless change that was not repaired: while a repair waits for
its watermark the pipeline writes no checkpoint (:attr:`Repairer.pending`), so a crash replays
the change and it is recognised again; a pipeline started again in the same process (after a
full disk) gets the waiting repairs (:meth:`Repairer.carry_over`) and reads them again. A case
that cannot be repaired exactly (the table's columns are unknown) stops replication before
the change's ``Commit`` reaches any sink, with the way out in the message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    Commit,
    Ddl,
    Rowless,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import SchemaError, SourceError, SourceUnavailable
from cdcserver.core.gtid import BinlogPosition, binlog_ordinal, same_state
from cdcserver.dump.snapshot import DefinitionChanged, SnapshotPoint
from cdcserver.replication.sources import Sources
from cdcserver.reread.readview import ReadView
from cdcserver.reread.values import from_text
from cdcserver.reread.view import Row, TableView, Views, key_names
from cdcserver.store.catalog import Catalog
from cdcserver.store.naming import TableName
from cdcserver.store.schema import TableSchema

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class RepairStats:
    """Counted for /metrics: rowless changes recognised and records emitted to repair them."""

    rowless: dict[str, int] = field(default_factory=dict)  # by kind of cause
    repairs: int = 0  # repairs attached to the stream
    records: dict[str, int] = field(default_factory=dict)  # by event type


@dataclass
class _Scope:
    """The rows of one table a repair covers: ``keys`` (None: every row) and what the
    source held for them at the watermark."""

    table: TableName
    layout: TableLayout
    reason: str
    keys: set[bytes] | None
    source: dict[bytes, tuple[Row, int]] = field(default_factory=dict)


@dataclass
class _Pending:
    point: SnapshotPoint
    cause: str  # the GTID of the transaction that made the change
    scopes: list[_Scope]
    markers: list[Rowless]  # what was recognised, to read again if the pipeline restarts


class Repairer:
    def __init__(self, address: SourceAddress | Sources, catalog: Catalog, views: Views,
                 stats: RepairStats | None = None) -> None:
        self.sources = Sources.of(address)
        self.catalog = catalog
        self.views = views
        self.stats = stats if stats is not None else RepairStats()
        self._pending: list[_Pending] = []
        self._again: list[tuple[list[Rowless], str]] = []  # carried over, to read again
        self._begin: Begin | None = None
        self._found: list[Rowless] = []  # in the open transaction
        self._txn_rows: list[Rows] = []  # of the open transaction
        self._sequence_rows: dict[TableName, Row] = {}  # sequences it wrote, their new row
        self._batch_rows: list[Rows] = []  # committed earlier in this batch (not in the store)
        self._reissue: list[tuple[list[Rowless], str]] = []  # to read again at this commit

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    @property
    def pending(self) -> bool:
        """Whether a repair waits for the stream to reach its watermark (then no checkpoint
        may be written: it would pass the change the repair is for)."""
        return bool(self._pending or self._again)

    def carry_over(self) -> list[tuple[list[Rowless], str]]:
        """The waiting repairs (markers and cause), for the next pipeline's repairer."""
        return [(p.markers, p.cause) for p in self._pending] + self._again

    def take_over(self, waiting: list[tuple[list[Rowless], str]]) -> None:
        """Repairs a previous pipeline left waiting: read again before the first batch."""
        self._again = list(waiting)

    async def process(self, batch: list[Change]) -> list[Change]:
        while self._again:
            markers, cause = self._again[0]
            await self._start(markers, cause, None)
            self._again.pop(0)
        out: list[Change] = []
        self._batch_rows = []
        for change in batch:
            if isinstance(change, Begin):
                self._begin, self._found, self._txn_rows = change, [], []
                self._sequence_rows = {}
            elif isinstance(change, Rows):
                if change.layout.sequence and change.kind == RowsKind.INSERT:
                    change = await asyncio.to_thread(self._sequence_write, change)
                self._txn_rows.append(change)
                self._merge(change)
            elif isinstance(change, Rowless):
                self._found.append(change)
                kind = "foreign key" if change.columns else "statement"
                self.stats.rowless[kind] = self.stats.rowless.get(kind, 0) + 1
                log.debug("%s: rows changed without row events (%s) in %s",
                          change.qualified_name, change.reason,
                          self._begin.gtid if self._begin else "?")
            elif isinstance(change, Ddl):
                self._schema_changed(change)
            elif isinstance(change, Abort):
                self._begin, self._found, self._txn_rows = None, [], []
                self._sequence_rows = {}
            elif isinstance(change, Commit):
                out += await self._committing(change)
            out.append(change)
        return out

    async def _committing(self, commit: Commit) -> list[Change]:
        """The transaction ends: bring the views up to it, start a repair for what it
        changed without rows, and attach the repairs whose watermark it reaches."""
        watched = [r for r in self._txn_rows if self.views.get(_name(r.layout)) is not None]
        if watched:
            await asyncio.to_thread(_apply_all, self.views, watched)
        found, self._found = self._found, []
        again, self._reissue = self._reissue, []
        for markers, cause in again:
            await self._start(markers, cause, commit)
        if found:
            assert self._begin is not None
            await self._start(found, str(self._begin.gtid), commit)
        self._batch_rows += self._txn_rows
        self._txn_rows = []
        self._begin = None
        return await self._attach_due(commit)

    def _schema_changed(self, ddl: Ddl) -> None:
        """A statement renamed, dropped, emptied or altered tables. Their views are built
        again from the store when next needed (the pipeline stores each such statement's
        transaction before the next: :func:`cdcserver.core.pipeline.segments`). A repair whose
        rows were read after the statement (its watermark is later) read the table as the
        statement left it, not as the stream has it before the statement: it is read again
        once the statement has passed, under the table's new name and columns (a dropped or
        truncated table needs no repair any more)."""
        touched = {TableName(c.database, c.table): c for c in ddl.changes}
        for table in touched:
            self.views.drop(table)
        for pending in list(self._pending):
            if _after(ddl.file, ddl.pos, pending.point) or \
                    not any(s.table in touched for s in pending.scopes):
                continue
            self._pending.remove(pending)
            markers = [m for m in (_retarget(m, ddl) for m in pending.markers) if m is not None]
            if markers:
                self._reissue.append((markers, pending.cause))

    def _sequence_write(self, rows: Rows) -> Rows:
        """A sequence has one row; MariaDB logs each write of it (NEXTVAL past the cache,
        SETVAL) as an insert. In the stream it is what it is: an update of that row."""
        table = _name(rows.layout)
        names = [c.name for c in rows.layout.columns]
        current = self._sequence_rows.get(table)  # written earlier in this transaction
        if current is None:
            found = [row for row, count in self._view(table, rows.layout).rows()
                     for _ in range(count)]
            if len(found) != 1:
                return rows  # no row yet (or a view that cannot tell): an insert
            current = found[0]
        pairs: list[tuple[Any, ...]] = []
        for after in rows.rows:
            pairs += [tuple(current.get(n) for n in names), tuple(after)]
            current = dict(zip(names, after, strict=True))
        self._sequence_rows[table] = current
        return Rows(rows.layout, RowsKind.UPDATE, rows.timestamp, pairs, rows.file, rows.pos,
                    start=rows.start)

    # -- 1 and 2: what to read, and reading it ---------------------------------------------

    async def _start(self, markers: list[Rowless], cause: str, commit: Commit | None) -> None:
        """Read what ``markers`` name at a watermark; the repair waits for the stream there
        (``commit``: the transaction that made the changes, not yet passed on)."""
        markers = list(markers)
        tables = {TableName(m.database, m.table) for m in markers}
        tables |= {TableName.parse(e.child) for m in markers for e in m.edges}
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                pending = await asyncio.to_thread(self._read, markers, tables, cause)
                break
            except (DefinitionChanged, SourceUnavailable, pymysql.err.OperationalError,
                    pymysql.err.InterfaceError) as exc:
                if attempt == len(RETRY_DELAYS):
                    raise SourceError(f"cannot re-read the rows {cause} changed without row "
                                      f"events: {exc}") from exc
                log.warning("re-reading the rows %s changed: %s; trying again", cause, exc)
                await asyncio.sleep(RETRY_DELAYS[attempt])
        if pending is not None:
            self._pending.append(pending)
            if commit is None or not _reached(commit.position, pending.point):
                log.info("%s: the repair of %s waits for the stream to reach %s:%d", cause,
                         ", ".join(sorted({m.qualified_name for m in markers})),
                         pending.point.file, pending.point.pos)

    def _read(self, markers: list[Rowless], tables: set[TableName], cause: str
              ) -> _Pending | None:
        """In a thread: the scopes' candidate rows from the views, then the source's rows for
        them at one watermark, following cascades as far as they reach. None when no row of
        the stream is concerned."""
        scopes: dict[TableName, _Scope] = {}
        queue = []
        for marker in markers:
            layout = _layout(marker)
            view = self._view(TableName(marker.database, marker.table), layout)
            if self._scope(scopes, marker, view, layout) is not None:
                queue.append((marker, view))
        if not queue:
            return None
        read = ReadView(self.address, sorted(tables))
        try:
            done: set[TableName] = set()
            while queue:
                marker, view = queue.pop(0)
                scope = scopes[TableName(marker.database, marker.table)]
                if scope.table in done and scope.keys is None:
                    continue
                changed = self._read_scope(read, scope, view)
                done.add(scope.table)
                for follow in _cascades(marker, changed):
                    layout = _layout(follow)
                    child = self._view(TableName(follow.database, follow.table), layout)
                    if self._scope(scopes, follow, child, layout) is not None:
                        queue.append((follow, child))
            return _Pending(read.point, cause, list(scopes.values()), markers)
        finally:
            read.close()

    def _view(self, table: TableName, layout: TableLayout) -> TableView:
        view = self.views.get(table)
        if view is None or view.key != key_names(layout):
            view = self.views.fold(self.catalog, table, key_names(layout))
            for rows in self._batch_rows + self._txn_rows:  # not in the store yet
                if _name(rows.layout) == table:
                    view.apply(rows)
        return view

    @staticmethod
    def _scope(scopes: dict[TableName, _Scope], marker: Rowless, view: TableView,
               layout: TableLayout) -> _Scope | None:
        table = TableName(marker.database, marker.table)
        scope = scopes.get(table)
        if scope is None:
            scope = scopes[table] = _Scope(table, layout, marker.reason, set())
        elif marker.reason not in scope.reason:
            scope.reason += f"; {marker.reason}"
        if not marker.columns or not view.key:
            scope.keys = None  # every row (a table without a key is compared whole)
        elif scope.keys is not None:
            before = len(scope.keys)
            scope.keys |= {view.key_of(r) for r in view.matching(marker.columns, marker.values)}
            if len(scope.keys) == before:
                return None
        return scope

    @staticmethod
    def _read_scope(read: ReadView, scope: _Scope, view: TableView
                    ) -> list[tuple[Row | None, Row | None]]:
        """Read the scope's rows at the watermark; return how the view's rows differ from
        them there (for following cascades)."""
        layout = scope.layout
        names = [c.name for c in layout.columns]
        if scope.keys is None:
            rows = read.rows(layout)
        else:
            index = layout.primary_key
            wanted = [view.get(k) for k in scope.keys]
            keys = [tuple(r[names[i]] for i in index) for r in wanted if r is not None]
            rows = read.rows(layout, index, keys)
        scope.source = {}
        for values in rows:
            row = dict(zip(names, values, strict=True))
            key = view.key_of(row)
            known = scope.source.get(key)
            scope.source[key] = (row, known[1] + 1 if known else 1)
        return _differences(view, scope)

    # -- 3 and 4: reaching the watermark, and the difference ---------------------------------

    def _merge(self, rows: Rows) -> None:
        """Rows the stream changes after a pending repair's watermark are its own truth."""
        table = _name(rows.layout)
        for pending in self._pending:
            if not _after(rows.file, rows.pos, pending.point):
                continue
            for scope in pending.scopes:
                if scope.table == table and scope.keys is not None:
                    view = self.views.get(table)
                    if view is None:
                        continue
                    names = [c.name for c in rows.layout.columns]
                    for values in rows.rows:
                        key = view.key_of(dict(zip(names, values, strict=True)))
                        scope.keys.discard(key)
                        scope.source.pop(key, None)

    async def _attach_due(self, commit: Commit) -> list[Change]:
        due = [p for p in self._pending if _reached(commit.position, p.point)]
        if not due:
            return []
        self._pending = [p for p in self._pending if not any(p is d for d in due)]
        out: list[Change] = []
        for pending in due:
            rows = await asyncio.to_thread(self._difference, pending, commit)
            out += rows
        return out

    def _difference(self, pending: _Pending, commit: Commit) -> list[Rows]:
        out: list[Rows] = []
        for scope in pending.scopes:
            view = self.views.get(scope.table)
            if view is None:
                continue
            note = json.dumps({"reason": scope.reason, "cause": pending.cause},
                              ensure_ascii=False, separators=(", ", ": "))
            made = _records(scope, view, note, commit)
            for rows in made:
                view.apply(rows)
                self.stats.records[rows.kind] = self.stats.records.get(rows.kind, 0) + \
                    len(rows.rows)
            if made:
                log.info("%s: repaired %d rows at the watermark %s:%d (%s)", scope.table,
                         sum(len(r.rows) // (2 if r.kind == RowsKind.UPDATE else 1)
                             for r in made), pending.point.file, pending.point.pos, note)
            out += made
        self.stats.repairs += 1
        return out


_CASCADING = frozenset({"cascade", "set null", "set default"})


def _cascades(marker: Rowless, changed: list[tuple[Row | None, Row | None]]) -> list[Rowless]:
    """Where the rows a repair changes are themselves parents: the rows of their children
    that a cascade may have reached too."""
    table = marker.qualified_name
    follow = []
    for edge in marker.edges:
        if edge.parent != table:
            continue
        values, events = [], set()
        for mine, theirs in changed:
            if mine is None:
                continue
            before = tuple(mine.get(c) for c in edge.parent_columns)
            if any(v is None for v in before):
                continue
            deleted = theirs is None and edge.on_delete in _CASCADING
            rekeyed = theirs is not None and edge.on_update in _CASCADING and \
                before != tuple(theirs.get(c) for c in edge.parent_columns)
            if deleted or rekeyed:
                values.append(before)
                events.add(f"ON DELETE {edge.on_delete.upper()}" if deleted
                           else f"ON UPDATE {edge.on_update.upper()}")
        if values:
            database, _, name = edge.child.partition(".")
            follow.append(Rowless(database, name, f"{', '.join(sorted(events))} of {table}",
                                  edge.columns, tuple(values), edge.layout, marker.edges))
    return follow


def _retarget(marker: Rowless, ddl: Ddl) -> Rowless | None:
    """``marker`` after ``ddl``: under the table's new name and columns; None when the
    statement dropped or emptied the table (and with it the rows to repair)."""
    table = marker.qualified_name
    for change in ddl.changes:
        if f"{change.database}.{change.table}" != table:
            continue
        if change.kind == "drop" and change.renamed:
            new = next((c for c in ddl.changes if c.kind == "create"
                        and f"{c.database}.{c.table}" == change.renamed), None)
            if new is None or new.layout is None:
                return None
            return replace(marker, database=new.database, table=new.table, layout=new.layout)
        if change.kind in ("drop", "truncate", "create"):
            return None
        if change.layout is not None:
            marker = replace(marker, layout=change.layout)
    return marker


def _apply_all(views: Views, rows: list[Rows]) -> None:
    for change in rows:
        views.apply(change)


def _name(layout: TableLayout) -> TableName:
    return TableName(layout.database, layout.table)


def _layout(marker: Rowless) -> TableLayout:
    if marker.layout is None:
        raise SchemaError(
            f"{marker.qualified_name}: rows changed without row events ({marker.reason}), and "
            "the table's columns are not known, so the change cannot be re-read exactly. "
            "Replication stops before it. Run `cdcserver schema forget "
            f"{marker.database}.{marker.table} --data-dir DIR` to re-learn the table from the "
            "source, then restart.")
    return marker.layout


def _after(file: str, pos: int, point: SnapshotPoint) -> bool:
    return bool(file) and binlog_ordinal(file, pos) > binlog_ordinal(point.file, point.pos)


def _reached(position: BinlogPosition, point: SnapshotPoint) -> bool:
    """Whether the stream, right after the transaction that ends at ``position``, stands at
    the watermark (or has passed it: the merge step kept the repair exact)."""
    if same_state(position.gtid_state, point.gtid):
        return True
    return bool(position.file) and binlog_ordinal(position.file, position.pos) >= \
        binlog_ordinal(point.file, point.pos)


def _differences(view: TableView, scope: _Scope) -> list[tuple[Row | None, Row | None]]:
    """(the view's row, the source's row) for each row that differs; None where absent."""
    changed: list[tuple[Row | None, Row | None]] = []
    if view.key:
        keys: set[bytes] = set(scope.keys) if scope.keys is not None else \
            {view.key_of(r) for r, _ in view.rows()} | set(scope.source)
        for key in keys:
            mine = view.get(key)
            theirs = scope.source.get(key)
            source_row = theirs[0] if theirs else None
            if mine is None and source_row is None:
                continue
            if mine is None or source_row is None or not _same_row(mine, source_row):
                changed.append((mine, source_row))
        return changed
    mine_counts: dict[bytes, tuple[Row, int]] = {view.key_of(r): (r, n) for r, n in view.rows()}
    for key in set(mine_counts) | set(scope.source):
        row_a, a = mine_counts.get(key, (None, 0))
        row_b, b = scope.source.get(key, (None, 0))
        changed += [(row_a, None)] * max(a - b, 0) + [(None, row_b)] * max(b - a, 0)
    return changed


def _same_row(mine: Row, theirs: Row) -> bool:
    """A column the stream's row lacks (added after the row was sent) is NULL to a
    consumer: the same as the source's NULL, different from any default value."""
    return all(mine.get(name) == value for name, value in theirs.items())


def _records(scope: _Scope, view: TableView, note: str, commit: Commit) -> list[Rows]:
    layout = scope.layout
    names = [c.name for c in layout.columns]

    def values(row: Row) -> tuple[Any, ...]:
        return tuple(row.get(n) for n in names)

    inserts, updates, deletes = [], [], []
    changed = _differences(view, scope)
    sample = {n: type(r[n]) for _, r in changed if r is not None for n in names
              if r.get(n) is not None}
    fit = _Fit(layout, sample)
    for mine, theirs in changed:
        if mine is None and theirs is not None:
            inserts.append(values(theirs))
        elif theirs is None and mine is not None:
            deletes.append(values(fit(mine, None)))
        elif mine is not None and theirs is not None:
            updates += [values(fit(mine, theirs)), values(theirs)]
    if layout.sequence and len(deletes) == len(inserts) == 1:  # its one row, changed
        updates, deletes, inserts = [deletes[0], inserts[0]], [], []
    out = []
    for kind, rows in ((RowsKind.DELETE, deletes), (RowsKind.UPDATE, updates),
                       (RowsKind.INSERT, inserts)):
        if rows:
            out.append(Rows(layout, kind, commit.timestamp, _sorted(rows, layout, kind),
                            commit.position.file, commit.position.pos, repair=note))
    return out


class _Fit:
    """A row as the stream last had it, in the table's columns now: a value of a column
    whose type an ALTER changed is converted the way its text reads in the new type (or,
    failing that, is the source's value, or NULL), so that the store can write it."""

    def __init__(self, layout: TableLayout, sample: dict[str, type]) -> None:
        fields = TableSchema.from_layout(layout, 0, "").columns
        self.converters = {f.column: from_text(f) for f in fields}
        self.sample = sample

    def __call__(self, mine: Row, theirs: Row | None) -> Row:
        row = dict(mine)
        for name, value in mine.items():
            expected = self.sample.get(name)
            if value is None or expected is None or isinstance(value, expected) or \
                    name not in self.converters:
                continue
            try:
                text = value if isinstance(value, bytes) else str(value).encode("utf-8")
                row[name] = self.converters[name](text)
            except (ValueError, TypeError, ArithmeticError):
                row[name] = theirs.get(name) if theirs is not None else None
        return row


def _sorted(rows: list[tuple[Any, ...]], layout: TableLayout, kind: RowsKind
            ) -> Sequence[tuple[Any, ...]]:
    """In key order, so that two services make the same records (pairs stay together)."""
    key = layout.primary_key or tuple(range(len(layout.columns)))

    def order(row: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(repr(row[i]) for i in key)

    if kind != RowsKind.UPDATE:
        return sorted(rows, key=order)
    pairs = sorted(zip(rows[::2], rows[1::2], strict=True), key=lambda p: order(p[0]))
    return [row for pair in pairs for row in pair]

