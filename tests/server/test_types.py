"""Golden type coverage: every MariaDB 10.11 column type at its edges, through both formats.

One table holds each type; rows hold the minimum, the maximum, zero/special values and NULL.
The test checks (1) the JSON stream against ``tests/golden/types.jsonl`` (regenerate with
``UPDATE_GOLDEN=1`` and review the diff), (2) that the AVRO stream decodes to the same typed
values as the JSON stream, and (3) with ``cdcserver verify``'s comparison, that those values
equal the table's rows as MariaDB returns them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import uuid
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops.verify import verify_table
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client import stream as client_stream
from mariadb_cdc_client.format.schema import Kind, from_json_value
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, RawClient

pytestmark = pytest.mark.mariadb

GOLDEN = Path(__file__).parent.parent / "golden" / "types.jsonl"

COLUMNS = """
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d DECIMAL(65,30), d2 DECIMAL(10,2), d0 DECIMAL(5,0) UNSIGNED, f FLOAT, db DOUBLE,
  b1 BIT(1), b7 BIT(7), b64 BIT(64),
  c CHAR(10), vc VARCHAR(100), tx TEXT, ltx LONGTEXT, cl VARCHAR(20) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  e ENUM('a','b','c d'), st SET('x','y','z'),
  dt DATE, tm TIME, tm3 TIME(3), tm6 TIME(6), dtm DATETIME, dtm3 DATETIME(3),
  dtm6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL, yr YEAR,
  j JSON, g GEOMETRY, pt POINT, i4 INET4, i6 INET6, u UUID
"""

NINES = "9" * 35 + "." + "9" * 30

ROWS = [
    # minimums
    f"""(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
      -{NINES}, -99999999.99, 0, -3.4028234663852886e38, -1.7976931348623157e308,
      b'0', b'0000000', 0, '', '', '', '', '', 0x00000000, '', '',
      'a', '', '1000-01-01', '-838:59:59', '-838:59:59.999', '-838:59:59.999999',
      '1000-01-01 00:00:00', '1000-01-01 00:00:00.000', '1000-01-01 00:00:00.000000',
      '1970-01-01 00:00:01', '1970-01-01 00:00:01.000000', 1901,
      '[]', ST_GeomFromText('POINT(0 0)'), ST_GeomFromText('POINT(-180 -90)', 4326),
      '0.0.0.0', '::', '00000000-0000-0000-0000-000000000000')""",
    # maximums
    f"""(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,
      9223372036854775807, 18446744073709551615,
      {NINES}, 99999999.99, 99999, 3.4028234663852886e38, 1.7976931348623157e308,
      b'1', b'1111111', 18446744073709551615, 'ZZZZZZZZZZ', '{"🎉é" * 50}',
      'text with emoji 🎉 and ümlaut', '{"long text " * 500}', 'éàü€…‰Œ',
      0xFFFFFFFF, 0xFF00FE, UNHEX('{"80818283FEFF" * 50}'),
      'c d', 'x,y,z', '9999-12-31', '838:59:59', '838:59:59.999', '838:59:59.999999',
      '9999-12-31 23:59:59', '9999-12-31 23:59:59.999', '9999-12-31 23:59:59.999999',
      '2038-01-19 03:14:07', '2038-01-19 03:14:07.999999', 2155,
      '{{"a": [1, 2.5, "x", null, true], "b": {{"c": "é"}}}}',
      ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0.5)'), ST_GeomFromText('POINT(180 90)'),
      '255.255.255.255', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
      'ffffffff-ffff-ffff-ffff-ffffffffffff')""",
    # zeros and special values
    """(3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      -0.000000000000000000000000000001, 0.01, 0, 1.17549435e-38, 5e-324,
      b'0', b'1010101', 9223372036854775808, 'a  ', 'trailing  ', '', '', '',
      0x41, 0x00, '', '', 'x,z', '0000-00-00', '00:00:00', '-00:00:00.001',
      '100:00:00.5', '0000-00-00 00:00:00', '2020-00-00 00:00:00.000',
      '2024-02-29 12:34:56.123456', '0000-00-00 00:00:00', '2024-02-29 12:34:56.123456', 0,
      '"just a string"', ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))'),
      ST_GeomFromText('POINT(1.5 -2.25)'), '1.2.3.4', '::ffff:1.2.3.4',
      '123e4567-e89b-12d3-a456-426614174000')""",
    # NULL in every column
    "(4" + ", NULL" * 44 + ")",
    # more INET6 forms and a v1 UUID
    "(5" + ", NULL" * 41 + ", '10.0.0.1', '2001:db8:0:1:1:1:1:1', "
    "'e2af8e16-55b0-11ee-9ddd-0242ac120002')",
    "(6" + ", NULL" * 41 + ", '192.168.1.254', '::1.2.3.4', NULL)",
]


def _fill(source: Source) -> str:
    table = f"`{source.database}`.types"
    conn = source.server.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates and ENUM '' are allowed
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute(f"CREATE TABLE {table} ({COLUMNS}) DEFAULT CHARSET=utf8mb4")
        cur.execute(f"INSERT INTO {table} VALUES {', '.join(ROWS)}")
        cur.execute(f"UPDATE {table} SET vc = 'updated', e = 'b', tm3 = '-00:00:01.5' "
                    "WHERE id = 2")
        cur.execute(f"DELETE FROM {table} WHERE id = 4")
    conn.close()
    return f"{source.database}.types"


async def _json_lines(cdc: RunningService, name: str, count: int,
                      dialect: str | None = "EXACT") -> list[str]:
    """The lines exactly as sent (parsing them with json would round the decimals);
    ``dialect`` None: what a client that does not ask gets (MaxScale's clients)."""
    client = await RawClient.connect(cdc.port)
    await client.login("JSON", dialect=dialect)
    await client.send(f"REQUEST-DATA {name}".encode())
    lines = [(await client.line()).decode("utf-8").rstrip("\n") for _ in range(count)]
    await client.close()
    return lines


def _with_types(records: list[ChangeRecord]) -> list[dict[str, Any]]:
    """Each value with its type (and a Decimal's digits and exponent): 1 == 1.0 == True."""
    return [{k: (type(v), v, v.as_tuple() if isinstance(v, Decimal) else None)
             for k, v in r.values.items()} for r in records]


def _typed(port: int, name: str, fmt: str) -> list[ChangeRecord]:
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD, format=fmt) as client:
        return [e for e in client.stream(name, idle_timeout=1) if isinstance(e, ChangeRecord)]


async def test_every_type_round_trips_in_both_formats(cdc: RunningService, source: Source):
    name = _fill(source)
    await cdc.caught_up(source)
    records = 6 + 2 + 1  # six inserts, an update (before + after), a delete
    lines = await _json_lines(cdc, name, 1 + records)

    schema = json.loads(lines[0])
    types = {f["name"]: (f["type"], f["real_type"]) for f in schema["fields"][6:]}
    assert types["i6"][1] == "inet6" and types["u"][0][1]["logicalType"] == "uuid"
    assert types["j"][1] == "json" and types["biu"][0][1]["precision"] == 20

    # (1) the JSON rendering, against the reviewed golden file
    rendered = [re.sub(r'"timestamp": \d+', '"timestamp": 0', line) for line in lines[1:]]
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(rendered) + "\n", encoding="utf-8")
    assert rendered == GOLDEN.read_text(encoding="utf-8").splitlines()

    # (2) both formats decode to the same typed values
    from_json = await asyncio.to_thread(_typed, cdc.port, name, "JSON")
    from_avro = await asyncio.to_thread(_typed, cdc.port, name, "AVRO")
    assert [r.values for r in from_json] == [r.values for r in from_avro]
    assert len(from_json) == records
    # ... whether the library decodes in C or in Python (CDC_PURE_PYTHON): the same values,
    # each of the same type
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(client_stream, "_records", None)
        python_avro = await asyncio.to_thread(_typed, cdc.port, name, "AVRO")
        python_json = await asyncio.to_thread(_typed, cdc.port, name, "JSON")
    assert _with_types(python_avro) == _with_types(from_avro)
    assert _with_types(python_json) == _with_types(from_json)

    maximum, special = from_avro[1].values, from_avro[2].values
    assert maximum["biu"] == Decimal(18446744073709551615)
    assert maximum["d"] == Decimal(NINES) and maximum["d"].as_tuple().exponent == -30
    assert maximum["b64"] == Decimal(2**64 - 1) and maximum["b1"] is True
    assert maximum["tm6"] == dt.timedelta(hours=838, minutes=59, seconds=59,
                                          microseconds=999999)
    assert maximum["ts6"] == dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=dt.UTC)
    assert maximum["cl"] == "éàü€…‰Œ" and maximum["bl"] == bytes.fromhex("80818283FEFF" * 50)
    assert maximum["u"] == uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff")
    assert special["dt"] == "0000-00-00" and special["dtm3"] == "2020-00-00 00:00:00.000"
    assert special["ts"] == "0000-00-00 00:00:00"
    assert special["tm3"] == -dt.timedelta(milliseconds=1)
    assert special["tm6"] == dt.timedelta(hours=100, microseconds=500000)
    assert special["bn"] == b"A\0\0\0" and special["vb"] == b"\0" and special["c"] == "a"
    assert special["e"] == "" and special["st"] == "x,z" and special["yr"] == 0
    assert special["i6"] == "::ffff:1.2.3.4"
    assert from_avro[4].values["i6"] == "2001:db8::1:1:1:1:1"  # MariaDB's own text form
    assert from_avro[5].values["i6"] == "::1.2.3.4"

    # (3) the stream equals the table, value for value
    report = await asyncio.to_thread(
        verify_table, parse_source_url(source.url), cdc.service.config.store.data_dir,
        TableName(source.database, "types"))
    assert report.ok, "\n".join(report.lines())
    assert report.source_rows == report.stream_rows == 5


async def test_inet6_text_matches_mariadb(cdc: RunningService, source: Source):
    addresses = ["::", "::1", "::2", "::1.2.3.4", "::ffff:1.2.3.4", "2001:db8::", "1::",
                 "1:0:0:2:0:0:0:3", "1:0:2:0:3:0:4:0", "fe80::1:2:3:4", "0:0:1::"]
    table = f"`{source.database}`.ips"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, a INET6)",
                   *(f"INSERT INTO {table} VALUES ({i}, '{a}')" for i, a in enumerate(addresses)))
    await cdc.caught_up(source)
    theirs = [row[0] for row in source.query(f"SELECT CAST(a AS CHAR) FROM {table} ORDER BY id")]
    ours = [r.values["a"] for r in await asyncio.to_thread(_typed, cdc.port,
                                                           f"{source.database}.ips", "AVRO")]
    assert ours == theirs


GOLDEN_MAXSCALE = Path(__file__).parent.parent / "golden" / "types-maxscale.jsonl"
INT64 = range(-(1 << 63), 1 << 63)


def _jansson_loads(line: str) -> Any:
    """json.loads with the limits of jansson (MaxScale's C++ connector): an integer outside
    int64 is an error ("too big integer"); reals are doubles."""
    def integer(text: str) -> int:
        if int(text) not in INT64:
            raise ValueError(f"too big integer: {text}")
        return int(text)
    return json.loads(line, parse_int=integer)


def _gomaxscale_frames(stream: str) -> list[str]:
    """gomaxscale's framing (stream.go): objects are cut by counting every { and } byte,
    those inside strings included."""
    frames, depth, current = [], 0, []
    for ch in stream:
        if ch in "{}":
            depth += 1 if ch == "{" else -1
        if depth or current or ch == "}":
            current.append(ch)
        if ch == "}" and depth == 0:
            frames.append("".join(current))
            current = []
    return frames


def _gomaxscale_schema_ok(schema: dict[str, Any]) -> None:
    """gomaxscale's DDLEventField.UnmarshalJSON: a type is a string, a list of strings, or an
    enum object; anything else fails the whole batch."""
    for field in schema["fields"]:
        t = field["type"]
        if isinstance(t, list):
            assert all(isinstance(b, str) for b in t), field
            assert len(t) <= 2 and t[0] == "null", field  # MaxScale's ["null", T]
        elif isinstance(t, dict):
            assert t["type"] == "enum" and field["name"] == "event_type", field
        else:
            assert isinstance(t, str), field
        assert field.get("length", -1) == -1 and isinstance(field.get("real_type", ""), str)


def _from_maxscale(field: dict[str, Any], value: Any) -> Any:
    """A MaxScale-dialect value as the exact dialect's typed value, by protocol.md's table."""
    if value is None:
        return None
    real, primitive = field.get("real_type"), field["type"][1]
    if real == "decimal" or field.get("beyond_long"):
        return Decimal(str(value))
    if real == "year":
        return int(value)
    if real in ("datetime", "timestamp") and not value.startswith("0000") and \
            "-00" not in value[:10]:
        moment = dt.datetime.fromisoformat(value)
        return moment.replace(tzinfo=dt.UTC) if real == "timestamp" else moment
    if real == "time":
        return from_json_value(Kind.TIME, value)
    if real == "date" and "-00" not in value and not value.startswith("0000"):
        return dt.date.fromisoformat(value)
    if real == "uuid":
        return uuid.UUID(value)
    if primitive == "bytes":
        return bytes.fromhex(value)
    if primitive == "float":
        return from_json_value(Kind.FLOAT, value)
    if primitive == "double":
        return float(value)
    return value


def _zero_date_text(exact: Any, ours: Any, field: dict[str, Any]) -> bool:
    """Zero and partial dates travel as MariaDB's text in both dialects."""
    return isinstance(exact, str) and exact == ours and field.get("real_type") in (
        "date", "datetime", "timestamp")


async def test_every_type_reads_in_the_maxscale_dialect_as_maxscale_clients_parse(
        cdc: RunningService, source: Source):
    """What a client that cannot ask (cdc.py, gomaxscale, the C++ connector) gets by default:
    MaxScale's schema shape, values each client's parser takes, and the same values as the
    exact dialect (which test (3) above checks against the table)."""
    name = _fill(source)
    await cdc.caught_up(source)
    records = 6 + 2 + 1
    lines = await _json_lines(cdc, name, 1 + records, dialect=None)

    # The rendering, against the reviewed golden file.
    rendered = [re.sub(r'"timestamp": \d+', '"timestamp": 0', line) for line in lines]
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN_MAXSCALE.write_text("\n".join(rendered) + "\n", encoding="utf-8")
    assert rendered == GOLDEN_MAXSCALE.read_text(encoding="utf-8").splitlines()

    # gomaxscale: its regexes, its schema decoder, its brace-counting framer.
    assert lines[0].startswith('{"namespace":') and all(
        line.startswith('{"domain":') for line in lines[1:])
    schema = json.loads(lines[0])
    _gomaxscale_schema_ok(schema)
    assert list(schema)[:8] == ["namespace", "type", "name", "table", "database", "version",
                                "gtid", "fields"]
    assert _gomaxscale_frames("\n".join(lines)) == lines
    # The C++ connector: jansson's integer range, a schema it recognises, every key present.
    parsed = [_jansson_loads(line) for line in lines]
    assert parsed[0]["fields"][0]["name"] == "domain"
    fields = {f["name"]: f for f in schema["fields"]}
    assert all(set(fields) <= set(row) for row in parsed[1:])
    # cdc.py / Python: the same values as the exact dialect, nothing lost.
    exact = await asyncio.to_thread(_typed, cdc.port, name, "JSON")
    assert len(exact) == records
    for row, record in zip((json.loads(line, parse_float=Decimal) for line in lines[1:]),
                           exact, strict=True):
        for column, value in record.values.items():
            field = fields[column]
            ours = _from_maxscale(field, row[column])
            assert ours == value or _zero_date_text(value, ours, field), (column, value, ours)
    assert fields["biu"]["type"] == ["null", "long"] and fields["biu"]["beyond_long"] == "string"
    assert fields["d"]["type"] == ["null", "string"] and fields["d2"]["type"] == ["null", "double"]
    assert parsed[2]["biu"] == "18446744073709551615" and parsed[3]["biu"] == 0


def _micros_since_epoch(moment: dt.datetime) -> int:
    return (moment - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


async def test_the_stored_files_read_the_same_in_apache_avro(cdc: RunningService,
                                                             source: Source):
    """A second, independent Avro reader (Apache's ``avro`` package) reads the stored file:
    the same records as fastavro, logical types and unions included. (It does not know
    local-timestamp-micros and, as the Avro specification says, reads its long: the same
    microseconds.)"""
    import fastavro
    from avro.datafile import DataFileReader
    from avro.errors import IgnoredLogicalType
    from avro.io import DatumReader

    name = _fill(source)
    await cdc.caught_up(source)
    entry = cdc.service.data.catalog.get(TableName(*name.split(".")))
    assert entry is not None and list(entry.versions) == [1]
    path = entry.versions[1].path
    with open(path, "rb") as f, warnings.catch_warnings():
        # It warns that it reads local-timestamp-micros as its long (the spec's rule).
        warnings.simplefilter("ignore", IgnoredLogicalType)
        theirs = list(DataFileReader(f, DatumReader()))
    with open(path, "rb") as f:
        ours = list(fastavro.reader(f))
    assert len(ours) == 9
    checked = set()
    for apache, fast in zip(theirs, ours, strict=True):
        assert apache.keys() == fast.keys()
        for key, value in fast.items():
            other = apache[key]
            if isinstance(value, dt.datetime) and value.tzinfo is None:
                value = _micros_since_epoch(value)  # local-timestamp-micros: its long
            elif isinstance(value, uuid.UUID):
                other = uuid.UUID(other)
            assert other == value, (key, other, value)
            checked.add(type(value))
    # decimals, dates, times, instants, strings of zero dates, bytes, floats: all compared
    assert {Decimal, dt.date, dt.time, dt.datetime, str, bytes, float, int} <= checked


async def test_no_reply_holds_the_letters_err_where_maxscale_clients_look_for_them(
        cdc: RunningService, source: Source):
    """2.5's ``cdc.py`` and gomaxscale v1 take a first read holding ``err`` in any case for
    an error reply (and exit): a column named ``error_code``, a comment in the statement the
    schema's ``ddl`` carries (``'preferred number'``), values. The ``maxscale`` dialect
    writes those letters' ``e`` escaped, the same JSON; across the pieces of a big value
    too. The ``exact`` dialect writes them as they are."""
    from cdcserver.protocol.bigjson import PIECE

    t = f"`{source.database}`.contacts"
    big = "x" * (PIECE - 1) + "Err" + "x" * (PIECE - 4) + "eRR" + "y" * 10  # at the joins
    create = (f"CREATE TABLE {t} (id INT PRIMARY KEY, error_code VARCHAR(20) COMMENT "
              "'preferred number', note LONGTEXT)")
    values = {1: "server ERROR", 2: "Terrace", 3: "eRr{}", 4: None, 5: big}
    source.execute(create)
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            for i, value in values.items():
                code = value if value is None or len(value) < 20 else "e"
                cur.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (i, code, value))
    finally:
        conn.close()
    await cdc.caught_up(source)
    name = f"{source.database}.contacts"
    maxscale = await _json_lines(cdc, name, 1 + len(values), dialect=None)
    assert "err" not in "\n".join(maxscale).lower()
    schema = json.loads(maxscale[0])
    assert "'preferred number'" in schema["ddl"]["statement"]
    assert [f["name"] for f in schema["fields"]][-2:] == ["error_code", "note"]
    rows = [json.loads(line) for line in maxscale[1:]]
    assert {r["id"]: r["note"] for r in rows} == values
    exact = await _json_lines(cdc, name, 1 + len(values))
    assert '"error_code"' in exact[0] and "'preferred number'" in exact[0]
    exact_rows = [json.loads(line) for line in exact[1:]]
    assert exact_rows == [{**r, "timestamp": e["timestamp"]}
                          for r, e in zip(rows, exact_rows, strict=True)]
