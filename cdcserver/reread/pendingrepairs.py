"""The repairs read at their watermarks, waiting for the stream to reach them
(:class:`Pending`), kept in watermark order and by table.

A stream that lags holds thousands of them (a replay after a crash reads every cascade since
the checkpoint again, all waiting for one far watermark). Each row event asks which of them
its table's rows come before or after, each commit which it reaches, and each part of the
pipeline which causes are still waiting: a walk over all of them at every event made a
replay's time grow with the square of the repairs (the exactly-once Kafka test's 9,200
cascades: 65 of its 80 s of event loop). Here each question looks at the repairs it
concerns: a bisection in the watermark order, and the cause set kept as they come and go.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cdcserver.core.changes import Rowless
from cdcserver.core.gtid import binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.dump.snapshot import SnapshotPoint
from cdcserver.reread.difference import Scope, Stand, same_state


@dataclass
class Pending:
    """A repair read at its watermark, waiting for the stream to reach it."""

    point: SnapshotPoint
    cause: str  # the GTID of the transaction that made the change
    scopes: list[Scope]
    markers: list[Rowless]  # what was recognised, to read again if the pipeline restarts
    resync: bool = False  # a quarantined table's resync: released, in a version of its own
    started: float = 0.0  # (monotonic) when the resync was asked for

    @functools.cached_property
    def tables(self) -> frozenset[TableName]:
        """The tables of its scopes (a lagging stream asks, of each row event, which of
        thousands of waiting repairs concern its table)."""
        return frozenset(s.table for s in self.scopes)


_Entry = tuple[tuple[int, int], int]  # (watermark ordinal, arrival): sorts by watermark
_LAST = 1 << 62  # an arrival after every other: bisects past the entries of one ordinal


class PendingRepairs:
    """The waiting repairs: iterated in the order they arrived, asked by watermark."""

    def __init__(self, repairs: Iterable[Pending] = ()) -> None:
        self._arrival = itertools.count()
        self._repairs: dict[int, Pending] = {}  # by arrival, in arrival order
        self._order: list[_Entry] = []
        self._by_table: dict[TableName, list[_Entry]] = {}
        self._by_sequences: dict[frozenset[tuple[int | str, int]], set[int]] = {}
        self._causes: Counter[str] = Counter()
        self._cause_set: frozenset[str] | None = frozenset()
        for repair in repairs:
            self.add(repair)

    def __len__(self) -> int:
        return len(self._repairs)

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._repairs.values()))

    def add(self, repair: Pending) -> None:
        arrival = next(self._arrival)
        entry = (repair.point.ordinal, arrival)
        self._repairs[arrival] = repair
        bisect.insort(self._order, entry)
        for table in repair.tables:
            bisect.insort(self._by_table.setdefault(table, []), entry)
        self._by_sequences.setdefault(repair.point.sequences, set()).add(arrival)
        self._causes[repair.cause] += 1
        self._cause_set = None

    def remove(self, repair: Pending) -> None:
        arrival = next(a for a, r in self._entries_at(repair.point.ordinal) if r is repair)
        self._forget((repair.point.ordinal, arrival))

    def concerns(self, table: TableName) -> bool:
        """Whether a repair waiting reads ``table``."""
        return table in self._by_table

    def before(self, table: TableName, file: str, pos: int) -> list[Pending]:
        """The repairs of ``table`` whose watermark the event ending at ``file``:``pos`` does
        not pass (their reads do not hold its change yet: it is told as the stream holds
        the rows, :mod:`.asheld`)."""
        entries = self._by_table.get(table, [])
        if file:
            entries = entries[bisect.bisect_left(entries, (binlog_ordinal(file, pos), -1)):]
        return [self._repairs[arrival] for _, arrival in entries]

    def passed(self, table: TableName, file: str, pos: int) -> list[Pending]:
        """The repairs of ``table`` whose watermark the event ending at ``file``:``pos``
        passes (its rows are theirs: :func:`~.difference.past_watermark`)."""
        if not file:
            return []
        entries = self._by_table.get(table, [])
        ends = bisect.bisect_left(entries, (binlog_ordinal(file, pos), -1))
        return [self._repairs[arrival] for _, arrival in entries[:ends]]

    def take_reached(self, stand: Stand) -> list[Pending]:
        """The repairs whose watermark the stream reaches at ``stand``
        (:meth:`Stand.reached`), taken out, in the order they arrived."""
        due: set[int] = set()
        if stand.ordinal is not None:
            ends = bisect.bisect_right(self._order, (stand.ordinal, _LAST))
            due.update(arrival for _, arrival in self._order[:ends])
        for arrival in self._by_sequences.get(stand.sequences, ()):
            if same_state(stand.position.gtid_state, self._repairs[arrival].point.gtid):
                due.add(arrival)
        taken = [self._repairs[arrival] for arrival in sorted(due)]
        for arrival, repair in zip(sorted(due), taken, strict=True):
            self._forget((repair.point.ordinal, arrival))
        return taken

    def causes(self) -> frozenset[str]:
        """The causes of the repairs waiting (the same set until one comes or goes)."""
        if self._cause_set is None:
            self._cause_set = frozenset(self._causes)
        return self._cause_set

    def _entries_at(self, ordinal: tuple[int, int]) -> Iterator[tuple[int, Pending]]:
        start = bisect.bisect_left(self._order, (ordinal, -1))
        ends = bisect.bisect_right(self._order, (ordinal, _LAST))
        for _, arrival in self._order[start:ends]:
            yield arrival, self._repairs[arrival]

    def _forget(self, entry: _Entry) -> None:
        arrival = entry[1]
        repair = self._repairs.pop(arrival)
        del self._order[bisect.bisect_left(self._order, entry)]
        for table in repair.tables:
            entries = self._by_table[table]
            del entries[bisect.bisect_left(entries, entry)]
            if not entries:
                del self._by_table[table]
        same = self._by_sequences[repair.point.sequences]
        same.discard(arrival)
        if not same:
            del self._by_sequences[repair.point.sequences]
        self._causes[repair.cause] -= 1
        if not self._causes[repair.cause]:
            del self._causes[repair.cause]
        self._cause_set = None
