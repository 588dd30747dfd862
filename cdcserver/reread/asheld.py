"""A row event between a change without binlog rows and its repair, told as a consumer holds
the table.

After a change the binlog carries no rows for (a cascade, a statement-logged change, a
rewriting ALTER), the source's rows and the stream's differ until the repair's records go out
at the watermark. A row event in between is the binlog's: its ``update_before`` or ``delete``
image is the source's row, which the stream may never have carried (a cascade set the column
NULL; a statement inserted the row; a rollback to a savepoint kept it out). Sent as it is, a
consumer that audits before-images finds one that is not the row it holds, a delete of a row
it never had, an insert of a key it already holds.

:func:`as_held` tells the same change against the stream's own rows (the table's view): each
before-image is the row held for its key; an update or delete of a key not held becomes an
insert of the new row, or nothing; an insert of a key held becomes an update from the row
held. The after-images stay the binlog's: what the source has from then on. A consumer that
applies records by key ends the same either way, and the repair at the watermark compares
the view (which follows these records) with the source there, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cdcserver.core.changes import Rows, RowsKind
from cdcserver.reread.difference import Fit
from cdcserver.reread.tableview import Row, TableView

Held = Callable[[bytes], Row | None]


def as_held(rows: Rows, view: TableView, overlay: dict[bytes, Row | None]) -> list[Rows]:
    """``rows`` told against the rows held (``view``, and ``overlay``: what this
    transaction changed in it so far, which the view takes at its commit). The same
    ``rows`` object when nothing differs."""
    names = [c.name for c in rows.layout.columns]

    def held(key: bytes) -> Row | None:
        return overlay[key] if key in overlay else view.get(key)

    images = list(rows.rows)
    told = _Told(names, Fit(rows.layout))
    if rows.kind == RowsKind.INSERT:
        for after in images:
            told.put(view, held, overlay, dict(zip(names, after, strict=True)), after)
    elif rows.kind == RowsKind.DELETE:
        for before in images:
            told.remove(view, held, overlay, dict(zip(names, before, strict=True)), before)
    else:
        for before, after in zip(images[::2], images[1::2], strict=True):
            old, new = dict(zip(names, before, strict=True)), dict(zip(names, after,
                                                                      strict=True))
            if view.key_of(old) == view.key_of(new):
                told.update(view, held, overlay, old, before, new, after)
            else:
                told.remove(view, held, overlay, old, before)
                told.put(view, held, overlay, new, after)
    if not told.changed and all(kind == rows.kind for kind, _ in told.runs):
        return [rows]
    return [replace(rows, kind=kind, rows=run, images=None) for kind, run in told.runs]


class _Told:
    """The records as told, in runs of one kind."""

    def __init__(self, names: list[str], fit: Fit) -> None:
        self.names = names
        self.fit = fit  # a row held in an older version's types, in the event's
        self.runs: list[tuple[RowsKind, list[tuple[Any, ...]]]] = []
        self.changed = False  # an image differs from the binlog's

    def _add(self, kind: RowsKind, *images: tuple[Any, ...]) -> None:
        if not self.runs or self.runs[-1][0] != kind:
            self.runs.append((kind, []))
        self.runs[-1][1].extend(images)

    def _image(self, row: Row, binlog: tuple[Any, ...]) -> tuple[Any, ...]:
        fitted = self.fit(row, dict(zip(self.names, binlog, strict=True)) if binlog else None)
        image = tuple(fitted.get(n) for n in self.names)
        if image != binlog:
            self.changed = True
        return image

    def put(self, view: TableView, held: Held, overlay: dict[bytes, Row | None],
            row: Row, image: tuple[Any, ...]) -> None:
        key = view.key_of(row)
        before = held(key)
        if before is None:
            self._add(RowsKind.INSERT, image)
        else:  # an insert of a key the stream holds: an update from the row it holds
            self.changed = True
            self._add(RowsKind.UPDATE, self._image(before, image), image)
        overlay[key] = row

    def remove(self, view: TableView, held: Held, overlay: dict[bytes, Row | None],
               row: Row, image: tuple[Any, ...]) -> None:
        key = view.key_of(row)
        before = held(key)
        if before is None:
            self.changed = True  # a delete of a row the stream never had: nothing to tell
        else:
            self._add(RowsKind.DELETE, self._image(before, image))
        overlay[key] = None

    def update(self, view: TableView, held: Held, overlay: dict[bytes, Row | None],
               old: Row, before: tuple[Any, ...], new: Row, after: tuple[Any, ...]) -> None:
        key = view.key_of(old)
        kept = held(key)
        if kept is None:
            self.changed = True
            self._add(RowsKind.INSERT, after)
        else:
            self._add(RowsKind.UPDATE, self._image(kept, before), after)
        overlay[key] = new
