"""Stored Avro values of every type the store writes, for the tests that compare a compiled
decoder with the Python path it replaces (the Spark source's Arrow decoder, the library's
record decoder): the table's schema comes from the store's own type mapping, and its values
are raw (as Python writes them under the plain schema: strings and decimals as bytes,
temporals as numbers), so that edge values and invalid ones can be written too."""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Callable
from typing import Any

import fastavro

from cdcserver.core.changes import ColumnDef, TableLayout
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.store.schema import TableSchema

CODECS = ["null", "deflate", "snappy", "zstandard"]
EVENT_TYPES = ["insert", "update_before", "update_after", "delete"]
DAY_MICROS = 86_400_000_000
# DATE's days and DATETIME's microseconds from 1000-01-01 to 9999-12-31
DAYS = (-354_285, 2_932_896)
MICROS = (DAYS[0] * DAY_MICROS, (DAYS[1] + 1) * DAY_MICROS - 1)


def utf8(rng: random.Random) -> bytes:
    return rng.choice([b"", b"a", "ä€🎉".encode(), ("é" * 40).encode(),
                       bytes(rng.choice(range(32, 127)) for _ in range(rng.randint(1, 60)))])


def raw(rng: random.Random) -> bytes:
    return rng.choice([b"", b"\x00\xff", rng.randbytes(rng.randint(1, 40))])


def decimal(digits: int) -> Callable[[random.Random], bytes]:
    """Unscaled values of up to ``digits`` digits, as the store writes them: big-endian two's
    complement in the fewest bytes."""
    def value(rng: random.Random) -> bytes:
        unscaled = rng.choice([0, -1, 10 ** digits - 1, -(10 ** digits - 1),
                               rng.randint(-(10 ** digits - 1), 10 ** digits - 1)])
        return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)
    return value


def float32(rng: random.Random) -> float:
    value = rng.choice([0.0, -0.0, 1.5, -3.4028234663852886e38, 3.4028234663852886e38,
                        1.17549435e-38, rng.uniform(-1e6, 1e6)])
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def either(number: Callable[[random.Random], int], texts: list[bytes]
            ) -> Callable[[random.Random], int | bytes]:
    """A temporal column's values: mostly its logical type's, sometimes MariaDB's text."""
    return lambda rng: rng.choice(texts) if rng.random() < 0.2 else number(rng)


# (column, a random stored value): every binlog type the store maps, the Avro value raw (as
# Python writes it under the plain schema: strings and decimals as bytes, temporals as numbers)
COLUMNS: list[tuple[ColumnDef, Callable[[random.Random], Any]]] = [
    (ColumnDef("ti", T.TINY), lambda r: r.choice([-128, 127, r.randint(-128, 127)])),
    (ColumnDef("tiu", T.TINY, unsigned=True), lambda r: r.randint(0, 255)),
    (ColumnDef("si", T.SHORT), lambda r: r.randint(-32768, 32767)),
    (ColumnDef("mi", T.INT24), lambda r: r.randint(-8388608, 8388607)),
    (ColumnDef("i", T.LONG), lambda r: r.choice([-2**31, 2**31 - 1, r.randint(-9, 9)])),
    (ColumnDef("iu", T.LONG, unsigned=True), lambda r: r.choice([0, 2**32 - 1])),
    (ColumnDef("bi", T.LONGLONG), lambda r: r.choice([-2**63, 2**63 - 1, r.randint(-9, 9)])),
    (ColumnDef("biu", T.LONGLONG, unsigned=True), decimal(20)),
    (ColumnDef("f", T.FLOAT), float32),
    (ColumnDef("db", T.DOUBLE), lambda r: r.choice([5e-324, -1.7976931348623157e308,
                                                     r.uniform(-1e9, 1e9)])),
    (ColumnDef("d2", T.NEWDECIMAL, meta=(10 << 8) | 2), decimal(10)),
    (ColumnDef("d38", T.NEWDECIMAL, meta=(38 << 8) | 10), decimal(38)),
    (ColumnDef("d65", T.NEWDECIMAL, meta=(65 << 8) | 30), decimal(65)),  # Spark: string
    (ColumnDef("yr", T.YEAR), lambda r: r.choice([0, 1901, 2155])),
    (ColumnDef("b1", T.BIT, meta=1), lambda r: r.random() < 0.5),
    (ColumnDef("b7", T.BIT, meta=7), lambda r: r.randint(0, 127)),
    (ColumnDef("b64", T.BIT, meta=8 << 8), decimal(20)),
    (ColumnDef("dt", T.DATE), either(lambda r: r.randint(*DAYS),
                                      [b"0000-00-00", b"2020-00-00"])),
    (ColumnDef("tm", T.TIME2, meta=6), either(
        lambda r: r.randint(0, DAY_MICROS - 1),
        [b"-838:59:59", b"838:59:59.999999", b"-00:00:00.001", b"100:00:00.5", b"24:00:00"])),
    (ColumnDef("dtm", T.DATETIME2, meta=6), either(
        lambda r: r.randint(*MICROS), [b"0000-00-00 00:00:00", b"2020-00-00 00:00:00.000"])),
    (ColumnDef("ts", T.TIMESTAMP2, meta=3), either(
        lambda r: r.randint(0, 2**31 * 1_000_000), [b"0000-00-00 00:00:00"])),
    (ColumnDef("e", T.ENUM, charset="utf-8", enum_values=("a", "c d")), utf8),
    (ColumnDef("st", T.SET, charset="utf-8", set_values=("x", "y")), utf8),
    (ColumnDef("c", T.STRING, meta=40, charset="utf-8"), utf8),
    (ColumnDef("vc", T.VARCHAR, meta=400, charset="utf-8"), utf8),
    (ColumnDef("tx", T.BLOB, meta=2, charset="utf-8"), utf8),
    (ColumnDef("bn", T.STRING, meta=4), raw),
    (ColumnDef("vb", T.VARCHAR, meta=10), raw),
    (ColumnDef("bl", T.BLOB, meta=2), raw),
    (ColumnDef("g", T.GEOMETRY, meta=4), raw),
    (ColumnDef("j", T.JSON, meta=4, charset="utf-8", extended="json"), utf8),
    (ColumnDef("i4", T.STRING, meta=4, extended="inet4"), lambda r: b"10.0.0.1"),
    (ColumnDef("i6", T.STRING, meta=16, extended="inet6"), lambda r: b"::1"),
    (ColumnDef("u", T.STRING, meta=16, extended="uuid"),
     lambda r: str(uuid.UUID(int=r.getrandbits(128))).encode()),
    (ColumnDef("n", T.NULL), lambda r: None),
]


def avsc_of(columns: list[ColumnDef], version: int = 1) -> dict[str, Any]:
    layout = TableLayout("db", "t", tuple(columns), primary_key=(0,))
    return TableSchema.from_layout(layout, version, "0-1-1").avsc


AVSC = avsc_of([c for c, _ in COLUMNS])


def metadata(i: int, sequence: int | None = None) -> dict[str, Any]:
    return {"domain": 0, "server_id": 1 + i % 2, "sequence": 10 + i // 4 if sequence is None
            else sequence, "event_number": 1 + i % 4, "timestamp": 1_700_000_000 + i,
            "event_type": EVENT_TYPES[i % 4]}


def sample_records(count: int = 400, seed: int = 20261125) -> list[dict[str, Any]]:
    """Random records of every column: each value NULL one time in five, and a row of NULLs."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        values = {c.name: None if i == 0 or rng.random() < 0.2 else make(rng)
                  for c, make in COLUMNS}
        records.append({**metadata(i), **values})
    return records




def plain_schema(schema: Any) -> Any:
    """The schema the raw values are written under: logical types as their base types,
    strings as bytes (the same encoding), ints as longs (so that values beyond 32 bits can be
    written where the store never would)."""
    if schema in ("int", "string"):
        return {"int": "long", "string": "bytes"}[schema]
    if isinstance(schema, list):
        return [plain_schema(branch) for branch in schema]
    if isinstance(schema, dict) and schema.get("type") == "record":
        return {**schema, "fields": [{**f, "type": plain_schema(f["type"])}
                                     for f in schema["fields"]]}
    if isinstance(schema, dict) and schema.get("type") == "enum":
        return schema
    if isinstance(schema, dict):
        return plain_schema(schema["type"])
    return schema


def parsed_plain_schema(avsc: dict[str, Any]) -> Any:
    return fastavro.parse_schema(plain_schema(avsc))
