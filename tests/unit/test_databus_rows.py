"""The compiled writer of databus rows (cdcserver/messages/_databus.pyx) against the Python
path it replaces: the same rows must give the same bytes, for every kind of column
``Databus.value_encoders`` handles (ints at their limits, text with multi-byte and empty
values, binary data of every length modulo three, datetimes of each precision, values of
another type than their column's, an ENUM written as its index) and NULLs."""

from __future__ import annotations

import binascii
import datetime as dt
import random
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from cdcserver.messages import databus
from mariadb_cdc_client.format.dump import value_encoder
from mariadb_cdc_client.format.schema import Field, Kind

compiled = databus._databus
pytestmark = pytest.mark.skipif(compiled is None, reason="_databus.pyx is not built here")

FIELDS = [Field("i", Kind.INT, "i"), Field("l", Kind.LONG, "l"), Field("s", Kind.STRING, "s"),
          Field("b", Kind.BYTES, "b"), Field("d0", Kind.DATETIME, "d0", fsp=0),
          Field("d3", Kind.DATETIME, "d3", fsp=3), Field("d6", Kind.DATETIME, "d6", fsp=6),
          Field("d2", Kind.DATETIME, "d2", fsp=2), Field("dec", Kind.DECIMAL, "dec"),
          Field("f", Kind.DOUBLE, "f"), Field("e", Kind.ENUM, "e", real_type="enum")]
OPS = (*[databus._C_DATETIME.get(f.fsp, 0) if f.kind == Kind.DATETIME
          else databus._C_OPS.get(f.kind, 0) for f in FIELDS[:-1]], 0)
ENUM_INDEX = {"a": 1, "b": 2}
ENCODERS = (*[value_encoder(f) for f in FIELDS[:-1]],
            lambda v: b"%d" % ENUM_INDEX.get(v, 0))


def _python(rows: list[tuple[Any, ...]]) -> bytes:
    b64 = binascii.b2a_base64
    return b",".join([b"[" + b",".join([
        b"null" if v is None else b'"' + b64(enc(v), newline=False) + b'"'
        for enc, v in zip(ENCODERS, row, strict=True)]) + b"]" for row in rows])


def _row(rng: random.Random) -> tuple[Any, ...]:
    def some(make: Any) -> Any:
        return None if rng.random() < 0.15 else make()
    moment = dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315537897600000000))
    return (some(lambda: rng.choice([0, -1, 2**31 - 1, -2**31, rng.randint(-999, 999)])),
            some(lambda: rng.choice([2**63 - 1, -2**63, 2**64, -2**70, True, "7"])),
            some(lambda: rng.choice(["", "a", "é€🎉", "x" * rng.randint(1, 90), 5])),
            some(lambda: rng.randbytes(rng.randint(0, 7))),
            some(lambda: moment), some(lambda: moment), some(lambda: moment),
            some(lambda: rng.choice([moment, "0000-00-00 00:00:00",
                                     moment.replace(tzinfo=dt.UTC)])),
            some(lambda: _decimal(rng)),
            some(lambda: rng.choice([0.1, -1e300, 5e-324, -0.0, 0.0, 1e16, 123.0, 1e22,
                                     float("inf"), float("-inf"), float("nan"),
                                     rng.uniform(-1e6, 1e6), 7])),
            some(lambda: rng.choice(["a", "b", ""])))


class _Money(Decimal):
    """A subclass of Decimal: not read in place (its encoder writes it)."""


def _decimal(rng: random.Random) -> Any:
    """Decimals as the row decoder makes them (up to 38 digits, scale 0 to 38), and what it
    never makes (more digits, a positive exponent, NaN, a subclass), each as Python writes it."""
    digits, scale = rng.randint(1, 40), rng.randint(0, 40)
    unscaled = rng.randint(-10**digits + 1, 10**digits - 1)
    return rng.choice([Decimal(f"{unscaled}E-{scale}"), Decimal(f"{unscaled}E-{scale}"),
                       Decimal(f"{unscaled}E-{scale}"), Decimal(rng.randint(-999, 999)),
                       Decimal(f"-0E-{scale}"), Decimal("0.00"), Decimal("0.001"),
                       Decimal(f"{unscaled}E+{rng.randint(1, 5)}"), Decimal("NaN"),
                       Decimal("-Infinity"), Decimal("sNaN"), _Money("12.50"),
                       Decimal("9" * 38) / 10**rng.randint(0, 38),
                       Decimal("-" + "9" * 38), Decimal("1" + "0" * 38)])


@pytest.mark.parametrize("simd", [True, False])
def test_rows_are_written_byte_for_byte_as_the_python_path_writes_them(simd: bool) -> None:
    rng = random.Random(20261128)
    rows = [_row(rng) for _ in range(3000)] + [(None,) * len(FIELDS)]
    was = compiled.simd()
    compiled.simd(simd)
    try:
        assert compiled.rows_json(rows, OPS, ENCODERS) == _python(rows)
        assert compiled.rows_json([], OPS, ENCODERS) == b""
    finally:
        compiled.simd(was)


def test_a_datetime_with_a_zone_and_a_row_of_another_width_go_to_python() -> None:
    aware = dt.datetime(2024, 2, 29, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    row = (1, 2, "s", b"", aware, aware, aware, None, None, None, "a")
    assert compiled.rows_json([row], OPS, ENCODERS) == _python([row])
    assert compiled.rows_json([(1, 2)], OPS, ENCODERS) is None


def test_text_that_has_no_utf8_fails_as_in_python() -> None:
    row = (None, None, "\ud800", None, None, None, None, None, None, None, None)
    with pytest.raises(UnicodeEncodeError):
        _python([row])
    with pytest.raises(UnicodeEncodeError):
        compiled.rows_json([row], OPS, ENCODERS)


def test_floats_and_decimals_of_the_row_decoder_are_written_in_c() -> None:
    """The compiled writer writes these itself: their Python encoders are never called."""
    def refuse(value: Any) -> bytes:
        raise AssertionError(f"{value!r} went to its Python encoder")
    encoders = (*ENCODERS[:8], refuse, refuse, ENCODERS[10])
    rows = [(None,) * 8 + (Decimal(text), number, None)
            for text, number in (("-0.00", -0.0), ("123.45", 1e16), ("0.000001", 5e-324),
                                 ("9" * 38, float("nan")), ("-1E-38", 0.1))]
    assert compiled.rows_json(rows, OPS, encoders) == _python(rows)


def test_a_table_of_4096_columns_is_written_by_the_python_path() -> None:
    """MariaDB allows 4,096 columns; the compiled writer takes 512 and leaves wider rows to
    the Python path, which writes them (it raised, stopping the sink, before)."""
    encoders = tuple(value_encoder(Field(f"c{i}", Kind.INT, f"c{i}")) for i in range(4096))
    ops = (databus._C_OPS[Kind.INT],) * 4096
    rows = [tuple(range(4096)), (None,) * 4096]
    assert compiled.rows_json(rows, ops, encoders) is None
    # the shape's derived state, as Databus keeps it in the shape's cache
    shape: Any = SimpleNamespace(cache={"databus.encoders": list(encoders),
                                        "databus.ops": ops})
    written = databus.Databus().rows_json(shape, rows)
    assert written == b",".join([b"[" + b",".join([
        b"null" if v is None else b'"' + binascii.b2a_base64(b"%d" % v, newline=False) + b'"'
        for v in row]) + b"]" for row in rows])
