"""Reading a dump as a consumer does: a dump file from disk, and applying its operations to a
table held in memory. The format itself (header, operations, values) is
:mod:`mariadb_cdc_client.format.dump`, which the service shares."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mariadb_cdc_client.format.dump import (
    DumpDecoder,
    DumpError,
    DumpHeader,
    DumpRows,
    decode_value,
)

__all__ = ["DumpDecoder", "DumpError", "DumpHeader", "DumpRows", "apply", "decode_value",
           "read_dump"]


def read_dump(path: str) -> Iterator[DumpHeader | DumpRows]:
    """A dump file's header, then its operations; checks the checksum at the end."""
    decoder = DumpDecoder()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            yield from decoder.feed(data)
    decoder.finish()


def apply(rows: dict[tuple[Any, ...], dict[str, Any]], key: list[str], op: DumpRows) -> None:
    """Apply an operation to a table held as {primary key: row} (upsert semantics). A table
    without a primary key (``key`` empty) is keyed by whole rows, so identical rows count
    once: keep such a table's dump rows as a list instead."""
    def pk(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in key) if key else tuple(row.values())

    if op.action == "insert":
        for row in op.rows:
            rows[pk(row)] = row
    elif op.action == "delete":
        for row in op.rows:
            rows.pop(pk(row), None)
    elif op.action == "update":
        for before, after in zip(op.rows[0::2], op.rows[1::2], strict=True):
            rows.pop(pk(before), None)
            rows[pk(after)] = after
    else:
        raise ValueError(f"unknown dump action {op.action!r}")
