"""The compiled row decoder (cdcserver/replication/_rowdecode.pyx) against the generated
Python decoder it stands in for (``rowcodec._compile``): random table layouts of every
binlog type the compiled one takes, random row images (valid values, zero and impossible
dates, invalid UTF-8, NULLs, truncated and overlong images, images inside a larger buffer),
and the same rows, value for value and type for type, or both failing with an error the
replicator turns into an undecodable event. A failure prints its seed."""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import struct
from decimal import Decimal
from typing import Any

import pytest

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.replication import rowcodec, values
from tests.helpers import binary_decimal

pytestmark = pytest.mark.skipif(rowcodec._rowdecode is None,
                                reason="_rowdecode.pyx is not built here")

DECODE_ERRORS = (ValueError, IndexError, struct.error, UnicodeDecodeError)
LABELS = ("a", "bé", "", "x" * 30)


def _string_meta(max_length: int) -> int:
    """A CHAR/BINARY column's table-map metadata for ``max_length`` bytes."""
    high = (((max_length >> 8) & 3) ^ 3) << 4
    return (((0xFE & ~0x30) | high) << 8) | (max_length & 0xFF)


def _column(rng: random.Random, index: int) -> ColumnDef:
    nullable = rng.random() < 0.6
    kind = rng.choice(["int", "float", "double", "year", "decimal", "varchar", "blob",
                       "geometry", "char", "binary", "inet6", "uuid", "inet4", "enum", "set",
                       "bit", "date", "datetime2", "timestamp2", "time2", "null"])
    name = f"c{index}"
    if kind == "int":
        t = rng.choice([T.TINY, T.SHORT, T.INT24, T.LONG, T.LONGLONG])
        return ColumnDef(name, t, 0, unsigned=rng.random() < 0.5, nullable=nullable)
    simple = {"float": T.FLOAT, "double": T.DOUBLE, "year": T.YEAR, "date": T.DATE,
              "null": T.NULL}
    if kind in simple:
        return ColumnDef(name, simple[kind], 0, nullable=nullable)
    if kind == "decimal":
        precision = rng.randint(1, 65)
        scale = rng.randint(0, min(precision, 30))
        return ColumnDef(name, T.NEWDECIMAL, precision << 8 | scale, nullable=nullable)
    charset = rng.choice(["utf-8", "utf-8", "latin-1", "cp1252", "utf-16-le", None])
    if kind == "varchar":
        return ColumnDef(name, rng.choice([T.VARCHAR, T.VAR_STRING]),
                         rng.choice([20, 255, 256, 4000]), nullable=nullable, charset=charset)
    if kind == "blob":
        return ColumnDef(name, T.BLOB, rng.randint(1, 4), nullable=nullable, charset=charset)
    if kind == "geometry":
        return ColumnDef(name, T.GEOMETRY, 4, nullable=nullable)
    if kind in ("char", "binary", "inet6", "uuid", "inet4"):
        length = {"inet6": 16, "uuid": 16, "inet4": 4}.get(kind, rng.choice([1, 10, 255, 300]))
        extended = kind if kind in ("inet6", "uuid", "inet4") else None
        return ColumnDef(name, T.STRING, _string_meta(length), nullable=nullable,
                         charset=charset if kind == "char" else None, extended=extended)
    if kind == "enum":
        return ColumnDef(name, T.ENUM, rng.choice([1, 2]), nullable=nullable,
                         enum_values=LABELS)
    if kind == "set":
        return ColumnDef(name, T.SET, rng.randint(1, 8), nullable=nullable, set_values=LABELS)
    if kind == "bit":
        return ColumnDef(name, T.BIT, rng.randint(0, 8) << 8 | rng.randint(0, 7) or 1,
                         nullable=nullable)
    fsp = rng.randint(0, 6)
    return ColumnDef(name, {"datetime2": T.DATETIME2, "timestamp2": T.TIMESTAMP2,
                            "time2": T.TIME2}[kind], fsp, nullable=nullable)


def _fixed_size(col: ColumnDef) -> int:
    t, meta = col.binlog_type, col.meta
    sizes = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8, T.FLOAT: 4,
             T.DOUBLE: 8, T.YEAR: 1, T.DATE: 3, T.NULL: 0}
    if t in sizes:
        return sizes[T(t)]
    if t == T.NEWDECIMAL:
        return values.DecimalFormat(meta >> 8, meta & 0xFF).size
    if t == T.ENUM:
        return 1 if meta == 1 else 2
    if t == T.SET:
        return meta
    if t == T.BIT:
        return (meta >> 8) + (1 if meta & 0xFF else 0)
    base = {T.DATETIME2: 5, T.TIMESTAMP2: 4, T.TIME2: 3}[T(t)]
    return base + values.frac_bytes(meta)


def _datetime2(rng: random.Random, fsp: int) -> bytes:
    year, month = rng.choice([rng.randint(1, 9999), 0, 2024]), rng.randint(0, 12)
    day, hour = rng.randint(0, 31), rng.randint(0, 23)
    packed = ((((year * 13 + month) << 5 | day) << 17) | hour << 12 |
              rng.randint(0, 59) << 6 | rng.randint(0, 59)) + 0x8000000000
    digits = values.frac_bytes(fsp)
    frac = rng.randint(0, 10 ** (2 * digits) - 1) if digits else 0
    return packed.to_bytes(5, "big") + frac.to_bytes(digits, "big")


def _value(rng: random.Random, col: ColumnDef) -> bytes:
    """One value's bytes: mostly what MariaDB writes, sometimes anything."""
    t, meta = col.binlog_type, col.meta
    if t in (T.VARCHAR, T.VAR_STRING, T.BLOB, T.GEOMETRY) or t == T.STRING:
        prefix = (1 if meta < 256 else 2) if t in (T.VARCHAR, T.VAR_STRING) else \
            meta if t in (T.BLOB, T.GEOMETRY) else \
            1 if (((meta >> 4) & 0x300) ^ 0x300) + (meta & 0xFF) < 256 else 2
        text = rng.choice(["", "plain", "é€🎉" * rng.randint(1, 5), "x" * rng.randint(0, 300)])
        data = rng.choice([text.encode("utf-8"), rng.randbytes(rng.randint(0, 40)),
                           text.encode("utf-16-le")])
        data = data[: (1 << (8 * prefix)) - 1]
        return len(data).to_bytes(prefix, "little") + data
    size = _fixed_size(col)
    if rng.random() < 0.3:
        return rng.randbytes(size)
    if t == T.NEWDECIMAL:
        fmt = values.DecimalFormat(meta >> 8, meta & 0xFF)
        top = 10 ** (meta >> 8) - 1
        return binary_decimal(fmt, rng.randint(-top, top))
    if t == T.DATE:
        return (rng.randint(0, 9999) << 9 | rng.randint(0, 12) << 5 |
                rng.randint(0, 31)).to_bytes(3, "little")
    if t == T.DATETIME2:
        return _datetime2(rng, meta)
    if t == T.TIMESTAMP2:
        digits = values.frac_bytes(meta)
        seconds = rng.choice([0, 1, rng.randint(0, 2**32 - 1), 1700000000])
        frac = rng.randint(0, 10 ** (2 * digits) - 1) if digits and rng.random() < 0.7 else 0
        return seconds.to_bytes(4, "big") + frac.to_bytes(digits, "big")
    if t == T.ENUM:
        return rng.randint(0, 6).to_bytes(size, "little")
    return rng.randbytes(size)


def _image(rng: random.Random, columns: tuple[ColumnDef, ...]) -> bytes:
    nulls = rng.getrandbits(len(columns)) if rng.random() < 0.5 else 0
    out = bytearray(nulls.to_bytes((len(columns) + 7) // 8, "little"))
    for i, col in enumerate(columns):
        if not (col.nullable and nulls >> i & 1):
            out += _value(rng, col)
    return bytes(out)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                     math.copysign(1, b))
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    if isinstance(a, dt.datetime):
        return a == b and a.tzinfo is b.tzinfo
    return bool(a == b)


def _outcome(decode: Any, buf: bytes, pos: int, end: int) -> Any:
    try:
        return decode(buf, pos, end)
    except DECODE_ERRORS as exc:
        return type(exc)  # the class is what the replicator reads: any of these


def _check(seed: int) -> None:
    rng = random.Random(seed)
    columns = tuple(_column(rng, i) for i in range(rng.randint(1, 20)))
    c_decode, python = rowcodec._c_decoder(columns), rowcodec._compile(columns)
    assert c_decode is not None, f"seed {seed}: a layout the compiled decoder should take"
    for _ in range(20):
        images = b"".join(_image(rng, columns) for _ in range(rng.randint(0, 5)))
        if rng.random() < 0.2:  # malformed: cut short, or with bytes after the last row
            images = images[: rng.randint(0, len(images))] if rng.random() < 0.5 else \
                images + rng.randbytes(rng.randint(1, 5))
        before, after = rng.randbytes(rng.randint(0, 9)), rng.randbytes(rng.randint(0, 9))
        buf = before + images + after
        args = (buf, len(before), len(before) + len(images))
        expected, got = _outcome(python, *args), _outcome(c_decode, *args)
        if isinstance(expected, list) and isinstance(got, list):
            assert len(got) == len(expected), f"seed {seed}"
            for row_c, row_py in zip(got, expected, strict=True):
                assert len(row_c) == len(row_py)
                for col, a, b in zip(columns, row_c, row_py, strict=True):
                    assert _same(a, b), f"seed {seed}: {col}: C {a!r}, Python {b!r}"
        else:  # both fail (with any of the errors an undecodable event is made of)
            assert not isinstance(expected, list) and not isinstance(got, list), \
                f"seed {seed}: Python {expected!r}, C {got!r}"


@pytest.mark.parametrize("block", range(8))
def test_random_layouts_and_images_decode_as_the_python_decoder_decodes_them(block: int) -> None:
    base = int(os.environ.get("ROWDECODE_SEED", "20261128"))
    for seed in range(base + block * 150, base + (block + 1) * 150):
        _check(seed)


def test_the_old_temporal_formats_stay_on_the_python_decoder() -> None:
    old = (ColumnDef("a", T.LONG), ColumnDef("d", T.DATETIME, 0))
    assert rowcodec._c_decoder(old) is None
    assert rowcodec.compile_rows_decoder(old) is rowcodec._compile(old)
    assert rowcodec.compile_rows_decoder(old[:1]) is rowcodec._c_decoder(old[:1])


def test_an_image_of_the_standard_workload_decodes_to_these_values() -> None:
    """A row as MariaDB logs it (id INT, name VARCHAR utf8, amount DECIMAL(12,2), created
    DATETIME(0), score DOUBLE, at TIMESTAMP(3)), decoded to known values, not only to the
    Python decoder's."""
    columns = (ColumnDef("id", T.LONG, nullable=False),
               ColumnDef("name", T.VARCHAR, 256, charset="utf-8"),
               ColumnDef("amount", T.NEWDECIMAL, 12 << 8 | 2),
               ColumnDef("created", T.DATETIME2, 0), ColumnDef("score", T.DOUBLE),
               ColumnDef("at", T.TIMESTAMP2, 3))
    created = (((2024 * 13 + 2) << 5 | 29) << 17 | 13 << 12 | 14 << 6 | 15) + 0x8000000000
    image = (b"\x00" + (-7).to_bytes(4, "little", signed=True) + b"\x05\x00caf\xc3\xa9" +
             binary_decimal(values.DecimalFormat(12, 2), -123456) +
             created.to_bytes(5, "big") + struct.pack("<d", 2.5) +
             (1700000000).to_bytes(4, "big") + (4560).to_bytes(2, "big"))  # fsp 3: 1/10,000 s
    nulls = b"\x3e"  # every nullable column NULL: only the id is read
    rows = rowcodec._c_decoder(columns)(image + nulls + (9).to_bytes(4, "little"), 0,
                                        len(image) + 5)
    assert rows == [(-7, "café", Decimal("-1234.56"), dt.datetime(2024, 2, 29, 13, 14, 15),
                     2.5, dt.datetime(2023, 11, 14, 22, 13, 20, 456000, tzinfo=dt.UTC)),
                    (9, None, None, None, None, None)]
