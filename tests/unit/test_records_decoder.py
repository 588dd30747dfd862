"""The library's compiled record decoder (client/format/_records.pyx) against the Python path
it replaces (fastavro, then ``from_avro_value`` and ``unsigned_metadata``): the same AVRO
stream must give equal events, every value of the same type (a Decimal with the same digits
and exponent), or the same error. The table has a column of every type the store writes
(tests/avro_samples.py), edge values, NULLs and a few hundred random rows, in every block
codec; then the data the compiled decoder must hand back to Python (invalid UTF-8, dates
beyond year 9999, decimals longer than their precision, broken framing). Pure functions over
bytes: no service needed."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from cdcserver.core.changes import ColumnDef
from cdcserver.mariadb.constants import ColumnType as T
from mariadb_cdc_client import stream
from mariadb_cdc_client.format.avro import container_header
from mariadb_cdc_client.stream import AvroStreamDecoder, ChangeRecord, SchemaChange
from tests.avro_samples import (
    AVSC,
    CODECS,
    avsc_of,
    metadata,
    parsed_plain_schema,
    sample_records,
)
from tests.helpers import stored_blocks

compiled_module = stream._records
needs_compiled = pytest.mark.skipif(compiled_module is None,
                                    reason="client/format/_records.pyx is not built here")


def _stream(avsc: dict[str, Any], records: list[dict[str, Any]], codec: str = "null",
            sync_interval: int = 4000) -> bytes:
    """A version's AVRO stream as the service sends it: its container header, then blocks."""
    header, blocks = stored_blocks(parsed_plain_schema(avsc), records, codec, sync_interval)
    return container_header(json.dumps(avsc), codec, header.sync) + blocks.data


def _decode(data: bytes, *, compiled: bool, piece: int = 0, python_forbidden: bool = False
            ) -> Any:
    """The events one path makes of ``data`` (fed whole, or ``piece`` bytes at a time), or
    the error it raised."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "_records", compiled_module if compiled else None)
        if python_forbidden:
            patch.setattr(fastavro, "schemaless_reader", _python_fell_back)
        decoder = AvroStreamDecoder()
        try:
            return list(_fed(decoder, data, piece))
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - both paths must raise the same
            return type(exc)


def _fed(decoder: AvroStreamDecoder, data: bytes, piece: int) -> Iterator[Any]:
    if not piece:
        yield from decoder.feed(data)
        return
    for at in range(0, len(data), piece):
        yield from decoder.feed(data[at:at + piece])


def _python_fell_back(*args: Any) -> Any:
    raise AssertionError("the compiled decoder handed this block to the Python path")


def _typed(event: Any) -> Any:
    """An event with each value's type beside it (and a Decimal's digits and exponent), so
    that 1 == 1.0 == True and Decimal('1.0') == Decimal('1.00') do not pass for equal."""
    if isinstance(event, SchemaChange):
        return event
    assert isinstance(event, ChangeRecord)
    fields = {name: getattr(event, name) for name in event.__slots__}  # type: ignore[attr-defined]
    fields["values"] = {k: (type(v), v.as_tuple() if isinstance(v, Decimal) else v,
                            getattr(v, "tzinfo", None))
                        for k, v in event.values.items()}
    return {k: (type(v), v) if k != "values" else v for k, v in fields.items()}


def _assert_same(compiled: Any, python: Any) -> None:
    assert not isinstance(python, type), f"the Python path raised {python}"
    assert [_typed(e) for e in compiled] == [_typed(e) for e in python]


@needs_compiled
@pytest.mark.parametrize("codec", CODECS)
def test_every_stored_type_decodes_to_the_same_records(codec: str) -> None:
    data = _stream(AVSC, sample_records(), codec)
    python = _decode(data, compiled=False)
    _assert_same(_decode(data, compiled=True, python_forbidden=True), python)
    assert len(python) == 401 and isinstance(python[0], SchemaChange)
    kinds = {type(v) for e in python[1:] for v in e.values.values()}
    assert {int, float, bool, str, bytes, Decimal, dt.date, dt.datetime, dt.timedelta} <= kinds


@needs_compiled
def test_bytes_fed_a_few_at_a_time_and_blocks_of_one_record() -> None:
    data = _stream(AVSC, sample_records(60), sync_interval=1)
    _assert_same(_decode(data, compiled=True, piece=7, python_forbidden=True),
                 _decode(data, compiled=False))


@needs_compiled
def test_gtid_numbers_past_the_signed_range_come_back_unsigned() -> None:
    avsc = avsc_of([ColumnDef("id", T.LONG)])
    records = [{**metadata(0), "domain": -1, "server_id": -2, "sequence": -1, "id": 1},
               {**metadata(1), "domain": 2**31 - 1, "sequence": 2**63 - 1, "id": 2}]
    compiled = _decode(_stream(avsc, records), compiled=True, python_forbidden=True)
    _assert_same(compiled, _decode(_stream(avsc, records), compiled=False))
    assert (compiled[1].domain, compiled[1].server_id, compiled[1].sequence) == (
        2**32 - 1, 2**32 - 2, 2**64 - 1)


@needs_compiled
def test_temporal_edges_and_decimal_edges() -> None:
    avsc = avsc_of([ColumnDef("d", T.DATE), ColumnDef("dtm", T.DATETIME2, meta=6),
                    ColumnDef("ts", T.TIMESTAMP2, meta=6), ColumnDef("tm", T.TIME2, meta=6),
                    ColumnDef("dec", T.NEWDECIMAL, meta=(10 << 8) | 4),
                    ColumnDef("big", T.LONGLONG, unsigned=True)])
    day = 86_400_000_000
    rows = [  # (date days, datetime micros, timestamp micros, time micros, unscaled, big)
        (-719_162, -719_162 * day, 0, 0, 0, 0),  # 0001-01-01, epoch, midnight, 0.0000
        (2_932_896, 2_932_897 * day - 1, 2**31 * 10**6, day - 1, -1, 2**64 - 1),
        (-1, -1, -1, 1, 10**10 - 1, 2**63),  # the day before the epoch, a microsecond before
        (59, 59 * day + 1, 1_700_000_000_123_456, 12 * 3600 * 10**6, -(10**10 - 1), 1),
    ]
    records = [{**metadata(i), "d": d, "dtm": m, "ts": s, "tm": t,
                "dec": u.to_bytes(u.bit_length() // 8 + 1, "big", signed=True),
                "big": b.to_bytes(b.bit_length() // 8 + 1, "big", signed=True)}
               for i, (d, m, s, t, u, b) in enumerate(rows)]
    compiled = _decode(_stream(avsc, records), compiled=True, python_forbidden=True)
    _assert_same(compiled, _decode(_stream(avsc, records), compiled=False))
    assert compiled[1].values["d"] == dt.date(1, 1, 1)
    assert compiled[2].values["big"] == Decimal(2**64 - 1)
    assert str(compiled[2].values["dec"]) == "-0.0001"
    assert compiled[3].values["dtm"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999_999)
    assert compiled[4].values["ts"].tzinfo is dt.UTC


@needs_compiled
@pytest.mark.parametrize(("column", "value"), [
    ("vc", b"\xff\xfe"),          # invalid UTF-8: fastavro raises
    ("c", b"\xed\xa0\x80"),       # a surrogate's encoding
    ("dt", 2_932_897),            # the day after 9999-12-31: fastavro raises
    ("dtm", -719_163 * 86_400_000_000),  # before year 1
    ("tm", 86_400_000_000),       # 24:00:00 as time-micros: fastavro's time() refuses it
    ("d2", (10**11).to_bytes(6, "big", signed=True)),  # more digits than DECIMAL(10,2) has
])
def test_values_the_python_path_decides_are_left_to_it(column: str, value: Any) -> None:
    records = sample_records(30)
    records[5] = {**records[5], column: value}
    data = _stream(AVSC, records)
    compiled, python = _decode(data, compiled=True), _decode(data, compiled=False)
    if isinstance(python, type):
        assert compiled is python
    else:
        _assert_same(compiled, python)


@needs_compiled
def test_a_truncated_or_broken_block_fails_the_same_way() -> None:
    data = _stream(AVSC, sample_records(20))
    header_size = len(container_header(json.dumps(AVSC), "null", b"\0" * 16))
    for cut in (header_size + 5, len(data) - 30, len(data) - 1):
        assert _decode(data[:cut], compiled=True) == _decode(data[:cut], compiled=False)
    rng = random.Random(7)
    for _ in range(300):  # a flipped byte in a block's records
        broken = bytearray(data)
        broken[rng.randrange(header_size + 4, len(data) - 20)] ^= 0xFF
        compiled, python = _decode(bytes(broken), compiled=True), _decode(bytes(broken),
                                                                          compiled=False)
        if isinstance(python, type) or isinstance(compiled, type):
            assert isinstance(compiled, type) and isinstance(python, type)
        else:
            _assert_same(compiled, python)


@needs_compiled
def test_schemas_it_does_not_know_stay_on_the_python_path() -> None:
    odd = {**AVSC, "fields": [*AVSC["fields"][:6], {"name": "v", "type": ["int", "null"]}]}
    millis = {**AVSC, "fields": [*AVSC["fields"][:6], {"name": "v", "type": [
        "null", {"type": "long", "logicalType": "timestamp-millis"}]}]}
    for avsc in (odd, millis):
        assert stream.compiled_decoder(SchemaChange.from_schema(avsc)) is None
    assert stream.compiled_decoder(SchemaChange.from_schema(AVSC)) is not None


def test_the_records_are_slotted_frozen_dataclasses() -> None:
    """The compiled decoder fills ChangeRecord's slots; a record stays what users had."""
    import dataclasses

    record = ChangeRecord("db", "t", 1, 0, 1, 2, 1, 0, "insert", {"id": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.table = "u"  # type: ignore[misc]
    assert dataclasses.replace(record, table="u").table == "u"
    assert record.gtid == "0-1-2" and record.repair is None


@needs_compiled
def test_decimals_made_directly_are_the_decimals_of_their_digits() -> None:
    """Where _records.pyx verified CPython's Decimal layout at import, it makes Decimals
    without parsing text: each must be the real one (digits, exponent, sign, hash,
    arithmetic, pickling), from 1 to 45 digits and scales 0 to 30; where it did not, the
    text path gives the same."""
    import decimal
    import pickle

    assert isinstance(compiled_module.decimals_made_directly(), bool)
    context = decimal.Context(prec=65)
    rng = random.Random(20261128)
    for _ in range(20_000):
        digits = rng.randint(1, 45)
        unscaled = rng.randint(-(10 ** digits - 1), 10 ** digits - 1)
        scale = rng.randint(0, 30)
        made = compiled_module._decimal_of(unscaled, scale)
        real = Decimal(unscaled).scaleb(-scale, context)
        assert made.as_tuple() == real.as_tuple() and str(made) == str(real), (unscaled, scale)
        assert hash(made) == hash(real) and pickle.loads(pickle.dumps(made)) == real
        assert made + 1 == real + 1 and made * 3 == real * 3
