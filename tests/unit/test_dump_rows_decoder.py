"""The compiled dump-line decoder (client/format/_dumprows.pyx) against the Python path it
replaces (``json.loads``, ``a2b_base64``, then ``value_decoder`` per column): the same line must
give equal ``DumpRows``, every value of the same type (a Decimal with the same digits and
exponent, a datetime with the same tzinfo, a float with the same bits), or the same error. The
table has a column of every kind a dump carries, with MariaDB's edge texts (zero dates,
ZEROFILL digits, BIGINT UNSIGNED's largest, TIME past 24 hours, fractions of every width) and
NULLs; then random rows; then the lines the compiled decoder must hand back to Python
(truncated, bad base64, a wrong width, invalid UTF-8, escaped or reordered JSON). Pure
functions over bytes: no service needed."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import struct
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mariadb_cdc_client.format import compiled as extensions
from mariadb_cdc_client.format import dump
from mariadb_cdc_client.format.dump import (
    DumpDecoder,
    DumpError,
    DumpHeader,
    DumpRows,
    encode_row,
    operation_line,
)
from mariadb_cdc_client.format.schema import METADATA_FIELDS, Field, Kind

# the module itself, whatever CDC_PURE_PYTHON says: these tests compare both paths
compiled_module: Any = extensions.compiled_module("mariadb_cdc_client.format._dumprows",
                                                  unless_pure_python=False)
needs_compiled = pytest.mark.skipif(compiled_module is None,
                                    reason="client/format/_dumprows.pyx is not built here")

COLUMNS = (
    Field("i", Kind.INT, "i"), Field("l", Kind.LONG, "l"),
    Field("d2", Kind.DECIMAL, "d2", precision=12, scale=2),
    Field("d0", Kind.DECIMAL, "d0", precision=20, scale=0),  # BIGINT UNSIGNED
    Field("d30", Kind.DECIMAL, "d30", precision=65, scale=30),
    Field("dbl", Kind.DOUBLE, "dbl"), Field("flt", Kind.FLOAT, "flt"),
    Field("b", Kind.BOOLEAN, "b"), Field("s", Kind.STRING, "s column"),
    Field("e", Kind.ENUM, "e"), Field("by", Kind.BYTES, "by"), Field("u", Kind.UUID, "u"),
    Field("dt", Kind.DATE, "dt"), Field("dtm0", Kind.DATETIME, "dtm0"),
    Field("dtm3", Kind.DATETIME, "dtm3", fsp=3), Field("dtm6", Kind.DATETIME, "dtm6", fsp=6),
    Field("ts", Kind.TIMESTAMP, "ts", fsp=6), Field("tm", Kind.TIME, "tm", fsp=6),
    Field("n", Kind.NULL, "n"),
)

# MariaDB's texts of each column, edges first (None: NULL). A row takes the k-th of each.
TEXTS: dict[str, list[bytes | None]] = {
    "i": [b"0", b"-1", b"2147483647", b"-2147483648", b"00042", None],
    "l": [b"9223372036854775807", b"-9223372036854775808", b"123456789012345678",
          b"-999999999999999999", b"18446744073709551615", b"1" * 700, None, b"7"],
    "d2": [b"0.00", b"-0.00", b"12.50", b"-12.50", b"9999999999.99", b"0.01", None],
    "d0": [b"18446744073709551615", b"0", b"-1", b"9223372036854775808", None],
    "d30": [b"12345678901234567890123456789012345.123456789012345678901234567890",
            b"-0.000000000000000000000000000001", b"99999999.999999999999999999999999999999",
            b"1.000000000000000000000000000000", None],
    "dbl": [b"0", b"-0", b"1.5", b"610.1491660638133", b"1e300", b"-1.7976931348623157e308",
            b"2.2250738585072014e-308", b"5e-324", b"1e-7", b"9007199254740993",
            b"123456789012345678901", b"171.69395753894355", None],
    "flt": [b"1.1", b"3.4028235e38", b"-3.4028235e38", b"1e-45", b"0.1", b"16777217", b"-0",
            None],
    "b": [b"0", b"1", b"-1", b"127", None],
    "s": [b"", b"ada", "żółć 日本 🎉".encode(), b"a\x00b", b'"quoted" \\ back/slash',
          b"lorem ipsum dolor sit amet " * 40, None],
    "e": [b"small", b"", "médium".encode(), None],
    "by": [b"", b"\x00", b"\x00\xff\x00", bytes(range(256)), b"\xff\xfe", b"a", b"ab", None],
    "u": [b"12345678-1234-5678-1234-567812345678", str(uuid.UUID(int=0)).encode(), None],
    "dt": [b"2024-02-29", b"0000-00-00", b"2020-00-00", b"2021-02-29", b"0001-01-01",
           b"9999-12-31", b"2020-01-00", None],
    "dtm0": [b"2024-01-02 03:04:05", b"0000-00-00 00:00:00", b"2020-00-00 00:00:00",
             b"9999-12-31 23:59:59", b"2024-01-02T03:04:05", b"2024-01-02 24:00:00", None],
    "dtm3": [b"2024-01-02 03:04:05.123", b"0000-00-00 00:00:00.000", b"2000-02-29 00:00:00.5",
             None],
    "dtm6": [b"2024-01-02 03:04:05.000001", b"2024-01-02 03:04:05.999999",
             b"2024-01-02 03:04:05.1234567", b"2024-01-02 03:04:05.", b"2024-01-02 03:04",
             b"1000-01-01 00:00:00.000000", None],
    "ts": [b"2024-01-02 03:04:05.123456", b"0000-00-00 00:00:00", b"1970-01-01 00:00:01",
           b"2024-01-02 03:04:05+02:00", None],
    "tm": [b"-838:59:59.000000", b"838:59:59", b"00:00:00.5", b"-00:00:01", b"25:00:00.123",
           None],
    "n": [None],
}
ROWS = max(len(texts) for texts in TEXTS.values())


def _header(columns: tuple[Field, ...] = COLUMNS) -> DumpHeader:
    metadata = tuple(Field(name, Kind.LONG, name) for name in METADATA_FIELDS)
    return DumpHeader("db", "t", {"fields": []}, "0-1-1", "mysql-bin.000001", 4, 0,
                      "sha256:", "2026-01-01T00:00:00Z", 1, fields=metadata + columns)


def _row(k: int, columns: tuple[Field, ...] = COLUMNS) -> list[str | None]:
    texts = [TEXTS[f.name][k % len(TEXTS[f.name])] for f in columns]
    return [None if t is None else base64.b64encode(t).decode() for t in texts]


def _line(action: str, rows: list[list[Any]], separators: tuple[str, str] = (",", ":")
          ) -> bytes:
    return json.dumps({"action": action, "rows": rows}, separators=separators,
                      ensure_ascii=False).encode()


def _typed(value: Any) -> Any:
    """A value with its type beside it, so that 1 == 1.0 == True, Decimal('1.0') ==
    Decimal('1.00'), naive == aware and 0.0 == -0.0 do not pass for equal."""
    if isinstance(value, float):
        return float, value.hex()
    if isinstance(value, Decimal):
        return Decimal, value.as_tuple()
    return type(value), value, getattr(value, "tzinfo", None)


def _outcome(header: DumpHeader, line: bytes, *, compiled: bool) -> Any:
    """What one path makes of a line: its action and typed rows, or the error's type."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dump, "_compiled", compiled_module if compiled else None)
        parser = dump._OperationParser(header)
        assert (parser.compiled is not None) == compiled
        try:
            rows = parser.parse(line)
        except Exception as exc:  # noqa: BLE001 - both paths must raise the same
            return type(exc)
    assert type(rows) is DumpRows
    return rows.action, [{k: _typed(v) for k, v in row.items()} for row in rows.rows]


def _in_c(header: DumpHeader, line: bytes) -> Any:
    """The compiled decoder's own answer (None: handed to Python)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dump, "_compiled", compiled_module)
        return dump._OperationParser(header).compiled.parse(line)


def _assert_same(header: DumpHeader, line: bytes, *, handed_back: bool | None = False) -> Any:
    """Both paths agree on ``line``; ``handed_back``: whether the compiled decoder must give
    it to Python (None: either)."""
    python = _outcome(header, line, compiled=False)
    assert _outcome(header, line, compiled=True) == python
    if handed_back is not None:
        assert (_in_c(header, line) is None) == handed_back, line[:200]
    return python


# -- every kind, every edge ---------------------------------------------------------------

@needs_compiled
@pytest.mark.parametrize("action", ["insert", "update", "delete"])
def test_every_kind_decodes_to_the_same_typed_rows(action: str) -> None:
    python = _assert_same(_header(), _line(action, [_row(k) for k in range(ROWS * 2)]))
    assert python[0] == action and len(python[1]) == ROWS * 2
    types = {value[0] for row in python[1] for value in row.values()}
    assert {int, float, bool, str, bytes, Decimal, uuid.UUID, dt.date, dt.datetime,
            dt.timedelta, type(None)} <= types
    assert list(python[1][0]) == [f.column for f in COLUMNS]


@needs_compiled
def test_edge_values_come_out_as_the_stream_types() -> None:
    rows = _in_c(_header(), _line("insert", [_row(k) for k in range(ROWS)])).rows
    first, second = rows[0], rows[1]
    assert first["i"] == 0 and rows[4]["i"] == 42 and rows[4]["l"] == 18446744073709551615
    assert rows[5]["l"] == int("1" * 700)
    assert first["d0"].as_tuple() == Decimal("18446744073709551615").as_tuple()
    assert second["d2"].as_tuple() == (1, (0,), -2)  # -0.00 keeps its sign and exponent
    assert rows[9]["dbl"] == 9007199254740992.0  # a tie, to even
    assert first["flt"] == struct.unpack("<f", struct.pack("<f", 1.1))[0]
    assert first["b"] is False and second["b"] is True and rows[2]["b"] is True
    assert second["dt"] == "0000-00-00" and rows[2]["dt"] == "2020-00-00"
    assert second["dtm0"] == "0000-00-00 00:00:00" and second["ts"] == "0000-00-00 00:00:00"
    assert first["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    assert first["dtm6"].tzinfo is None and rows[2]["dtm3"].microsecond == 500000
    assert first["tm"] == -dt.timedelta(hours=838, minutes=59, seconds=59)
    assert first["s column"] == "" and rows[2]["s column"] == "żółć 日本 🎉"
    assert rows[3]["by"] == bytes(range(256)) and first["n"] is None


@needs_compiled
@pytest.mark.parametrize("separators", [(", ", ": "), (" ,\t", " :\r ")])
def test_json_whitespace_is_read_as_json_reads_it(separators: tuple[str, str]) -> None:
    line = _line("insert", [_row(k) for k in range(5)], separators)
    _assert_same(_header(), b" \t" + line + b"\r ")


@needs_compiled
def test_no_rows_and_no_columns() -> None:
    _assert_same(_header(), b'{"action":"insert","rows":[]}')
    _assert_same(_header(()), b'{"action":"insert","rows":[[],[]]}')
    assert _in_c(_header(()), b'{"action":"delete","rows":[[]]}') == DumpRows("delete", [{}])


@needs_compiled
@pytest.mark.parametrize("action", ["upsert", "insért", ""])
def test_any_action_text_is_kept(action: str) -> None:
    assert _assert_same(_header(), _line(action, [_row(0)]))[0] == action


# -- what the compiled decoder hands back ---------------------------------------------------

def _spliced(value: str, column: int = 0, k: int = 0) -> bytes:
    """A line whose ``column`` holds the JSON text ``value`` as it stands."""
    row = _row(k)
    row[column] = "@@"
    return _line("insert", [_row(1), row]).replace(b'"@@"', value.encode())


def _with(name: str, raw: bytes) -> bytes:
    column = next(k for k, f in enumerate(COLUMNS) if f.name == name)
    return _spliced(json.dumps(base64.b64encode(raw).decode()), column)


WELL_FORMED = _line("insert", [_row(k) for k in range(3)])

HANDED_BACK = {
    "truncated": WELL_FORMED[:-1],
    "cut in a value": WELL_FORMED[:len(WELL_FORMED) // 2],
    "trailing data": WELL_FORMED + b"{}",
    "short padding": _spliced('"MQ="'),
    "padding only": _spliced('"M==="'),
    "data after padding": _spliced('"MQ==MQ=="'),
    "a space inside": _spliced('"M Q=="'),  # a2b_base64 skips it; C does not read it
    "not base64": _spliced('"!!!!"'),
    "a number": _spliced("5"),
    "true": _spliced("true"),
    "escaped": _spliced('"\\u004dQ=="'),
    "escaped slash": _spliced('"\\/w=="', column=10),
    "one value short": _line("insert", [_row(0)[:-1]]),
    "one value more": _line("insert", [[*_row(0), None]]),
    "a row not a list": b'{"action":"insert","rows":["MQ=="]}',
    "rows not a list": b'{"action":"insert","rows":{}}',
    "keys reordered": b'{"rows":[],"action":"insert"}',
    "an extra key": b'{"action":"insert","rows":[],"more":1}',
    "not an object": b"[]",
    "action not text": b'{"action":1,"rows":[]}',
    "escaped action": b'{"action":"ins\\u0065rt","rows":[]}',
    "invalid UTF-8 action": b'{"action":"\xff","rows":[]}',
    "a BOM": b"\xef\xbb\xbf" + WELL_FORMED,
    "a vertical tab": WELL_FORMED.replace(b",", b",\x0b", 1),
    "a form feed": b"\x0c" + WELL_FORMED,
    "empty": b"",
    "invalid UTF-8 text": _with("s", b"ok \xff"),
    "a surrogate in text": _with("s", b"\xed\xa0\x80"),
    "an overlong form": _with("e", b"\xc0\xaf"),
    "letters for an INT": _with("i", b"abc"),
    "empty INT": _with("l", b""),
    "a DECIMAL that is not one": _with("d2", b"1.2.3"),
    "non-ASCII DECIMAL": _with("d2", "\u0661".encode()),  # ARABIC-INDIC DIGIT ONE
    "a FLOAT past 32 bits": _with("flt", b"1e39"),
    "a DOUBLE that is not one": _with("dbl", b"1.5x"),
    "a bad UUID": _with("u", b"not-a-uuid"),
    "a bad TIME": _with("tm", b"12"),
    "non-ASCII DATE": _with("dt", "\uff12020-01-01".encode()),  # a FULLWIDTH 2
}

# Lines the compiled decoder reads itself, where the text is unusual for the column: it asks
# the column's Python decoder for that value, or reads it as the decoder would.
UNUSUAL = {
    "non-canonical padding bits": _spliced('"MR=="'),
    "INT with a plus and spaces": _with("i", b" +7 "),
    "INT with underscores": _with("l", b"1_000"),
    "DECIMAL in exponent form": _with("d2", b"1.5E+3"),
    "DECIMAL NaN": _with("d0", b"NaN"),
    "DECIMAL with a space": _with("d2", b" 1.50"),
    "DECIMAL starting with a point": _with("d2", b".5"),
    "DOUBLE inf": _with("dbl", b"inf"),
    "DOUBLE nan": _with("dbl", b"-nan"),
    "DOUBLE with underscores": _with("dbl", b"1_000.5"),
    "DOUBLE overflowing": _with("dbl", b"1e400"),
    "DOUBLE subnormal": _with("dbl", b"4.9e-324"),
    "DOUBLE of 25 digits": _with("dbl", b"1.000000178813934326171875"),
    "FLOAT subnormal": _with("flt", b"1e-40"),
    "FLOAT inf": _with("flt", b"inf"),
    "BOOLEAN empty": _with("b", b""),
    "DATE in basic form": _with("dt", b"20240102"),
    "DATE week form": _with("dt", b"2024-W01-1"),
    "DATETIME with a Z": _with("dtm6", b"2024-01-02 03:04:05Z"),
    "DATETIME without seconds": _with("dtm0", b"2024-01-02 03:04"),
    "DATETIME of a comma": _with("dtm3", b"2024-01-02 03:04:05,123"),
    "TIMESTAMP with an offset": _with("ts", b"2024-01-02 03:04:05-05:30"),
    "BYTES of any bytes": _with("by", bytes(range(255, -1, -1))),
}


@needs_compiled
@pytest.mark.parametrize("name", list(HANDED_BACK))
def test_lines_the_compiled_decoder_hands_back_give_what_python_gives(name: str) -> None:
    _assert_same(_header(), HANDED_BACK[name], handed_back=True)


@needs_compiled
@pytest.mark.parametrize("name", list(UNUSUAL))
def test_unusual_texts_are_read_as_the_column_decoder_reads_them(name: str) -> None:
    _assert_same(_header(), UNUSUAL[name], handed_back=None)


@needs_compiled
def test_a_python_decoders_error_is_raised_by_the_python_path() -> None:
    assert _assert_same(_header(), HANDED_BACK["a bad UUID"], handed_back=True) is ValueError
    assert _assert_same(_header(), HANDED_BACK["a FLOAT past 32 bits"],
                        handed_back=True) is OverflowError
    assert _assert_same(_header(), HANDED_BACK["invalid UTF-8 text"],
                        handed_back=True) is UnicodeDecodeError


# -- random rows ---------------------------------------------------------------------------

def _float32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


RANDOM_COLUMNS = COLUMNS[:-1]  # all but the column of NULL kind
values = {
    Kind.INT: st.integers(-2**31, 2**31 - 1), Kind.LONG: st.integers(-2**63, 2**64 - 1),
    Kind.DOUBLE: st.floats(allow_nan=False, allow_infinity=False),
    Kind.FLOAT: st.floats(width=32, allow_nan=False, allow_infinity=False).map(_float32),
    Kind.BOOLEAN: st.booleans(), Kind.STRING: st.text(), Kind.ENUM: st.text(max_size=8),
    Kind.BYTES: st.binary(), Kind.UUID: st.uuids(), Kind.DATE: st.dates(),
    Kind.TIME: st.timedeltas(min_value=-dt.timedelta(hours=838, minutes=59, seconds=59),
                             max_value=dt.timedelta(hours=838, minutes=59, seconds=59)),
}


def _value(f: Field) -> st.SearchStrategy[Any]:
    if f.kind == Kind.DECIMAL:
        digits = f.precision - f.scale
        return st.decimals(-(10**digits) + 1, 10**digits - 1, places=f.scale)
    if f.kind in (Kind.DATETIME, Kind.TIMESTAMP):
        times = st.datetimes().map(lambda v: v.replace(
            microsecond=v.microsecond // 10 ** (6 - f.fsp) * 10 ** (6 - f.fsp)))
        return times.map(lambda v: v.replace(tzinfo=dt.UTC)) if f.kind == Kind.TIMESTAMP \
            else times
    return values[f.kind]


rows = st.lists(st.fixed_dictionaries({f.column: st.none() | _value(f)
                                       for f in RANDOM_COLUMNS}), max_size=6)


@needs_compiled
@given(rows, st.sampled_from(["insert", "update", "delete"]))
# Timing heuristics of the generator, not of the decoders: under a loaded CI machine a row of
# many typed columns took 1.1 s to draw and the health check failed the test (every example
# is still checked).
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_random_rows_decode_the_same_on_both_paths(rows: list[dict[str, Any]],
                                                   action: str) -> None:
    header = _header(RANDOM_COLUMNS)
    line = operation_line(action, [encode_row(RANDOM_COLUMNS, row) for row in rows])
    assert _assert_same(header, line.rstrip(b"\n"))[1] == [
        {k: _typed(v) for k, v in row.items()} for row in rows]


@needs_compiled
@given(st.floats(allow_nan=False, allow_infinity=False) | st.floats(width=32))
@example(9007199254740993.0)
@example(2.2250738585072014e-308)
@example(-0.0)
def test_double_texts_read_to_the_same_bits(x: float) -> None:
    for text in {repr(x), f"{x:.17g}", f"{x:.6e}", f"{x:.3f}" if abs(x) < 1e30 else "1"}:
        for single in (False, True):
            made = compiled_module._float_of(text.encode(), single)
            if made is not None:
                expected = _float32(float(text)) if single else float(text)
                assert made.hex() == expected.hex(), text


@needs_compiled
@given(st.decimals(allow_nan=False, allow_infinity=False))
@example(Decimal("-0.00"))
@example(Decimal("12345678901234567890123456789012345678"))
def test_decimal_texts_make_the_same_decimals(value: Decimal) -> None:
    text = format(value, "f")
    made = compiled_module._decimal_of(text.encode())
    assert type(made) is Decimal and made.as_tuple() == Decimal(text).as_tuple()
    assert hash(made) == hash(Decimal(text)) and str(made) == str(Decimal(text))


@needs_compiled
def test_decimals_are_made_directly_here() -> None:
    assert compiled_module.decimals_made_directly(), "Decimal's layout was not verified"


# -- the decoder ----------------------------------------------------------------------------

def _dump(lines: list[bytes]) -> bytes:
    body = b"".join(line + b"\n" for line in lines)
    header = DumpHeader("db", "t", {"fields": [
        {"name": name, "type": "long"} for name in METADATA_FIELDS] + [
        {"name": "id", "type": ["null", "int"]},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 12, "scale": 2}]},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"},
                                "string"]}]},
        "0-1-9", "mysql-bin.000001", 4, 3, "sha256:" + hashlib.sha256(body).hexdigest(),
        "2026-01-01T00:00:00Z", 1)
    return json.dumps(header.to_json()).encode() + b"\n" + body


def _decoded(data: bytes, *, compiled: bool, piece: int) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dump, "_compiled", compiled_module if compiled else None)
        decoder = DumpDecoder()
        try:
            items = [item for at in range(0, len(data), piece)
                     for item in decoder.feed(data[at:at + piece])]
            return items, decoder.finish()
        except Exception as exc:  # noqa: BLE001 - both paths must raise the same
            return type(exc)


@needs_compiled
@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_a_whole_dump_decodes_the_same_fed_in_any_pieces(piece: int) -> None:
    values = [b"MQ==", b"MTIuNTA=", b"MjAyNC0wMS0wMiAwMzowNDowNQ=="]
    data = _dump([_line("insert", [[v.decode() for v in values]] * 2),
                  _line("update", [[values[0].decode(), None, None]] * 2), b"",
                  _line("delete", [[values[0].decode(), None, None]])])
    compiled = _decoded(data, compiled=True, piece=piece)
    assert compiled == _decoded(data, compiled=False, piece=piece)
    items, _ = compiled
    assert [item.action for item in items[1:]] == ["insert", "update", "delete"]
    assert items[1].rows[0] == {"id": 1, "price": Decimal("12.50"),
                                "at": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}
    assert _decoded(data[:-1], compiled=True, piece=piece) is DumpError
    assert _decoded(data.replace(b"MQ==", b"Mg=="), compiled=True, piece=piece) is DumpError


@needs_compiled
def test_a_value_the_line_cannot_hold_fails_the_same_in_the_decoder() -> None:
    data = _dump([_line("insert", [["YWJj", None, None]])])  # "abc" for an INT
    assert _decoded(data, compiled=True, piece=1 << 20) is ValueError
    assert _decoded(data, compiled=False, piece=1 << 20) is ValueError


@pytest.mark.parametrize(("environ", "said"), [({"CDC_PURE_PYTHON": "1"}, "Python"),
                                               ({}, "C" if compiled_module else "Python")])
def test_cdc_pure_python_keeps_dumps_on_the_python_path(environ: dict[str, str],
                                                        said: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CDC_PURE_PYTHON"} | environ
    out = subprocess.run([sys.executable, "-c", "from mariadb_cdc_client.format import dump; "
                          "print(dump.DECODING)"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == said


def test_the_checksum_taken_beside_the_decoding_keeps_the_pieces_in_order() -> None:
    """Pieces of 64 KiB and more are hashed by a worker thread; small ones after them must
    wait their turn there, not be hashed in line ahead of them."""
    import hashlib
    import random

    from mariadb_cdc_client.format.dump import _Digest

    rng = random.Random(11)
    pieces = [rng.randbytes(rng.choice([1, 100, 65_535, 65_536, 300_000])) for _ in range(60)]
    digest = _Digest()
    for piece in pieces:
        digest.update(bytearray(piece))  # a buffer the caller may reuse: copied when queued
    assert digest.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert _Digest().hexdigest() == hashlib.sha256().hexdigest()
