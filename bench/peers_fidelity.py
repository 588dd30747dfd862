"""Fidelity, this service beside Debezium (issue 53): every MariaDB type at its limits, each
value each tool publishes compared with the source's, by ``bench_peers.py --fidelity``.

Two tables (``TABLES``), after ``RESET MASTER``: ``fidelity.edge``, a column per type and
edge (``EDGE``: DECIMAL(65,30), every integer type's bounds signed and unsigned, FLOAT/DOUBLE
extremes, zero and invalid dates, a NOT NULL one too, DATETIME(6)/TIMESTAMP(6) limits, TIME
beyond 24 h, YEAR, BIT, ENUM/SET, JSON, geometries, 4-byte UTF-8, latin1, binary strings with
0x00 and 0xFF, CHAR padding, NULLs, a column named with a space and one with a backtick), and
``fidelity_mariadb.types``, MariaDB's INET6 and UUID (``MARIADB_TYPES``, a database of their
own: Debezium's MySQL connector cannot parse their CREATE TABLE). In each, rows inserted
(``ROWS``), some updated to other rows' values, one deleted. The source is read with pymysql
after each phase (``SELECT``, the session in UTC), to be what each message's images must
hold.

Then each tool reads that binlog from its start, as in the throughput part
(peers_tools.service_running: the ``debezium`` format with Connect schemas on keys and
values; debezium_running: Debezium's MySQL connector under Connect's ``JsonConverter``), and
every message of its tables' topics is read back and decoded with :func:`decode` **by the
Connect schema the message carries**, as Debezium documents its MySQL connector's types
(``org.apache.kafka.connect.data.Decimal``: base64 of the unscaled big-endian two's
complement, scale in its parameters; ``io.debezium.time.Date``: days; ``Timestamp``:
milliseconds, ``MicroTimestamp``: microseconds, both local date-time; ``ZonedTimestamp``: an
ISO 8601 string; ``MicroTime``: microseconds; ``io.debezium.data.Bits``: little-endian
bytes; ``Geometry``/``Point``: WKB and SRID...), never by which tool sent it. An insert's
``after``, an update's ``before`` and ``after`` and a delete's ``before`` are compared with
the source, value by value, both made the same canonical text (:func:`canonical`). Prints
a table: each column (its type) by tool, ``same`` or what differs (``zero date → null``),
and, where the two tools' Connect schemas for a column differ, both.

Differences of this service that its documentation states (docs/kafka.md,
cdcserver/sinks/kafka/README.md: Debezium's own representation, kept) are marked ``(doc)``;
:func:`undocumented` gives the others (the smoke test asserts there are none).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import decimal
import json
import os
import struct
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.common import OUT, fresh_server, line
from bench.peers_tools import (
    DEBEZIUM,
    SERVICE,
    Producer,
    Running,
    Stopped,
    debezium_running,
    kafka_broker,
    service_running,
    watch,
)
from cdcserver.app.embedded import EmbeddedMariaDB
from tests.kafka_connect import ConnectFailed

ID = ("id", "INT NOT NULL PRIMARY KEY")
# (column, its SQL type): the types Debezium's MySQL connector and this service both know
EDGE: tuple[tuple[str, str], ...] = (
    ID,
    ("dec65", "DECIMAL(65,30)"),
    ("dec_u", "DECIMAL(10,2) UNSIGNED"),
    ("ubig", "BIGINT UNSIGNED"),
    ("sbig", "BIGINT"),
    ("ti", "TINYINT"), ("uti", "TINYINT UNSIGNED"),
    ("si", "SMALLINT"), ("usi", "SMALLINT UNSIGNED"),
    ("mi", "MEDIUMINT"), ("umi", "MEDIUMINT UNSIGNED"),
    ("i", "INT"), ("ui", "INT UNSIGNED"),
    ("fl", "FLOAT"), ("db", "DOUBLE"),
    ("d", "DATE"), ("dnn", "DATE NOT NULL"),
    ("dt0", "DATETIME"), ("dt3", "DATETIME(3)"), ("dt6", "DATETIME(6)"),
    ("ts0", "TIMESTAMP NULL"), ("ts6", "TIMESTAMP(6) NULL"),
    ("tm0", "TIME"), ("tm6", "TIME(6)"),
    ("yr", "YEAR"),
    ("b1", "BIT(1)"), ("b5", "BIT(5)"), ("b64", "BIT(64)"),
    ("en", "ENUM('a','b','ü c')"), ("st", "SET('x','y','z')"),
    ("js", "JSON"),
    ("geo", "GEOMETRY"), ("pt", "POINT"), ("poly", "POLYGON"),
    ("emoji", "VARCHAR(20) CHARACTER SET utf8mb4"),
    ("l1", "VARCHAR(20) CHARACTER SET latin1"),
    ("u8bin", "VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"),
    ("vbin", "VARCHAR(16) CHARACTER SET binary"),
    ("vb", "VARBINARY(16)"), ("bn", "BINARY(4)"), ("bl", "BLOB"),
    ("ch", "CHAR(10)"),
    ("txt", "TEXT"),
    ("my col", "INT"), ("a`b", "VARCHAR(8)"),
)
# MariaDB's own types, in a database of their own: Debezium's MySQL connector cannot parse
# their CREATE TABLE, and stops at it unless told to skip what it cannot parse (then this
# table's rows are unknown to it, and skipped with inconsistent.schema.handling.mode=warn).
MARIADB_TYPES: tuple[tuple[str, str], ...] = (ID, ("ip", "INET6"), ("uu", "UUID"))
# (database, table, columns); written to the binlog in this order
TABLES = (("fidelity_mariadb", "types", MARIADB_TYPES), ("fidelity", "edge", EDGE))
COLUMNS = (*EDGE, *MARIADB_TYPES[1:])  # every column once, the table's rows in this order
NAMES = tuple(c for c, _ in COLUMNS)
DEBEZIUM_OPTIONS = {"schema.history.internal.skip.unparseable.ddl": "true",
                    "inconsistent.schema.handling.mode": "warn"}


def _s(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Each row: column -> SQL literal (the columns not given are NULL). Rows 1-3 edges, 4 all
# NULL, 5 ordinary (deleted).
ROWS: dict[int, dict[str, str]] = {
    1: {"dec65": "99999999999999999999999999999999999.999999999999999999999999999999",
        "dec_u": "99999999.99",
        "ubig": "18446744073709551615", "sbig": "9223372036854775807",
        "ti": "127", "uti": "255", "si": "32767", "usi": "65535", "mi": "8388607",
        "umi": "16777215", "i": "2147483647", "ui": "4294967295",
        "fl": "3.402823466e38", "db": "1.7976931348623157e308",
        "d": "'9999-12-31'", "dnn": "'9999-12-31'",
        "dt0": "'9999-12-31 23:59:59'", "dt3": "'9999-12-31 23:59:59.999'",
        "dt6": "'9999-12-31 23:59:59.999999'", "ts0": "'2038-01-19 03:14:07'",
        "ts6": "'2038-01-19 03:14:07.999999'", "tm0": "'838:59:59'",
        "tm6": "'838:59:59.000000'", "yr": "2155", "b1": "b'1'", "b5": "b'11111'",
        "b64": "x'FFFFFFFFFFFFFFFF'", "en": "'ü c'", "st": "'x,y,z'",
        "js": _s('{"a": {"b": [1, 2.5, {"c": null}]}, "big": 123456789012345678901234567890, '
                 '"u": "hé ☃ 😀", "esc": "\\u00e9\\n", "t": true}'),
        "ip": "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
        "uu": "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        "geo": "ST_GeomFromText('LINESTRING(0 0, 1.5 2.25, -180 90)', 4326)",
        "pt": "ST_GeomFromText('POINT(1.5 -2.25)')",
        "poly": "ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0),"
                "(2 2, 3 2, 3 3, 2 2))')",
        "emoji": "'😀 𝄞 🇫🇷'", "l1": "'àéîõü ÿ ß'", "u8bin": "'Ünïcödé 😀'",
        "vbin": "x'00FF00FF'", "vb": "x'FF0000FF'", "bn": "x'01'", "bl": "x'00FF'",
        "ch": "'ab  '", "txt": "'line1\\nline2\\ttab \\\\ back'", "my col": "1", "a`b": "'tick'"},
    2: {"dec65": "-99999999999999999999999999999999999.999999999999999999999999999999",
        "dec_u": "0.00",
        "ubig": "0", "sbig": "-9223372036854775808", "ti": "-128", "uti": "0",
        "si": "-32768", "usi": "0", "mi": "-8388608", "umi": "0", "i": "-2147483648",
        "ui": "0", "fl": "-3.402823466e38", "db": "-1.7976931348623157e308",
        "d": "'1000-01-01'", "dnn": "'1000-01-01'",
        "dt0": "'1000-01-01 00:00:00'", "dt3": "'1000-01-01 00:00:00.000'",
        "dt6": "'1000-01-01 00:00:00.000000'", "ts0": "'1970-01-01 00:00:01'",
        "ts6": "'1970-01-01 00:00:01.000000'", "tm0": "'-838:59:59'",
        "tm6": "'-838:59:59.000000'", "yr": "1901", "b1": "b'0'", "b5": "b'0'",
        "b64": "x'0000000000000000'", "en": "'a'", "st": "''",
        "js": """'[1e308, -0.0, 1.5e-300, "", [], {}]'""",
        "ip": "'::'", "uu": "'00000000-0000-0000-0000-000000000000'",
        "geo": "ST_GeomFromText('POINT(0 0)')", "pt": "ST_GeomFromText('POINT(-180 -90)', 4326)",
        "poly": "ST_GeomFromText('POLYGON((0 0, 1 0, 0 1, 0 0))')",
        "emoji": "''", "l1": "'Ç'", "u8bin": "''", "vbin": "x''", "vb": "x'00'", "bn": "x'FF'",
        "bl": "x''", "ch": "''", "txt": "''", "my col": "-1", "a`b": "''"},
    3: {"dec65": "0.000000000000000000000000000001", "dec_u": "0.01",
        "ubig": "9223372036854775808", "sbig": "-1", "ti": "0", "uti": "128", "si": "0",
        "usi": "32768", "mi": "0", "umi": "8388608", "i": "0", "ui": "2147483648",
        "fl": "1.175494351e-38", "db": "2.2250738585072014e-308",
        "d": "'0000-00-00'", "dnn": "'0000-00-00'",
        "dt0": "'0000-00-00 00:00:00'", "dt3": "'2020-00-15 00:00:00'",
        "dt6": "'2020-02-00 12:00:00.000001'", "ts0": "'0000-00-00 00:00:00'",
        "ts6": "'0000-00-00 00:00:00'", "tm0": "'-00:00:01'", "tm6": "'24:00:00.000001'",
        "yr": "0", "b1": "b'1'", "b5": "b'10101'", "b64": "x'8000000000000001'",
        "en": "''", "st": "'z'", "js": """'"just a string"'""",
        "ip": "'::ffff:192.168.0.1'", "uu": "'123e4567-e89b-12d3-a456-426614174000'",
        "geo": "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))')",
        "pt": "ST_GeomFromText('POINT(0 0)')",
        "poly": "ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))', 3857)",
        "emoji": "'a😀b'", "l1": "'naïve café'", "u8bin": "'B'", "vbin": "x'FF'",
        "vb": "x''", "bn": "x'00000000'", "bl": "x'FF00FF00'", "ch": "' lead'",
        "txt": "'ü'", "my col": "0", "a`b": "'`'"},
    4: {"dnn": "'2000-01-01'"},  # NULL but where NOT NULL
    5: {"dec65": "1.5", "sbig": "42", "d": "'2024-02-29'", "dnn": "'2024-02-29'",
        "dt6": "'2024-02-29 12:34:56.5'",
        "ts6": "'2024-02-29 12:34:56.5'", "tm6": "'12:34:56.5'", "en": "'b'", "st": "'x,z'",
        "js": """'{"k": 1}'""", "emoji": "'ok'", "ch": "'x'", "my col": "5"},
}
# Updates: row -> the row whose values it takes (every column but id); row 5 is deleted.
UPDATES = {1: 2, 2: 3, 3: 4, 4: 1}
DELETED = 5
# Zero dates and '2020-00-15' need a sql_mode without NO_ZERO_DATE, NO_ZERO_IN_DATE, strict.
SQL_MODE = "ALLOW_INVALID_DATES"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# An image expected or found: (database, table, op, id, "before" or "after")
Image = tuple[str, str, str, int, str]
# messages each tool publishes per table: inserts, updates, a delete and its tombstone
MESSAGES = len(ROWS) + len(UPDATES) + 2


def write_tables(server: EmbeddedMariaDB) -> dict[Image, tuple[Any, ...]]:
    """``TABLES`` as the binlog's whole content, each created, ``ROWS`` inserted, ``UPDATES``
    made, ``DELETED`` deleted. Returns what each change's image must hold: the source's
    row, read after the inserts and after the updates (values in the table's column
    order)."""
    unknown = {c for values in ROWS.values() for c in values} - set(NAMES)
    assert not unknown, unknown
    server.execute(*(f"DROP DATABASE IF EXISTS {db}" for db, _t, _c in TABLES), "RESET MASTER")
    images: dict[Image, tuple[Any, ...]] = {}
    for db, table, columns in TABLES:
        ddl = ",\n  ".join(f"{_quote(c)} {t}" for c, t in columns)
        server.execute(f"CREATE DATABASE {db}",
                       f"CREATE TABLE {db}.{table} (\n  {ddl}\n) DEFAULT CHARSET=utf8mb4")
        names = [c for c, _t in columns[1:]]
        with closing(server.connect(db)) as conn, conn.cursor() as cur:
            cur.execute(f"SET time_zone = '+00:00', sql_mode = '{SQL_MODE}'")
            for i, values in ROWS.items():
                literals = ", ".join([str(i), *(values.get(c, "NULL") for c in names)])
                cur.execute(f"INSERT INTO {table} VALUES ({literals})")
            inserted = select(conn, table, columns)
            for i, source in UPDATES.items():
                sets = ", ".join(f"{_quote(c)} = {ROWS[source].get(c, 'NULL')}" for c in names)
                cur.execute(f"UPDATE {table} SET {sets} WHERE id = {i}")
            updated = select(conn, table, columns)
            cur.execute(f"DELETE FROM {table} WHERE id = {DELETED}")
        images.update({(db, table, "c", i, "after"): row for i, row in inserted.items()})
        for i in UPDATES:
            images[(db, table, "u", i, "before")] = inserted[i]
            images[(db, table, "u", i, "after")] = updated[i]
        images[(db, table, "d", DELETED, "before")] = updated[DELETED]
    return images


def select(conn: Any, table: str, columns: tuple[tuple[str, str], ...]
           ) -> dict[int, tuple[Any, ...]]:
    """The table by id as pymysql reads it (the session in UTC); FLOAT as the DOUBLE it is
    exactly (its text form is rounded to 6 digits), BIT as its number."""
    exprs = []
    for c, t in columns:
        kind = t.split("(")[0].split()[0].upper()
        q = _quote(c)
        exprs.append(f"CAST({q} AS DOUBLE)" if kind == "FLOAT" else
                     f"{q} + 0" if kind == "BIT" else q)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {', '.join(exprs)} FROM {table} ORDER BY id")
        return {row[0]: row for row in cur.fetchall()}


# -- decoding by the Connect schema -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Geometry:
    wkb: bytes
    srid: int | None


@dataclasses.dataclass(frozen=True)
class Float32:
    value: float


_EPOCH = dt.datetime(1970, 1, 1)
# the type names JsonConverter writes and reads (JsonSchema's *_TYPE_NAME; it refuses others)
CONNECT_TYPES = frozenset(("boolean", "int8", "int16", "int32", "int64", "float", "double",
                           "bytes", "string", "array", "map", "struct"))


def _bytes(value: Any) -> bytes:
    return base64.b64decode(value) if isinstance(value, str) else bytes(value)


def decode(schema: dict[str, Any], value: Any) -> Any:
    """``value`` of Connect ``schema`` (JsonConverter's JSON) as a Python value, by the
    schema's type and semantic name as Debezium documents them for its MySQL connector."""
    name, kind = schema.get("name"), schema["type"]
    if kind not in CONNECT_TYPES:
        raise ValueError(f"{kind!r} is not a Connect schema type JsonConverter reads")
    if value is None:
        return None
    if kind == "struct":
        if name in ("io.debezium.data.geometry.Geometry", "io.debezium.data.geometry.Point",
                    "io.debezium.data.geometry.Geography"):
            if value.get("wkb") is None:  # a Point's x and y only
                return Geometry(struct.pack("<bIdd", 1, 1, value["x"], value["y"]),
                                value.get("srid"))
            return Geometry(_bytes(value["wkb"]), value.get("srid"))
        if name == "io.debezium.data.VariableScaleDecimal":
            unscaled = int.from_bytes(_bytes(value["value"]), "big", signed=True)
            return Decimal(unscaled).scaleb(-int(value["scale"]))
        return {f["field"]: decode(f, value.get(f["field"])) for f in schema["fields"]}
    if name == "org.apache.kafka.connect.data.Decimal":
        unscaled = int.from_bytes(_bytes(value), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(schema["parameters"]["scale"]))
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return _EPOCH.date() + dt.timedelta(days=value)
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return _EPOCH + dt.timedelta(milliseconds=value)
    if name == "io.debezium.time.MicroTimestamp":
        return _EPOCH + dt.timedelta(microseconds=value)
    if name == "io.debezium.time.NanoTimestamp":
        return _EPOCH + dt.timedelta(microseconds=value // 1000)
    if name == "io.debezium.time.ZonedTimestamp":
        return dt.datetime.fromisoformat(value).astimezone(dt.UTC).replace(tzinfo=None)
    if name in ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time"):
        return dt.timedelta(milliseconds=value)
    if name == "io.debezium.time.MicroTime":
        return dt.timedelta(microseconds=value)
    if name == "io.debezium.time.NanoTime":
        return dt.timedelta(microseconds=value // 1000)
    if name == "io.debezium.data.Bits":
        return int.from_bytes(_bytes(value), "little")
    if kind == "bytes":
        return _bytes(value)
    if kind == "float":  # JsonConverter's name of FLOAT32
        return Float32(float(value))
    if kind == "double":
        return float(value)
    if kind == "boolean":
        return bool(value)
    if kind in ("int8", "int16", "int32", "int64"):
        return int(value)
    return value  # string: text, Json, Enum, EnumSet, Uuid, ZonedTime...


def schema_label(schema: dict[str, Any]) -> str:
    """A column's Connect schema in short: its type, and its semantic name's last part."""
    name = schema.get("name")
    return f"{schema['type']} {name.rsplit('.', 1)[-1]}" if name else schema["type"]


# -- canonical text ---------------------------------------------------------------------------

def _kind(sql_type: str) -> str:
    return sql_type.split("(")[0].split()[0].upper()


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _duration(t: dt.timedelta) -> str:
    micros = t // dt.timedelta(microseconds=1)
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, micros = divmod(micros, 1_000_000)
    return f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micros:06d}"


def _json(text: str) -> str:
    try:
        return json.dumps(json.loads(text, parse_float=Decimal, parse_int=int),
                          sort_keys=True, ensure_ascii=False, default=str)
    except ValueError:
        return f"unparsable JSON {text!r}"


def canonical(value: Any, sql_type: str) -> str:
    """A value (pymysql's of the source, or :func:`decode`'s of a message) as text, the
    same for the same value of a column of ``sql_type``."""
    if value is None:
        return "NULL"
    kind = _kind(sql_type)
    if kind in ("GEOMETRY", "POINT", "POLYGON"):
        if isinstance(value, Geometry):
            srid = "null" if value.srid is None else value.srid
            return f"srid={srid} wkb={value.wkb.hex()}"
        if isinstance(value, bytes | bytearray):  # MariaDB's: SRID (4 bytes LE), then WKB
            return f"srid={int.from_bytes(value[:4], 'little')} wkb={bytes(value[4:]).hex()}"
    if kind == "BIT":
        if isinstance(value, bytes):
            return str(int.from_bytes(value, "big"))
        return str(int(value))
    if isinstance(value, Float32):
        return repr(_f32(value.value))
    if kind == "FLOAT" and isinstance(value, float):
        return repr(_f32(value))
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, Decimal):
        if value == 0:
            return "0"
        return format(value.normalize(), "f")
    if kind == "DECIMAL" and isinstance(value, str):
        try:
            return canonical(Decimal(value), sql_type)
        except decimal.InvalidOperation:
            return value
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if kind == "JSON" and isinstance(value, str):
        return _json(value)
    if kind in ("DATETIME", "TIMESTAMP") and isinstance(value, str):
        return value if "." in value else value + ".000000"  # a zero date pymysql keeps
    if kind == "TIME" and isinstance(value, str):
        return value
    return str(value)


# -- reading a tool's messages ----------------------------------------------------------------

@dataclasses.dataclass
class Messages:
    """A tool's messages of the tables, decoded: each change's images."""

    tool: str
    images: dict[Image, dict[str, Any]] = dataclasses.field(default_factory=dict)
    schemas: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> label
    problems: list[str] = dataclasses.field(default_factory=list)  # what went wrong


async def _read_all(bootstrap: str, topic: str, partitions: int) -> list[bytes | None]:
    """Every value on ``topic`` (None: a tombstone)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        values: list[bytes | None] = []
        while [tp for tp in assigned if await consumer.position(tp) < ends[tp]]:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                values.extend(r.value for r in records)
        return values
    finally:
        await consumer.stop()


def read_messages(found: Messages, bootstrap: str, topic: str, partitions: int,
                  keep: Path | None = None) -> None:
    """Every message on ``topic`` decoded by its own schema into ``found`` (tombstones
    skipped); ``keep``: a file the values are written to as they are, one a line."""
    values = asyncio.run(_read_all(bootstrap, topic, partitions))
    if keep is not None:
        keep.write_bytes(b"".join((v or b"null") + b"\n" for v in values))
    for value in values:
        if value is None:
            continue
        envelope = json.loads(value)
        if not isinstance(envelope, dict) or "schema" not in envelope:
            found.problems.append(f"a value without a Connect schema: {value[:80]!r}")
            continue
        try:
            event = decode(envelope["schema"], envelope["payload"])
        except ValueError as e:
            found.problems.append(f"{topic}: {e}")
            continue
        fields = {f["field"]: f for f in envelope["schema"]["fields"]}
        for f in fields["after"]["fields"]:
            found.schemas.setdefault(f["field"], schema_label(f))
        source = event["source"]
        for image in ("before", "after"):
            row = event.get(image)
            if row is not None:
                found.images[(source["db"], source["table"], event["op"], int(row["id"]),
                              image)] = row


# -- the comparison ---------------------------------------------------------------------------

def _short(text: str, width: int = 28) -> str:
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _latin1_hex(text: str) -> str | None:
    try:
        return text.encode("latin-1").hex()
    except UnicodeEncodeError:
        return None


def describe(source: str, tool: str, sql_type: str) -> str:
    """A difference in a few words: a known kind by name, else both texts shortened."""
    kind = _kind(sql_type)
    if tool == "NULL" and kind in ("DATE", "DATETIME", "TIMESTAMP") and (
            source.startswith("0000") or "-00" in source[:10]):
        return "zero date → null" if source.startswith("0000-00-00") else "invalid date → null"
    if tool.startswith("1970-01-01") and kind in ("DATE", "DATETIME", "TIMESTAMP") and (
            source.startswith("0000") or "-00" in source[:10]):
        return "zero date → epoch (NOT NULL)"
    if kind == "YEAR" and source == "0" and tool == "1900":
        return "YEAR 0 → 1900"
    if source.startswith("srid=0 ") and tool == "srid=null " + source[7:]:
        return "SRID 0 → null"
    if source.startswith("0x") and _latin1_hex(tool) == source[2:]:
        return "bytes → string (as latin1)"
    if kind in ("BIGINT", "BIT") and tool.startswith("-") and not source.startswith("-"):
        return "> 2^63-1 → negative int64"
    return f"{_short(source)} → {_short(tool)}"


@dataclasses.dataclass
class Comparison:
    tool: str
    cells: dict[str, list[str]]  # column -> the differences found (none: the same)
    problems: list[str]  # messages missing or unreadable, the tool's failure


def compare(found: Messages, expected: dict[Image, tuple[Any, ...]]) -> Comparison:
    """Each image ``found`` against the source's, value by value."""
    cells: dict[str, list[str]] = {c: [] for c in NAMES}
    problems = list(found.problems)
    columns = {(db, table): cols for db, table, cols in TABLES}
    missing: dict[str, int] = {}

    def note(column: str, text: str) -> None:
        if text not in cells[column]:
            cells[column].append(text)

    for key, source_row in expected.items():
        got = found.images.get(key)
        if got is None:
            for column, _t in columns[key[:2]][1:]:  # (the id: in the other table too)
                note(column, "not published")
            missing[f"{key[0]}.{key[1]}"] = missing.get(f"{key[0]}.{key[1]}", 0) + 1
            continue
        for (column, sql_type), source in zip(columns[key[:2]], source_row, strict=True):
            if column not in got:
                note(column, "column missing")
                continue
            want, have = canonical(source, sql_type), canonical(got[column], sql_type)
            if want != have:
                note(column, describe(want, have, sql_type))
    for table, count in missing.items():
        problems.append(f"{table}: {count} of {len(expected) // len(TABLES)} images not "
                        "published")
    for key in found.images.keys() - expected.keys():
        problems.append(f"unexpected {key[4]} image of {key[2]} id={key[3]} in {key[0]}.{key[1]}")
    return Comparison(found.tool, cells, problems)


# Differences of this service its documentation states, as Debezium behaves (docs/kafka.md,
# cdcserver/sinks/kafka/README.md): a zero or invalid date is null (the epoch in a NOT NULL
# column, Debezium's fallback for a required field); BIGINT UNSIGNED and
# BIT(64) above 2^63-1 are the negative int64 of the same bits
# (bigint.unsigned.handling.mode=long); a geometry's SRID 0 is null.
DOCUMENTED = ("zero date → null", "invalid date → null", "zero date → epoch (NOT NULL)",
              "> 2^63-1 → negative int64", "SRID 0 → null")


def undocumented(result: Comparison) -> dict[str, list[str]]:
    """The differences of ``result`` its documentation does not state (the service's)."""
    found = {c: [d for d in notes if d not in DOCUMENTED] for c, notes in result.cells.items()}
    return {c: notes for c, notes in found.items() if notes}


def _sql_type(column: str) -> str:
    sql_type = dict(COLUMNS)[column].removesuffix(" PRIMARY KEY")
    return (sql_type if "NOT NULL" in sql_type else sql_type.removesuffix(" NULL")).lower()


def report(results: list[Comparison], schemas: dict[str, dict[str, str]]) -> None:
    """The table: each column (its type) by tool, ``same`` or the differences; the Connect
    schemas where the tools' differ."""
    rows = []
    for column in NAMES:
        cells = []
        for r in results:
            notes = r.cells[column]
            if r.tool == SERVICE:
                notes = [f"{n} (doc)" if n in DOCUMENTED else n for n in notes]
            cells.append("; ".join(notes) or "same")
        labels = [s.get(column, "-") for s in schemas.values()]
        cells.append(" / ".join(labels) if len(set(labels)) > 1 else "")
        quoted = f"`` {column} ``" if "`" in column else f"`{column}`"  # Markdown's code
        rows.append((f"{quoted} {_sql_type(column)}", *cells))
    header = ("column type", *(r.tool for r in results),
              "Connect schemas where they differ (" + " / ".join(schemas) + ")")
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True))
              + " |", flush=True)
    for r in results:
        for p in r.problems:
            line(f"{r.tool}: problem", p)


Starter = Callable[[list[str]], AbstractContextManager[Running]]
GRACE = 5.0  # seconds the other tables' topics may take once the last table's is complete


def run_tool(tool: str, start: Starter, bootstrap: str, prefix: str, producer: Producer,
             timeout: float, keep: Path | None = None) -> Messages:
    """Start a tool publishing to ``<prefix>.<db>.<table>``, wait until the last table's
    topic holds its messages (or the tool stops), then read every table's (kept under
    ``keep``)."""
    found = Messages(tool)
    topics = [f"{prefix}.{db}.{table}" for db, table, _c in TABLES]
    try:
        with start(topics) as running:
            watch(bootstrap, topics[-1], producer.partitions, MESSAGES, running.pid,
                  running.started, running.alive, timeout)
            for topic in topics[:-1]:  # written before: published before, or never
                with contextlib.suppress(Stopped, ConnectFailed):
                    watch(bootstrap, topic, producer.partitions, MESSAGES, running.pid,
                          running.started, running.alive,
                          time.monotonic() - running.started + GRACE)
    except (Stopped, ConnectFailed) as e:
        found.problems.append(f"{tool} stopped: {str(e)[:2000]}")
    for topic in topics:
        read_messages(found, bootstrap, topic, producer.partitions,
                      keep=keep / f"{topic}.jsonl" if keep else None)
    return found


def measure(server: EmbeddedMariaDB, bootstrap: str, directory: Path, producer: Producer,
            *, tuned: bool = True, run: str = "", timeout: float = 120.0,
            tools: tuple[str, ...] = (SERVICE, DEBEZIUM)
            ) -> tuple[list[Comparison], dict[str, dict[str, str]]]:
    """The tables written, each of ``tools`` run over them; each one's comparison, and
    each tool's Connect schema of each column."""
    expected = write_tables(server)
    databases = ",".join(db for db, _t, _c in TABLES)
    results, schemas = [], {}
    for tool in tools:
        prefix = f"{'svc' if tool == SERVICE else 'dbz'}fid{run}"
        start: Starter
        if tool == SERVICE:
            def start(topics: list[str], prefix: str = prefix) -> AbstractContextManager[Running]:
                return service_running(server, bootstrap, directory / "service", producer,
                                       server_id=9311, prefix=prefix, topics=topics)
        else:
            def start(topics: list[str], prefix: str = prefix) -> AbstractContextManager[Running]:
                return debezium_running(server, databases, bootstrap, directory / "debezium",
                                        producer, server_id=9312, prefix=prefix,
                                        tuned=tuned, topics=topics, options=DEBEZIUM_OPTIONS)
        found = run_tool(tool, start, bootstrap, prefix, producer, timeout, keep=directory)
        results.append(compare(found, expected))
        schemas[tool] = found.schemas
    return results, schemas


def main(producer: Producer) -> int:
    """``bench_peers.py --fidelity``: a private MariaDB and broker, the comparison run and
    printed; 1 when this service has a difference its documentation does not state."""
    line("fidelity", f"{len(COLUMNS)} columns in {len(TABLES)} tables, {len(ROWS)} rows "
                     f"inserted, {len(UPDATES)} updated, 1 deleted; each tool from the "
                     "binlog's start")
    os.makedirs(OUT, exist_ok=True)
    with fresh_server("mariadb") as server, kafka_broker() as broker:
        results, schemas = measure(server, broker.bootstrap, Path(OUT, "peers", "fidelity"),
                                   producer)
    report(results, schemas)
    ours = next(r for r in results if r.tool == SERVICE)
    return 1 if undocumented(ours) or ours.problems else 0
