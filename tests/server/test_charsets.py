"""Every character set MariaDB has reaches the stream as the server's own characters (issue 15,
items 3 and 7): what ``CONVERT(col USING utf8mb4)`` gives on the source, for every character.

One service replicates a table per character set in ``SHOW CHARACTER SET``. The values are not
drawn from the service's tables: each single-byte set's column gets all 256 bytes, each
multibyte set's every two-byte sequence (one row per lead byte) and, for the three-byte sets,
every three-byte sequence of the lead 0x8F; the server stores what it accepts (``?`` for what
it does not, in a permissive ``sql_mode``). Each table is then rebuilt from the raw JSON stream
(tests/oracle.py) and compared with ``SELECT`` on the source, after an update and a delete.
"""

from __future__ import annotations

import gzip
import json

import pytest

from cdcserver.mariadb import charsets as charsets_module
from cdcserver.mariadb.charmaps_generate import generate
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER
from tests.oracle import read_stream
from tests.server.test_rowless import _equal, _run

pytestmark = pytest.mark.mariadb

UNICODE = {"utf8mb3", "utf8mb4", "ucs2", "utf16", "utf16le", "utf32"}
SAMPLE = "plain ASCII, é ñ ß Ω Ж ש ع ก 日本語 한국어 中文 ∑ € 😀 𝄞"


def _charsets(source: Source) -> list[tuple[str, int]]:
    rows = source.query("SELECT CHARACTER_SET_NAME, MAXLEN FROM information_schema.CHARACTER_SETS"
                        " WHERE CHARACTER_SET_NAME <> 'binary' ORDER BY 1")
    return [(str(name), int(str(maxlen))) for name, maxlen in rows]


def _byte_rows(charset: str, maxlen: int) -> list[bytes]:
    """The values written to the table of one character set, as bytes."""
    if maxlen == 1:
        return [bytes(range(256)), bytes(range(255, -1, -1))]
    rows = [bytes(range(128))]
    rows += [b"".join(bytes([lead, trail]) for trail in range(256)) for lead in range(128, 256)]
    if maxlen == 3:
        rows += [b"".join(bytes([0x8F, mid, trail]) for trail in range(256))
                 for mid in range(0xA1, 0xFF)]
    return rows


def _statements(charset: str, maxlen: int) -> list[str]:
    table = f"cs_{charset}"
    create = (f"CREATE TABLE {table} (id INT PRIMARY KEY, v MEDIUMTEXT CHARACTER SET {charset},"
              f" c VARCHAR(20) CHARACTER SET {charset})")
    if charset in UNICODE:
        sample = SAMPLE.replace("'", "''")
        rows = [f"({i}, '{sample}', 'ü{i}')" for i in range(3)]
    else:
        rows = [f"({i}, X'{value.hex()}', X'{value[:20].hex()}')"
                for i, value in enumerate(_byte_rows(charset, maxlen))]
    return [create, f"INSERT INTO {table} VALUES " + ", ".join(rows),
            f"UPDATE {table} SET v = REVERSE(v), c = LEFT(REVERSE(v), 20) WHERE id = 1",
            f"DELETE FROM {table} WHERE id = 2"]


async def test_every_character_set_streams_the_servers_characters(cdc: RunningService,
                                                                   source: Source):
    charsets = _charsets(source)
    assert len(charsets) >= 39, charsets  # MariaDB 10.11 has 40, binary included
    for charset, maxlen in charsets:
        _run(source, *_statements(charset, maxlen), session=("SET SESSION sql_mode = ''",))
    await cdc.caught_up(source)
    for charset, _ in charsets:
        await _equal(cdc, source, f"cs_{charset}")


async def test_statements_in_any_character_set_name_columns_as_the_server_does(
        cdc: RunningService, source: Source):
    """A DDL statement's text is in the client's character set: a column named in it keeps
    the server's name, and the table's values stay where they belong."""
    names = {"sjis": "ア列", "big5": "中文欄", "greek": "στήλη", "koi8r": "столбец",
             "ujis": "日本列", "hebrew": "עמודה", "cp1250": "sloupeček", "euckr": "열",
             "armscii8": "Սյունակ", "geostd8": "სვეტი", "keybcs2": "sloupeček"}
    for charset, name in names.items():
        statements = [f"ALTER TABLE cs_{charset} ADD COLUMN `{name}` VARCHAR(20)"
                      " CHARACTER SET utf8mb4, ADD COLUMN tail INT",
                      f"INSERT INTO cs_{charset} VALUES (1, '{name}', 7)"]
        # the statements in the character set, as the server itself encodes them
        encoded = [bytes.fromhex(str(source.query(f"SELECT HEX(CONVERT(%s USING {charset}))",
                                                  (sql,))[0][0])) for sql in statements]
        conn = source.server.connect(source.database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE TABLE cs_{charset} (id INT PRIMARY KEY)")
                cur.execute(f"SET NAMES {charset}")
                for statement in encoded:
                    cur.execute(statement)
        finally:
            conn.close()
    await cdc.caught_up(source)
    for charset, name in names.items():
        rebuilt = await _equal(cdc, source, f"cs_{charset}")
        assert [(r[name], r["tail"]) for r in rebuilt.rows.values()] == [(name, 7)]


async def test_a_ucs2_surrogate_becomes_the_replacement_character(cdc: RunningService,
                                                                  source: Source):
    """MariaDB's ucs2 stores any 16-bit unit, a lone or paired surrogate too, each as one
    character; it has no UTF-8 form (the server's own CONVERT gives invalid bytes), so the
    stream carries U+FFFD for it and replication goes on."""
    _run(source, "CREATE TABLE u (id INT PRIMARY KEY, v VARCHAR(10) CHARACTER SET ucs2)",
         "INSERT INTO u VALUES (1, X'0041D800'), (2, X'D83DDE00'), (3, X'00E9')",
         "CREATE TABLE after_u (id INT PRIMARY KEY)", "INSERT INTO after_u VALUES (1)",
         session=("SET SESSION sql_mode = ''",))
    await cdc.caught_up(source)
    lines = await read_stream(cdc.port, f"{source.database}.u", user=USER, password=PASSWORD)
    values = {r["id"]: r["v"] for r in lines[1:]}
    assert values == {1: "A\ufffd", 2: "\ufffd\ufffd", 3: "é"}, json.dumps(lines)
    await _equal(cdc, source, "after_u")


def test_the_shipped_tables_are_this_servers(source: Source):
    """The tables shipped with the service are what the generator reads from the server the
    suite runs (a MariaDB upgrade that changes a character set shows here first)."""
    conn = source.server.connect()
    try:
        fresh = generate(conn)["charsets"]
    finally:
        conn.close()
    with gzip.open(charsets_module._DATA, "rt", encoding="utf-8") as f:
        shipped = json.load(f)["charsets"]
    assert sorted(fresh) == sorted(shipped)
    changed = [name for name in fresh if fresh[name] != shipped[name]]
    assert not changed, f"regenerate charmaps.json.gz: {changed} differ on this server"
    names = {str(row[0]) for row in source.query("SHOW CHARACTER SET")}
    assert names == set(shipped) | UNICODE | {"binary"}
