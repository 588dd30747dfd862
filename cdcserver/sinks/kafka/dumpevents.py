"""A table's dump as the initial snapshot's row events (:mod:`.snapshot`): its rows read in
blocks and made the inserts its topic receives, in the event loop or in the formatting
process (:mod:`.snapshotworker`), alike."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.messages.events import RowEvent, TableShape
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.layouts import layout_of
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.dump import DumpDecoder, DumpRows

READ_BYTES = 1 << 20  # a dump is read and decoded in pieces of this size


def header(path: str) -> dict[str, Any]:
    """The dump's first line: its table's definition, rows, point and time."""
    with open(path, "rb") as f:
        head: dict[str, Any] = json.loads(f.readline())
    return head


@dataclass
class DumpEvents:
    """The dump's rows as row events: inserts at the dump's point, numbered from 1, with
    Debezium's ``snapshot`` marker (``first`` of the first table, ``last`` of the last)."""

    shape: TableShape
    total: int
    gtid: Gtid
    created: int
    file: str
    pos: int
    first_table: bool
    last_table: bool
    number: int = 0

    @classmethod
    def of(cls, table: TableName, head: dict[str, Any], first_table: bool,
           last_table: bool) -> DumpEvents:
        layout = layout_of(table, TableDefinition.from_json(head["definition"]))
        shape = TableShape(table, TableSchema.from_layout(layout, 1, ""), layout)
        state = GtidState.parse(head["gtid"])
        return cls(shape, int(head["rows"]), next(iter(state), Gtid(0, 0, 0)),
                   int(dt.datetime.fromisoformat(head["created"]).timestamp()),
                   head["binlog"]["file"], int(head["binlog"]["pos"]), first_table,
                   last_table)

    def events(self, block: list[tuple[Any, ...]]) -> list[RowEvent]:
        """The next rows' events (one GTID, as a change's: the point's, of its first
        domain)."""
        text, total, out = str(self.gtid), self.total, []
        for values in block:
            self.number += 1
            number = self.number
            out.append(RowEvent(self.shape, "insert", None, values, self.gtid, number,
                                self.created, self.file, self.pos, number - 1, text, 0,
                                self.pos, marker(number, total, self.first_table,
                                                 self.last_table)))
        return out


def marker(number: int, total: int, first_table: bool, last_table: bool) -> str:
    """Debezium's ``source.snapshot`` of the row ``number`` of ``total``."""
    if number == total:
        return "last" if last_table else "last_in_data_collection"
    if number == 1:
        return "first" if first_table else "first_in_data_collection"
    return "true"


class DumpReading:
    """A dump file's rows, as tuples in column order (a resumed dump's updates and deletes
    applied: the snapshot holds the rows at its point)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self.decoder = DumpDecoder()
        self.pending: Iterator[DumpRows | Any] = iter(())
        self.ended = False

    def next_rows(self, at_least: int) -> list[tuple[Any, ...]] | None:
        rows: list[tuple[Any, ...]] = []
        while len(rows) < at_least:
            item = next(self.pending, None)
            if item is None:
                if self.ended:
                    break
                data = self.file.read(READ_BYTES)
                if not data:
                    self.decoder.finish()  # whole, and its checksum matches
                    self.ended = True
                    break
                self.pending = iter(list(self.decoder.feed(data)))
                continue
            if isinstance(item, DumpRows):
                if item.action != "insert":
                    raise ValueError(f"{self.file.name}: a resumed dump's {item.action} "
                                     "lines; the snapshot reads insert-only dumps")
                rows.extend(tuple(r.values()) for r in item.rows)
        return rows or None

    def close(self) -> None:
        self.file.close()
