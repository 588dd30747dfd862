"""The C extensions against the Python paths they replace.

The transcoder (binlog row images straight to Avro): the same binlog is replicated twice by a
real service, once with the transcoder and once with ``CDC_PURE_PYTHON`` set, and the Avro
files must hold identical bytes. The JSON block renderer: every block of those files rendered
by it and record by record by ``compile_renderer`` must give identical lines. The table has every
column type the transcoder takes, filled with edge values (zero dates, the extremes, NULLs,
values the transcoder hands back to Python such as negative TIMEs) and a few thousand random
rows, in inserts, updates and deletes.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import random

import fastavro
import pytest

from cdcserver.protocol import render as render_module
from cdcserver.protocol.dialect import JsonStyle
from cdcserver.protocol.render import EXACT, compile_block_renderer, compile_renderer
from cdcserver.store import transcoder
from cdcserver.store import versions as versions_module
from mariadb_cdc_client.format.avro import block_at, decompress, parse_header
from mariadb_cdc_client.format.compiled import PURE_PYTHON_ENV
from mariadb_cdc_client.format.wire import Dialect
from tests.conftest import Source, make_config, start_service

pytestmark = pytest.mark.mariadb

COLUMNS = [
    ("ti", "TINYINT"), ("tiu", "TINYINT UNSIGNED"), ("si", "SMALLINT"),
    ("siu", "SMALLINT UNSIGNED"), ("mi", "MEDIUMINT"), ("miu", "MEDIUMINT UNSIGNED"),
    ("i", "INT"), ("iu", "INT UNSIGNED"), ("bi", "BIGINT"), ("biu", "BIGINT UNSIGNED"),
    ("d18", "DECIMAL(18,0)"), ("d189", "DECIMAL(18,9)"), ("d12", "DECIMAL(12,2)"),
    ("d5u", "DECIMAL(5,0) UNSIGNED"), ("d11", "DECIMAL(1,1)"), ("d171", "DECIMAL(17,1)"),
    ("f", "FLOAT"), ("db", "DOUBLE"), ("yr", "YEAR"),
    ("b1", "BIT(1)"), ("b7", "BIT(7)"), ("b13", "BIT(13)"), ("b64", "BIT(64)"),
    ("c", "CHAR(10)"), ("vc", "VARCHAR(100)"), ("vcl", "VARCHAR(300)"), ("tx", "TEXT"),
    ("ltx", "LONGTEXT"), ("cl", "VARCHAR(20) CHARACTER SET latin1"),
    ("ca", "CHAR(5) CHARACTER SET ascii"), ("bn", "BINARY(4)"), ("vb", "VARBINARY(10)"),
    ("bl", "BLOB"), ("e", "ENUM('a','b','c d','é')"), ("j", "JSON"), ("g", "GEOMETRY"),
    ("dt", "DATE"), ("tm", "TIME"), ("tm3", "TIME(3)"), ("tm6", "TIME(6)"),
    ("dtm", "DATETIME"), ("dtm1", "DATETIME(1)"), ("dtm3", "DATETIME(3)"),
    ("dtm6", "DATETIME(6)"), ("ts", "TIMESTAMP NULL"), ("ts2", "TIMESTAMP(2) NULL"),
    ("ts6", "TIMESTAMP(6) NULL"),
]

EDGE_ROWS = [
    # minimums
    (-128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
     "-999999999999999999", "-999999999.999999999", "-9999999999.99", "0", "-0.9",
     "-9999999999999999.9", -3.4028234663852886e38, -1.7976931348623157e308, 1901,
     0, 0, 0, 0, "", "", "", "", "", "", "", b"\0\0\0\0", b"", b"", "a", "[]",
     "POINT(0 0)", "1000-01-01", "-838:59:59", "-838:59:59.999", "-838:59:59.999999",
     "1000-01-01 00:00:00", "1000-01-01 00:00:00.0", "1000-01-01 00:00:00.000",
     "1000-01-01 00:00:00.000000", "1970-01-01 00:00:01", "1970-01-01 00:00:01.00",
     "1970-01-01 00:00:01.000000"),
    # maximums
    (127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,
     9223372036854775807, 18446744073709551615, "999999999999999999",
     "999999999.999999999", "9999999999.99", "99999", "0.9", "9999999999999999.9",
     3.4028234663852886e38, 1.7976931348623157e308, 2155, 1, 127, 8191, 2**64 - 1,
     "ZZZZZZZZZZ", "🎉é" * 50, "x" * 300, "text 🎉 ümlaut", "long text " * 500, "éàü€…‰Œ",
     "abcde", b"\xff" * 4, b"\xff" * 10, bytes(range(256)) * 4, "é", '{"a": [1, 2.5]}',
     "LINESTRING(0 0, 1 1, 2 0.5)", "9999-12-31", "838:59:59", "838:59:59.999",
     "838:59:59.999999", "9999-12-31 23:59:59", "9999-12-31 23:59:59.9",
     "9999-12-31 23:59:59.999", "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07",
     "2038-01-19 03:14:07.99", "2038-01-19 03:14:07.999999"),
    # zeros and values only MariaDB can hold
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "0", "-0.000000001", "0.01", "0", "0.0", "-0.1", 0.0, -0.0,
     0, 0, 85, 4096, 2**63, "a  ", "trailing  ", "", "", "", "", "a", b"A", b"\0", b"", "",
     '"s"', "POINT(1.5 -2.25)", "0000-00-00", "00:00:00", "-00:00:00.001", "100:00:00.5",
     "0000-00-00 00:00:00", "2020-00-00 00:00:00.0", "2024-02-29 12:34:56.123",
     "2024-02-30 00:00:00.000001", "0000-00-00 00:00:00", "0000-00-00 00:00:00.00",
     "2024-02-29 12:34:56.123456"),
    tuple([None] * len(COLUMNS)),
]


def _random_row(rnd: random.Random) -> tuple[object, ...]:
    def text(n: int) -> str:
        return "".join(rnd.choice("aé€🎉 z'\\\"\n\t") for _ in range(rnd.randint(0, n)))

    def maybe(value: object) -> object:
        return None if rnd.random() < 0.05 else value

    def day() -> dt.date:
        return dt.date(1000, 1, 1) + dt.timedelta(days=rnd.randint(0, 3_280_000))

    def moment(fsp: int) -> str:
        micros = rnd.randint(0, 999_999) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        return f"{day()} {rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:" \
               f"{rnd.randint(0, 59):02d}.{micros:06d}"

    def duration(fsp: int) -> str:
        sign = "-" if rnd.random() < 0.001 else ""  # a negative TIME takes the Python path
        micros = rnd.randint(0, 999_999) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        return f"{sign}{rnd.randint(0, 23)}:{rnd.randint(0, 59):02d}:" \
               f"{rnd.randint(0, 59):02d}.{micros:06d}"

    def decimal(digits: int, scale: int) -> str:
        unscaled = rnd.randint(-(10**digits) + 1, 10**digits - 1)
        text = f"{abs(unscaled):0{digits}d}"
        number = text[: digits - scale] + ("." + text[digits - scale:] if scale else "")
        return ("-" if unscaled < 0 else "") + number

    values = [
        rnd.randint(-128, 127), rnd.randint(0, 255), rnd.randint(-32768, 32767),
        rnd.randint(0, 65535), rnd.randint(-(2**23), 2**23 - 1), rnd.randint(0, 2**24 - 1),
        rnd.randint(-(2**31), 2**31 - 1), rnd.randint(0, 2**32 - 1),
        rnd.randint(-(2**63), 2**63 - 1), rnd.randint(0, 2**64 - 1),
        decimal(18, 0), decimal(18, 9), decimal(12, 2), str(rnd.randint(0, 99999)),
        decimal(1, 1), decimal(17, 1), rnd.uniform(-1e30, 1e30), rnd.uniform(-1e300, 1e300),
        rnd.choice([0, *range(1901, 2156)]), rnd.randint(0, 1), rnd.randint(0, 127),
        rnd.randint(0, 8191), rnd.randint(0, 2**64 - 1), text(10)[:10], text(100),
        text(300), text(2000), text(5000), "".join(rnd.choice("aéü€Œ") for _ in range(8)),
        "".join(rnd.choice("ab~ ") for _ in range(5)).rstrip(),
        rnd.randbytes(rnd.randint(0, 4)), rnd.randbytes(rnd.randint(0, 10)),
        rnd.randbytes(rnd.randint(0, 3000)), rnd.choice(["a", "b", "c d", "é", ""]),
        json.dumps({"k": rnd.randint(0, 10**6), "s": "é🎉" * rnd.randint(0, 5)}),
        f"POINT({rnd.uniform(-180, 180)} {rnd.uniform(-90, 90)})", str(day()),
        duration(0), duration(3), duration(6), moment(0), moment(1), moment(3), moment(6),
        f"{1970 + rnd.randint(1, 67)}-0{rnd.randint(1, 9)}-1{rnd.randint(0, 9)} 12:00:00",
        f"2001-02-03 04:05:06.{rnd.randint(0, 99):02d}",
        f"2030-12-31 23:59:59.{rnd.randint(0, 999_999):06d}",
    ]
    return tuple(maybe(v) for v in values)


def _fill(source: Source) -> None:
    names = ", ".join(name for name, _ in COLUMNS)
    placeholders = ", ".join("ST_GeomFromText(%s)" if name == "g" else "%s"
                             for name, _ in COLUMNS)
    table = f"`{source.database}`.t"
    rnd = random.Random(20261121)
    conn = source.server.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates and ENUM '' are allowed
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY AUTO_INCREMENT, "
                    + ", ".join(f"{n} {t}" for n, t in COLUMNS) + ") DEFAULT CHARSET=utf8mb4")
        insert = f"INSERT INTO {table} ({names}) VALUES ({placeholders})"
        cur.executemany(insert, EDGE_ROWS)
        for _ in range(10):
            cur.executemany(insert, [_random_row(rnd) for _ in range(200)])
            conn.commit()
        cur.execute(f"UPDATE {table} SET vc = CONCAT(vc, 'u'), d12 = -d12, dtm6 = NOW(6), "
                    "tm3 = '-00:00:01.5' WHERE id % 7 = 0")
        cur.execute(f"UPDATE {table} SET tm = '12:00:00', ts6 = '2000-01-01' WHERE id % 5 = 0")
        cur.execute(f"DELETE FROM {table} WHERE id % 11 = 0")
    conn.commit()
    conn.close()


def _blocks(data_dir: str, name: str) -> tuple[str, list[tuple[int, bytes]]]:
    """The schema and the blocks (record count, decompressed records) of the table's first
    version, as the store wrote them."""
    path = os.path.join(data_dir, "avro", f"{name}.000001.avro")
    with open(path, "rb") as f:
        data = f.read()
    header = parse_header(data)
    blocks, pos = [], header.size
    while (block := block_at(data, pos, header.sync)) is not None:
        count, start, pos = block
        blocks.append((count, decompress(header.codec, data[start : pos - len(header.sync)])))
    return header.schema_json, blocks


def _records(data_dir: str, name: str) -> bytes:
    return b"".join(records for _, records in _blocks(data_dir, name)[1])


async def _replicate(path: str, source: Source, users: str) -> bytes:
    cdc = await start_service(make_config(path, source.url, users))
    try:
        await cdc.caught_up(source)
    finally:
        await cdc.stop()
    return _records(path, f"{source.database}.t")


async def test_transcoded_avro_equals_the_python_path(source: Source, users_file: str,
                                                      tmp_path, monkeypatch):
    assert transcoder.available(), "the C extension was not built (is a C compiler missing?)"
    _fill(source)
    transcoded = 0
    real_records = versions_module.records

    def counting(*args):  # a spy: counts the events the transcoder took, changes nothing
        nonlocal transcoded
        transcoded += 1
        return real_records(*args)

    monkeypatch.setattr(versions_module, "records", counting)
    fast = await _replicate(str(tmp_path / "fast"), source, users_file)
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    slow = await _replicate(str(tmp_path / "slow"), source, users_file)

    assert transcoded > 20  # most events took the compiled path...
    assert len(fast) > 2_000_000 and fast == slow  # ...and wrote the very same bytes


async def test_json_block_renderer_writes_the_python_renderers_lines(
        source: Source, users_file: str, tmp_path):
    _fill(source)
    path = str(tmp_path / "data")
    await _replicate(path, source, users_file)
    schema_json, blocks = _blocks(path, f"{source.database}.t")
    reader = fastavro.parse_schema(json.loads(schema_json))
    for style in (EXACT, JsonStyle(Dialect.MAXSCALE)):
        renderer = compile_block_renderer(schema_json, style)
        assert renderer is not None
        render = compile_renderer(schema_json, style)
        rendered = 0
        for count, data in blocks:
            lines = renderer.render(data, count)
            stream = io.BytesIO(data)
            expected = b"".join(render(fastavro.schemaless_reader(stream, reader, None))
                                for _ in range(count))
            if lines is not None:  # None: a value it leaves to Python (a float32 NaN, say)
                assert lines == expected
                rendered += count
        assert rendered > 0.9 * sum(count for count, _ in blocks)
    # and a zone other than UTC for TIMESTAMPs is left to the Python renderer
    for dialect in Dialect:
        zone = dt.timezone(dt.timedelta(hours=2))
        assert compile_block_renderer(schema_json, JsonStyle(dialect, zone)) is None


async def test_the_c_metadata_walker_cuts_records_where_fastavro_does(
        source: Source, users_file: str, tmp_path):
    """What a bounded AVRO read filters its edge blocks with: each record's metadata and its
    stored bytes, the columns skipped in C, against fastavro reading the same blocks."""
    _fill(source)
    path = str(tmp_path / "data")
    await _replicate(path, source, users_file)
    schema_json, blocks = _blocks(path, f"{source.database}.t")
    reader = fastavro.parse_schema(json.loads(schema_json))
    renderer = compile_block_renderer(schema_json)
    assert renderer is not None
    symbols = render_module._event_types(schema_json)
    assert symbols is not None
    for count, data in blocks:
        slices = renderer.slices(data, count, render_module._METADATA, symbols)
        assert slices is not None  # every column type the store writes is skipped in C
        stream, start = io.BytesIO(data), 0
        for metadata, end in slices:
            record = fastavro.schemaless_reader(stream, reader, None)
            assert metadata == {k: record[k] for k in render_module._METADATA}
            assert (start, end) == (start, stream.tell())
            start = end
        assert start == len(data)
        # a cut block, or one record too many, is left to the Python path (which reports it)
        assert renderer.slices(data[:-1], count, render_module._METADATA, symbols) is None
        assert renderer.slices(data, count + 1, render_module._METADATA, symbols) is None
    assert len(blocks) > 20
