"""A mapped table: what a ``TABLE_MAP`` event tells the decoder about the rows events after it.

The layout its rows are stored in (the ``[capture]`` column rules applied), how its row images
decode to those rows, and whether they are handed over undecoded; with the helpers that read a
rows event's column bitmaps and drop the update pairs the column rules made the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.replication.rowcodec import RowsDecoder, compile_rows_decoder
from cdcserver.schema.masking import Projection, RowFunction

DeferDecoding = Callable[[tuple[ColumnDef, ...]], bool]


class MappedTable:
    """A mapped table: the layout its rows are stored in (the ``[capture]`` column rules
    applied), how its row images decode to those rows, and whether they are handed over
    undecoded."""

    __slots__ = ("captured", "decode", "deferred", "layout", "ruled", "width")

    def __init__(self, layout: TableLayout, defer: DeferDecoding | None,
                 captured: bool = True, projection: Projection | None = None) -> None:
        self.width = len(layout.columns)  # of the row image
        self.captured = captured
        # column rules apply: an update's images may be the same once they are applied
        self.ruled = projection is not None
        decode = compile_rows_decoder(layout.columns)
        if projection is not None:
            layout = projection.layout
            decode = _projected(decode, projection.row)
        self.layout = layout
        self.decode: RowsDecoder = decode
        self.deferred = defer is not None and defer(layout.image_columns)


def changed_pairs(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """An update's before/after pairs without those the column rules made the same: an
    update of excluded or masked columns only would otherwise tell that, and when, they
    changed (a hashed column's change shows: its hash changes)."""
    if all(rows[i] != rows[i + 1] for i in range(0, len(rows), 2)):
        return rows
    return [row for i in range(0, len(rows), 2) if rows[i] != rows[i + 1]
            for row in rows[i:i + 2]]


def _projected(decode: RowsDecoder, project: RowFunction) -> RowsDecoder:
    def decode_projected(buf: bytes, pos: int, end: int) -> list[tuple[Any, ...]]:
        return [project(row) for row in decode(buf, pos, end)]
    return decode_projected


def full_image(bitmap: bytes, count: int) -> bool:
    """Whether a row event's column bitmap names every one of its ``count`` columns."""
    full = (1 << count) - 1
    return int.from_bytes(bitmap, "little") & full == full
