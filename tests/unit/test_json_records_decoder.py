"""The library's compiled JSON-mode decoder (``JsonRecordDecoder`` in
client/format/_records.pyx) against the Python path it replaces (``json.loads(line,
parse_float=Decimal)``, then ``from_json_value``): the same lines must give equal events,
every value of the same type, or the same error. The lines are the service's own rendering
(``compile_renderer``, the exact dialect) of a column of every stored type with edge values
and NULLs; then lines written by hand that the compiled decoder must leave to Python
(escapes, reordered or extra keys, a lone surrogate, -0, huge numbers, invalid UTF-8)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from cdcserver.protocol.render import compile_renderer
from mariadb_cdc_client import stream
from mariadb_cdc_client.stream import ChangeRecord, JsonStreamDecoder, SchemaChange
from tests.avro_samples import AVSC, sample_records
from tests.unit.test_records_decoder import _stream, _typed

compiled_module = stream._records
needs_compiled = pytest.mark.skipif(compiled_module is None,
                                    reason="client/format/_records.pyx is not built here")


def _json_stream(avsc: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    """The schema line, then each record as the service renders it in the exact dialect."""
    typed = list(fastavro.reader(io.BytesIO(_stream(avsc, records))))
    render = compile_renderer(json.dumps(avsc))
    return json.dumps(avsc).encode() + b"\n" + b"".join(render(r) for r in typed)


def _decode(data: bytes, *, compiled: bool, piece: int = 0, python_forbidden: bool = False
            ) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "_records", compiled_module if compiled else None)
        if python_forbidden:
            patch.setattr(stream._JsonRecords, "__call__", _python_fell_back)
        decoder = JsonStreamDecoder()
        try:
            if not piece:
                return list(decoder.feed(data))
            return [e for at in range(0, len(data), piece)
                    for e in decoder.feed(data[at:at + piece])]
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - both paths must raise the same
            return type(exc)


def _python_fell_back(*args: Any) -> Any:
    raise AssertionError("the compiled decoder left this line to the Python path")


def _assert_same(compiled: Any, python: Any) -> None:
    assert not isinstance(python, type), f"the Python path raised {python}"
    assert [_typed(e) for e in compiled] == [_typed(e) for e in python]


@needs_compiled
def test_every_stored_type_decodes_to_the_same_records() -> None:
    data = _json_stream(AVSC, sample_records())
    python = _decode(data, compiled=False)
    _assert_same(_decode(data, compiled=True, python_forbidden=True), python)
    assert len(python) == 401 and isinstance(python[0], SchemaChange)


@needs_compiled
def test_lines_split_anywhere_decode_the_same() -> None:
    data = _json_stream(AVSC, sample_records(40))
    _assert_same(_decode(data, compiled=True, piece=13), _decode(data, compiled=False))


def _lines() -> tuple[bytes, bytes]:
    """The schema line and a record line whose every column is NULL, to write values in."""
    schema, nulls, *_ = _json_stream(AVSC, sample_records(2)).split(b"\n")
    return schema, nulls


def _set(line: bytes, column: str, value: bytes) -> bytes:
    old = b'"' + column.encode() + b'": null'
    assert old in line
    return line.replace(old, b'"' + column.encode() + b'": ' + value, 1)


# (column, JSON value, whether the compiled decoder reads it itself)
HAND_WRITTEN = [
    ("vc", b'"a\\"b\\\\c\\/\\n\\t\\u00e9\\ud83c\\udf89"', True),
    ("vc", b'"\\ud800"', False),  # a lone surrogate: Python's str holds it
    ("vc", b'"\\u0000"', True),
    ("tx", "\u00e9\U0001f389 plain UTF-8".encode().join([b'"', b'"']), True),
    ("d2", b"-0", False),  # json reads the int 0: Decimal('0'), not Decimal('-0')
    ("d2", b"-0.00", True),
    ("d2", b"1e5", True),
    ("d65", b"-12345678901234567890123456789012345678901234.5", True),
    ("db", b"1e400", True),
    ("db", b"1" + b"0" * 400, False),  # float(int) refuses it
    ("f", b"1e39", False),  # beyond a 32-bit float: struct.pack refuses it
    ("f", b"3.4028235e+38", True),
    ("i", b"1.5", False),
    ("bi", b"123456789012345678901234567890", True),
    ("c", b"5", False),
    ("b1", b"true", True),
    ("dt", b'"2024-02-30"', True),  # not a date: the text, by the Python rule
    ("dt", b'"2024-02-29"', True),
    ("dtm", b'"2024-02-29 12:00:00.12"', True),
    ("dtm", b'"0000-00-00 00:00:00"', True),
    ("ts", b'"2024-02-29 12:00:00.123456+02:00"', True),
    ("ts", b'"2024-02-29 12:00:00.123+00:00"', True),
    ("tm", b'"-838:59:59.5"', True),
    ("u", b'"ffffffff-ffff-ffff-ffff-ffffffffffff"', True),
    ("bn", b'"00ff10"', True),
    ("bn", b'"0g"', False),
]


@needs_compiled
@pytest.mark.parametrize(("column", "value", "in_c"), HAND_WRITTEN)
def test_hand_written_values_read_as_python_reads_them(column: str, value: bytes,
                                                       in_c: bool) -> None:
    schema, nulls = _lines()
    data = schema + b"\n" + _set(nulls, column, value) + b"\n" + nulls + b"\n"
    compiled, python = _decode(data, compiled=True, python_forbidden=in_c), \
        _decode(data, compiled=False)
    if isinstance(python, type):
        assert compiled is python
    else:
        _assert_same(compiled, python)


@needs_compiled
@pytest.mark.parametrize("line", [
    b'{"server_id": 1, "domain": 0' + b"}",  # keys out of order
    b"{,",
    b"[]",
])
def test_lines_of_another_shape_are_left_to_python(line: bytes) -> None:
    schema, nulls = _lines()
    data = schema + b"\n" + line + b"\n" + nulls + b"\n"
    compiled, python = _decode(data, compiled=True), _decode(data, compiled=False)
    assert compiled is python if isinstance(python, type) else \
        [_typed(e) for e in compiled] == [_typed(e) for e in python]


@needs_compiled
def test_a_repair_key_and_free_spacing_read_as_python_reads_them() -> None:
    schema, nulls = _lines()
    for line in (nulls[:-1] + b', "cdc:repair": {"reason": "r", "cause": "0-1-2"}}',
                 nulls.replace(b", ", b" ,\t").replace(b": ", b":"),
                 _set(nulls, "vc", b'"x"').replace(b'"sequence": 10',
                                                   b'"sequence": 18446744073709551615')):
        data = schema + b"\n" + line + b"\n"
        _assert_same(_decode(data, compiled=True), _decode(data, compiled=False))


@needs_compiled
@pytest.mark.parametrize("broken", [b'"\xff"', b'"\x01"', b'"a', b"nul", b'"a"}}'])
def test_broken_lines_fail_the_same_way(broken: bytes) -> None:
    schema, nulls = _lines()
    data = schema + b"\n" + nulls + b"\n" + _set(nulls, "vc", broken) + b"\n"
    compiled, python = _decode(data, compiled=True), _decode(data, compiled=False)
    assert isinstance(python, type) and compiled is python


@needs_compiled
def test_an_error_line_ends_the_stream_after_the_records_before_it() -> None:
    schema, first = _lines()
    decoder = JsonStreamDecoder()
    got: list[Any] = []
    with pytest.raises(stream.ProtocolError):
        for event in decoder.feed(schema + b"\n" + first + b"\nERR NO-FILE gone\n"):
            got.append(event)
    assert isinstance(got[0], SchemaChange) and isinstance(got[1], ChangeRecord)


@needs_compiled
def test_random_damage_to_record_lines_reads_as_python_reads_it() -> None:
    """Lines of every type with bytes flipped, dropped, doubled or replaced by JSON's own
    punctuation: the compiled decoder gives Python's events or Python's error, whatever the
    damage (seeded; a failure names its seed)."""
    rng_seed = 20261128
    import random

    rng = random.Random(rng_seed)
    schema, *lines = _json_stream(AVSC, sample_records(60)).split(b"\n")
    lines = [line for line in lines if line]
    for attempt in range(400):
        line = bytearray(rng.choice(lines))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line))
            damage = rng.randrange(4)
            if damage == 0:
                line[at] ^= 1 << rng.randrange(8)
            elif damage == 1:
                del line[at]
            elif damage == 2:
                line[at:at] = line[at:at + rng.randint(1, 8)]
            else:
                line[at] = rng.choice(b'"\\{}[],:-.0123456789eEnulltrfase \t\x00\xff')
        data = schema + b"\n" + bytes(line).replace(b"\n", b" ") + b"\n"
        compiled, python = _decode(data, compiled=True), _decode(data, compiled=False)
        if isinstance(python, type):
            assert compiled is python, (rng_seed, attempt, bytes(line))
        else:
            assert not isinstance(compiled, type), (rng_seed, attempt, bytes(line))
            assert [_typed(e) for e in compiled] == [_typed(e) for e in python], \
                (rng_seed, attempt, bytes(line))
