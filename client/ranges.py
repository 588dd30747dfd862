"""Reading a table in ranges: positions, planning a range of at most n records, reading it.

A :class:`Position` is where a reader of one table stands: every transaction its GTID state
covers has been read, and of the transaction ``txn`` (the next one, when a range had to cut a
transaction larger than its limit) the records numbered up to ``event``. A range is two
positions of one table; reading it is ``REQUEST-DATA db.t AFTER start UNTIL end`` (the bounded
read extension) with the two cut transactions trimmed by event number, so the same range
always yields the same records. Planning one is ``QUERY-RANGE`` plus that cut.

The Spark source is built on this; so can any reader that works in batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from client.sync import SyncCdcConnection
from client.wire import DataRequest, RangeQuery

_MARIADB = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MYSQL = re.compile(r"^([0-9a-fA-F-]{36}):(?:\d+-)?(\d+)$")


def _state_items(state: str) -> dict[str, str]:
    """A GTID state's items by what it keeps one of: the domain, or a MySQL source UUID."""
    items = {}
    for item in filter(None, (i.strip() for i in state.split(","))):
        if m := _MARIADB.match(item):
            items[m[1]] = item
        elif m := _MYSQL.match(item):
            items[m[1].lower()] = f"{m[1].lower()}:1-{m[2]}"
        else:
            raise ValueError(f"not a GTID state: {state!r}")
    return items


def advance(state: str, gtid: str) -> str:
    """``state`` with ``gtid``'s domain (or source) moved to ``gtid``."""
    items = _state_items(state)
    items.update(_state_items(gtid))
    return ",".join(items[k] for k in sorted(items))


def gtid_parts(gtid: str) -> tuple[int, int, int]:
    """(domain, server_id, sequence) of a GTID (or a one-item state) as records carry them
    (a MySQL ``uuid:N`` is domain 0, server 0)."""
    if m := _MARIADB.match(gtid):
        return int(m[1]), int(m[2]), int(m[3])
    if m := _MYSQL.match(gtid):
        return 0, 0, int(m[2])
    raise ValueError(f"not a GTID: {gtid!r}")


def _transaction_key(gtid: str) -> tuple[int, int]:
    """(domain, sequence): what identifies a transaction's records."""
    domain, _, sequence = gtid_parts(gtid)
    return domain, sequence


@dataclass(frozen=True)
class Position:
    state: str = ""  # every transaction this GTID state covers is read ("": none)
    txn: str = ""  # and of this transaction, the one after the state...
    event: int = 0  # ...the records numbered up to this

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gtid_state": self.state}
        if self.txn:
            data.update(txn=self.txn, event=self.event)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Position:
        return cls(data.get("gtid_state", ""), data.get("txn", ""), int(data.get("event", 0)))

    @property
    def read_state(self) -> str:
        """The state a bounded read has to run to for this position to be inside it."""
        return advance(self.state, self.txn) if self.txn else self.state


def plan(conn: SyncCdcConnection, table: str, start: Position, limit: int,
         until: str | None = None) -> tuple[Position, int]:
    """The furthest end position after ``start`` such that the range holds at most ``limit``
    records of ``table``, within what the service has stored (and within the GTID state
    ``until``, if given), with the number of events it holds (at least its records). A
    transaction bigger than the limit is cut by event number."""
    database, _, name = table.partition(".")
    base, budget = start.state, limit
    if start.txn:
        events = int(conn.query(f"QUERY-TRANSACTION {start.txn}")["events"])
        if events - start.event > limit:
            return Position(start.state, start.txn, start.event + limit), limit
        base, budget = advance(start.state, start.txn), limit - (events - start.event)
        if budget == 0:
            return Position(base), limit
    reply = conn.query(RangeQuery(database, name, base, budget, until or "").line())
    end, following, used = reply["end"], reply["next"], limit - budget + reply["events"]
    if reply["events"] or following is None or budget < limit:
        return Position(end), used
    return Position(end, following["gtid"], limit), limit  # one transaction alone is too big


@dataclass(frozen=True)
class Schema:
    """A version's schema line, as a bounded read sends it before the version's records."""

    avsc: dict[str, Any]


def read(conn: SyncCdcConnection, table: str, start: Position, end: Position,
         loads: Any) -> Iterator[Schema | dict[str, Any]]:
    """The records of ``table`` after ``start`` up to ``end``, each version's schema first.
    ``loads`` parses one JSON line. Raises ConnectionError if the range was cut short."""
    if end.read_state == "" or start == end:
        return
    database, _, name = table.partition(".")
    request = DataRequest(database, name, None, None, start.state or None, end.read_state)
    skip = _transaction_key(start.txn) if start.txn else None
    stop = _transaction_key(end.txn) if end.txn else None
    for line in conn.lines(request):
        data = loads(line)
        if "event_type" in data:
            key = (data["domain"], data["sequence"])
            if key == skip and data["event_number"] <= start.event:
                continue
            if key == stop and data["event_number"] > end.event:
                continue
            yield data
        elif "fields" in data:
            yield Schema(data)
        elif "end" in data:
            return
    raise ConnectionError(f"the bounded read of {table} ended without its end line")
