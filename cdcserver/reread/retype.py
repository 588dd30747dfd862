"""Rows an ALTER retypes, taken out of the stream in their old types before the new version.

A repair's records are written in the table's version at the watermark, in the columns' new
types. A value the new type renders otherwise (``12.345`` in ``DECIMAL(10,1)``, a ``DATE`` in
a ``DATETIME``, a ``DATETIME(3)`` in a ``DATETIME``, a ``DOUBLE`` in a ``FLOAT``) cannot be the
``update_before`` of the row a consumer holds: there it is ``12.345``. So the rows holding
such values are deleted in the old version, in the statement's transaction before its new
version (their images are exactly the rows held), and the repair at the watermark inserts
them as the table has them then. Rows whose every retyped value renders alike (text in a
narrower ``VARCHAR``, an integer in a smaller integer type, a decimal that fits the new
scale) stay, and the repair's ``update_before`` of them is the row held.

A table the pipeline repairs itself (less than ``MIN_BYTES`` stored) is read for those rows
there and then. A big table's statement waits for its repair beside the stream instead
(:class:`cdcserver.reread.beside.HeldStatement`): the repair's process finds the rows, and
they go out first, deleted in the old version, then the statement, then the repair.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from cdcserver.core.changes import TableChange, TableLayout
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.schema import Field, Kind, float32_text

Alike = Callable[[Any], bool]  # whether a value of the old column renders alike in the new
RETYPED_OUT = "the rows it retypes go out again in the new types"  # the deletes' note
_INTEGERS = frozenset({Kind.INT, Kind.LONG})
_TEXT = frozenset({Kind.STRING, Kind.ENUM})


def retyped(change: TableChange, previous: TableLayout) -> dict[str, Alike]:
    """The columns (by their old names) whose type the ALTER changed, each with the test of
    a value that renders alike in the new type."""
    assert change.layout is not None
    renamed = dict(change.renamed_columns)
    old = {f.column: f for f in _fields(previous)}
    new = {f.column: f for f in _fields(change.layout)}
    found: dict[str, Alike] = {}
    for name, before in old.items():
        after = new.get(renamed.get(name, name))
        if after is None or _same_type(before, after):
            continue
        found[name] = _alike(before, after)
    return found


def renders_otherwise(row: dict[str, Any], columns: dict[str, Alike]) -> bool:
    """Whether a row holds a value a retyped column renders otherwise."""
    return any(row.get(name) is not None and not alike(row[name])
               for name, alike in columns.items())


def may_render_otherwise(columns: dict[str, Alike]) -> bool:
    """Whether a retyped column may render some value otherwise (text in a narrower
    ``VARCHAR`` and an integer in another integer type never do)."""
    return any(alike is not _always for alike in columns.values())


def _fields(layout: TableLayout) -> list[Field]:
    return list(TableSchema.from_layout(layout, 0, "").columns)


def _same_type(a: Field, b: Field) -> bool:
    return (a.kind, a.real_type, a.fsp, a.precision, a.scale) == \
        (b.kind, b.real_type, b.fsp, b.precision, b.scale)


def _alike(before: Field, after: Field) -> Alike:
    if (before.kind in _INTEGERS and after.kind in _INTEGERS) or \
            (before.kind in _TEXT and after.kind in _TEXT):
        return _always
    if before.kind == after.kind == Kind.DECIMAL:
        return _fits_decimal(after.precision, after.scale)
    if {before.kind, after.kind} == {Kind.FLOAT, Kind.DOUBLE}:
        return _prints_alike
    return _never


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _fits_decimal(precision: int, scale: int) -> Alike:
    quantum = Decimal(1).scaleb(-scale)

    def fits(value: Any) -> bool:
        try:
            exact = Decimal(value)
            if exact != exact.quantize(quantum):
                return False
        except (InvalidOperation, TypeError, ValueError):
            return False
        digits = exact.adjusted() + 1 + scale
        return digits <= precision

    return fits


def _prints_alike(value: Any) -> bool:
    """A value FLOAT and DOUBLE print alike, narrowed or widened: FLOAT's text (that of the
    float32 nearest the value, as the stream prints it) reads back as the double itself.
    ``0.5``, ``1.25`` and ``18.5714`` do; ``0.10000000149011612`` (FLOAT's 0.1 as a double)
    does not, nor ``35048288`` (a float32 exactly, printed ``3.504829e+07``), nor
    ``78375862`` (held as the float32 78375864, printed ``78375864``)."""
    try:
        number = float(value)
        return float(float32_text(number)) == number
    except (OverflowError, TypeError, ValueError, struct.error):
        return False
