"""The compiled binary-DECIMAL decoder (cdcserver/replication/_bindecimal.pyx) against
``values.DecimalFormat.decode``, which it stands in for in the row decoder: every precision
and scale MariaDB allows, random values with zeros, negative zeros, the largest of each
size, values of the wrong size and groups MariaDB never writes; the same Decimal (digits,
exponent, sign) or the same error."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from cdcserver.replication import values
from tests.helpers import binary_decimal

compiled = values._bindecimal
pytestmark = pytest.mark.skipif(compiled is None, reason="_bindecimal.pyx is not built here")


def _outcome(decode: object, raw: bytes) -> object:
    try:
        value = decode(raw)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - both must raise the same
        return type(exc)
    assert type(value) is Decimal
    return value.as_tuple(), str(value)


def test_every_precision_and_scale_decodes_as_the_python_path_does() -> None:
    rng = random.Random(20261128)
    assert compiled.made_directly()  # CPython 3.11+ on 64 bits: the layout is verified
    for precision in range(1, 66):
        top_scale = min(precision, 30)
        for scale in sorted({0, 1, precision // 2, top_scale, rng.randint(0, top_scale)}):
            if scale > precision:
                continue
            fmt = values.DecimalFormat(precision, scale)
            decoder = values.decimal_decoder(precision, scale)
            assert type(decoder) is compiled.BinaryDecimal
            top = 10 ** precision - 1
            for unscaled in (0, 1, -1, top, -top, *(rng.randint(-top, top) for _ in range(40))):
                raw = binary_decimal(fmt, unscaled)
                assert fmt.decode(raw).as_tuple() == Decimal(f"{unscaled}E-{scale}").as_tuple()
                assert _outcome(decoder, raw) == _outcome(fmt.decode, raw), (precision, scale,
                                                                             unscaled)
            raw = bytes(b ^ 0xFF for b in binary_decimal(fmt, 0))  # a negative zero
            assert _outcome(decoder, raw) == _outcome(fmt.decode, raw)


def test_bytes_mariadb_never_writes_read_as_python_reads_them() -> None:
    rng = random.Random(7)
    for precision, scale in ((10, 2), (12, 2), (38, 10), (20, 0), (5, 5)):
        fmt = values.DecimalFormat(precision, scale)
        decoder = values.decimal_decoder(precision, scale)
        for _ in range(300):
            raw = rng.randbytes(rng.choice([fmt.size, fmt.size, fmt.size - 1, fmt.size + 1]))
            assert _outcome(decoder, raw) == _outcome(fmt.decode, raw), (precision, scale, raw)
