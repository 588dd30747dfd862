"""The Kafka formats' per-column writers (maxscale's JSON, dip's text forms), with their
fast paths for the common types, against the general functions they stand in for: every
value the row decoder makes for a column, and values of another type than the column's (a
zero date held as text), give the same text.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

from cdcserver.messages.base import text_form
from cdcserver.messages.formats import _json_text
from mariadb_cdc_client.format.dump import value_encoder
from mariadb_cdc_client.format.schema import Field, Kind, to_json_text

ZONE = dt.timezone(dt.timedelta(hours=-3, minutes=-30))


def _values(rng: random.Random, kind: Kind) -> list[Any]:
    moment = dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315537897600000000))
    return {
        Kind.DECIMAL: [Decimal(f"{rng.randint(-10**20, 10**20)}E-{rng.randint(0, 30)}"),
                       Decimal("-0.00"), Decimal("1E+3"), Decimal("0.0000001"), 12,
                       "0.5"],
        Kind.DATETIME: [moment, moment.replace(microsecond=0), "0000-00-00 00:00:00",
                        moment.replace(tzinfo=dt.UTC), moment.replace(tzinfo=ZONE)
                        if moment.year > 1 else moment],
        Kind.DOUBLE: [rng.uniform(-1e9, 1e9), float("inf"), -0.0, 3],
        Kind.INT: [rng.randint(-2**31, 2**31), True, "7"],
        Kind.STRING: ["é€🎉\n\"\\", "\ud800", ""],
    }[kind]


def test_maxscale_column_writers_write_what_to_json_text_writes() -> None:
    rng = random.Random(20261128)
    for kind in (Kind.DECIMAL, Kind.DATETIME, Kind.DOUBLE, Kind.INT, Kind.STRING):
        for fsp in ((0, 1, 3, 6) if kind == Kind.DATETIME else (0,)):
            write = _json_text(Field("c", kind, "c", fsp=fsp), ZONE)
            for _ in range(200):
                for value in _values(rng, kind):
                    assert write(value) == to_json_text(kind, value, fsp, ZONE), (kind, value)


def test_dip_text_forms_write_what_the_value_encoder_writes() -> None:
    rng = random.Random(7)
    for kind in (Kind.DECIMAL, Kind.DATETIME, Kind.DOUBLE, Kind.INT, Kind.STRING):
        for fsp in ((0, 1, 3, 6) if kind == Kind.DATETIME else (0,)):
            field = Field("c", kind, "c", fsp=fsp)
            write, encode = text_form(field), value_encoder(field)
            for _ in range(200):
                for value in _values(rng, kind):
                    try:
                        expected: Any = encode(value).decode("utf-8")
                    except UnicodeEncodeError as exc:
                        expected = type(exc)
                    try:
                        got: Any = write(value)
                    except UnicodeEncodeError as exc:
                        got = type(exc)
                    assert got == expected, (kind, value)


def test_a_float_prints_as_the_float32_it_is_whichever_double_it_came_from():
    """78375862.0 and 78375864.0 are one float32 (78375864): one text for both, the one a
    FLOAT column shows (before, each printed as its own eight digits)."""
    from mariadb_cdc_client.format.schema import float32_text

    assert float32_text(78375862.0) == float32_text(78375864.0) == "78375864"
    assert float32_text(0.1) == "0.1" and float32_text(35048288.0) == "3.504829e+07"
