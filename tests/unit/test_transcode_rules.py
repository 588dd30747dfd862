"""The compiled transcoder under ``[capture]`` column rules against the Python path.

A table under rules must not lose the compiled path, and must not store different bytes for
it: row images built here byte by byte are transcoded in C, and decoded, projected
(``masking.project_layout``) and encoded in Python, and the two records must be identical, for
every rule on every string type it applies to (UTF-8 and single-byte text, binary data,
BINARY's NUL padding), with NULLs, empty values, multi-byte characters, and masks that keep
none, some or more than the value has; an excluded column may be of any type the transcoder
takes. The hashes are also checked against ``hashlib`` directly.
"""

from __future__ import annotations

import ctypes.util
import functools
import hashlib
import io
import random
import struct
from collections.abc import Callable
from typing import Any

import fastavro
import pytest

from cdcserver.core.capture import ColumnRules, hash_value, parse_column_patterns
from cdcserver.core.changes import ColumnDef, EventType, TableLayout
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.replication.rowcodec import compile_rows_decoder
from cdcserver.schema.masking import Projection, project_layout
from cdcserver.store import transcoder
from cdcserver.store.encoder import compile_encoder, record_head, record_tail
from cdcserver.store.schema import TableSchema

SALT = b"pepper \x00\xff and salt"
HEAD = record_head(0, 1, 42)
TAILS = (record_tail(1_700_000_000, EventType.UPDATE_BEFORE),
         record_tail(1_700_000_000, EventType.UPDATE_AFTER))


def _char(n: int) -> int:
    """A CHAR/BINARY column's table-map metadata for ``n`` bytes (tablemap.py's packing)."""
    return ((0xFE ^ ((n & 0x300) >> 4)) << 8) | (n & 0xFF)


def _prefixed(size: int) -> Callable[[bytes], bytes]:
    return lambda data: len(data).to_bytes(size, "little") + data


def _text(rng: random.Random, most: int, alphabet: str = "aé€🎉 z") -> bytes:
    length = rng.choice([0, 1, 2, 3, 4, rng.randint(0, most)])
    return "".join(rng.choices(alphabet, k=length)).encode()


def _latin1(rng: random.Random, most: int) -> bytes:
    # 0x80 is the euro sign: 3 bytes in UTF-8; 0xE9 is é: 2 bytes
    return bytes(rng.choices(b"a z\x80\xe9\xff", k=rng.randint(0, most)))


def _bytes(rng: random.Random, most: int) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 3, rng.randint(0, most)]))


def _binary(rng: random.Random, n: int) -> bytes:
    """BINARY(n) as logged: the trailing NULs stripped (Field_string::pack)."""
    return rng.randbytes(rng.randint(0, n)).rstrip(b"\0")


# (column, its image bytes from a value's bytes, a random value's bytes)
Column = tuple[ColumnDef, Callable[[bytes], bytes], Callable[[random.Random], bytes]]
STRINGS: list[Column] = [
    (ColumnDef("vc", T.VARCHAR, meta=80, charset="utf-8"), _prefixed(1),
     lambda r: _text(r, 20)),
    (ColumnDef("vcl", T.VARCHAR, meta=1200, charset="utf-8"), _prefixed(2),
     lambda r: _text(r, 300)),
    (ColumnDef("c", T.STRING, meta=_char(40), charset="utf-8"), _prefixed(1),
     lambda r: _text(r, 10).rstrip(b" ")),
    (ColumnDef("cw", T.STRING, meta=_char(1020), charset="utf-8"), _prefixed(2),
     lambda r: _text(r, 255).rstrip(b" ")),
    (ColumnDef("tx", T.BLOB, meta=2, charset="utf-8"), _prefixed(2),
     lambda r: _text(r, 3000)),
    (ColumnDef("ltx", T.BLOB, meta=4, charset="utf-8"), _prefixed(4),
     lambda r: _text(r, 500)),
    (ColumnDef("cl", T.VARCHAR, meta=20, charset="mariadb_latin1"), _prefixed(1),
     lambda r: _latin1(r, 20)),
    (ColumnDef("txl", T.BLOB, meta=2, charset="mariadb_latin1"), _prefixed(2),
     lambda r: _latin1(r, 3000)),  # hashed a chunk at a time
    (ColumnDef("vb", T.VARCHAR, meta=10), _prefixed(1), lambda r: _bytes(r, 10)),
    (ColumnDef("bl", T.BLOB, meta=2), _prefixed(2), lambda r: _bytes(r, 3000)),
    (ColumnDef("bn", T.STRING, meta=_char(4)), _prefixed(1), lambda r: _binary(r, 4)),
    (ColumnDef("bn200", T.STRING, meta=_char(200)), _prefixed(1), lambda r: _binary(r, 200)),
]
OTHERS: list[Column] = [  # excluded only (hash and mask leave them out too)
    (ColumnDef("ti", T.TINY), bytes, lambda r: r.randbytes(1)),
    (ColumnDef("d", T.NEWDECIMAL, meta=(12 << 8) | 2), bytes,
     lambda r: bytes([0x80, 0, 0, 0, 0, r.randint(0, 99)])),
    (ColumnDef("b13", T.BIT, meta=(1 << 8) | 5), bytes, lambda r: r.randbytes(2)),
    (ColumnDef("dt", T.DATE), bytes,
     lambda r: ((r.randint(1000, 9999) << 9) | (r.randint(1, 12) << 5) | r.randint(1, 28))
     .to_bytes(3, "little")),
    (ColumnDef("e", T.ENUM, meta=1, charset="utf-8", enum_values=("a", "é")), bytes,
     lambda r: bytes([r.randint(0, 2)])),
    (ColumnDef("f", T.DOUBLE), bytes, lambda r: struct.pack("<d", r.uniform(-1e9, 1e9))),
]
ID = ColumnDef("id", T.LONG, nullable=False)
STRING_NAMES = {c.name for c, _, _ in STRINGS}
STRING_EDGES = [b"", "é🎉€a".encode(), b"abc", "🎉🎉🎉🎉🎉".encode(), b"x" * 64]


def _layout(columns: list[Column]) -> TableLayout:
    return TableLayout("db", "t", (ID, *(c for c, _, _ in columns)), primary_key=(0,))


@functools.cache
def _string_images() -> bytes:
    return _images(STRINGS, 300, seed=5)


def _images(columns: list[Column], count: int, seed: int) -> bytes:
    """``count`` row images: the edge values first in the string columns, then a row of
    NULLs, then random rows with a NULL now and then."""
    rng = random.Random(seed)
    edges = len(STRING_EDGES)
    out = bytearray()
    for r in range(count):
        nulls = 0
        values = [struct.pack("<i", r)]
        for i, (col, image, value) in enumerate(columns, start=1):
            if r == edges or (r > edges and rng.random() < 0.1):
                nulls |= 1 << i
                continue
            data = value(rng)
            if r < edges and col.name in STRING_NAMES:
                data = STRING_EDGES[r]
                if col.charset == "mariadb_latin1":
                    data = data.decode().encode(col.charset, "replace")
            values.append(image(data))
        out += nulls.to_bytes((len(columns) + 8) // 8, "little") + b"".join(values)
    return bytes(out)


def _rules(rule: str, columns: str) -> ColumnRules:
    """``rule`` (exclude, hash, mask:N) for the comma-separated column patterns."""
    if rule == "exclude":
        return ColumnRules(exclude=parse_column_patterns(columns))
    if rule == "hash":
        return ColumnRules(hash=parse_column_patterns(columns), salt=SALT)
    keep = rule.partition(":")[2]
    return ColumnRules(mask=parse_column_patterns(
        ",".join(f"{c}:{keep}" for c in columns.split(",")), keep=True))


def _both_paths(layout: TableLayout, rules: ColumnRules, images: bytes
                ) -> tuple[bytes | None, bytes, Projection]:
    """The records the compiled path writes (None: it hands the event to Python) and the
    ones the Python path writes."""
    projection = project_layout(layout, rules)
    assert projection is not None
    stored = projection.layout
    fields = TableSchema.from_layout(stored, 1, "").columns
    compiled = transcoder.compile_transcoder(fields, stored.image_columns, stored.salt)
    assert compiled is not None, "rules put the table on the Python path"
    fast = None
    written = compiled.rows(images, 0, len(images))
    if written is not None:
        out = bytearray()
        transcoder.records(out, HEAD, TAILS, written[0], written[1], 0)
        fast = bytes(out)
    rows = [projection.row(row) for row in compile_rows_decoder(layout.columns)(
        images, 0, len(images))]
    slow = bytearray()
    compile_encoder(fields, stored.columns)(slow, HEAD, TAILS, rows, 0)
    return fast, bytes(slow), projection


def _read(projection: Projection, data: bytes) -> list[Any]:
    schema = TableSchema.from_layout(projection.layout, 1, "")
    parsed = fastavro.parse_schema(schema.avsc)
    stream = io.BytesIO(data)
    records = []
    while stream.tell() < len(data):
        records.append(fastavro.schemaless_reader(stream, parsed, None))
    return records


@pytest.fixture(autouse=True)
def _compiled() -> None:
    if not transcoder.available():
        pytest.skip("the compiled extensions are not built (or CDC_PURE_PYTHON is set)")


RULES = ["exclude", "hash", "mask:0", "mask:1", "mask:3", "mask:100"]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("column", [c.name for c, _, _ in STRINGS])
def test_a_ruled_string_column_is_written_as_the_python_path_writes_it(rule, column):
    if rule == "hash" and not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    fast, slow, _ = _both_paths(_layout(STRINGS), _rules(rule, f"db.t.{column}"),
                                _string_images())
    assert fast is not None and fast == slow


@pytest.mark.parametrize("rule", RULES)
def test_every_column_ruled_at_once_and_the_key_stays_clear(rule):
    """``db.t.*``: the key stays clear, every string column takes the rule."""
    if rule == "hash" and not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    fast, slow, projection = _both_paths(_layout(STRINGS), _rules(rule, "db.t.*"),
                                         _images(STRINGS, 500, seed=3))
    assert fast is not None and fast == slow
    assert len(projection.layout.columns) == (1 if rule == "exclude" else len(STRINGS) + 1)


@pytest.mark.parametrize("rule", ["exclude", "hash", "mask:2"])
def test_other_types_are_left_out_and_still_read(rule):
    """Hash and mask leave a number, a date, an ENUM... out: read (its bytes skipped), not
    written; a column kept between excluded ones is written where it belongs."""
    columns = [*OTHERS, STRINGS[0]]
    names = ",".join(f"db.t.{c.name}" for c, _, _ in OTHERS)
    fast, slow, projection = _both_paths(_layout(columns), _rules(rule, names),
                                         _images(columns, 200, seed=11))
    assert fast is not None and fast == slow
    assert [c.name for c in projection.layout.columns] == ["id", "vc"]


def test_hashes_are_the_salted_sha256_of_the_values_bytes():
    if not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    columns = [STRINGS[0], STRINGS[6], STRINGS[8], STRINGS[10]]  # utf8, latin1, bytes, binary
    layout = _layout(columns)
    rows = [(1, "é🎉", "é€", b"\x00\xff", b"\x01\x00\x00\x00"),
            (2, "", "", b"", b"\x00" * 4), (3, None, None, None, None)]
    images = b"".join(
        bytes([0 if row[1] is not None else 0b11110]) + struct.pack("<i", row[0]) +
        (b"" if row[1] is None else
         bytes([len(row[1].encode())]) + row[1].encode() +
         bytes([len(row[2])]) + row[2].encode("mariadb_latin1") +
         bytes([len(row[3])]) + row[3] + bytes([len(row[4].rstrip(b"\0"))]) +
         row[4].rstrip(b"\0"))
        for row in rows)
    fast, slow, projection = _both_paths(layout, _rules("hash", "db.t.*"), images)
    assert fast is not None and fast == slow
    records = _read(projection, fast)
    for row, record in zip(rows, records, strict=True):
        for value, name in zip(row[1:], ("vc", "cl", "vb", "bn"), strict=True):
            data = value.encode() if isinstance(value, str) else value
            expected = None if value is None else hashlib.sha256(SALT + data).hexdigest()
            assert record[name] == expected
            if value is not None:
                assert hash_value(SALT, value) == expected  # the Python path's oracle


def test_masks_keep_characters_of_text_and_bytes_of_binary_data():
    columns = [STRINGS[0], STRINGS[6], STRINGS[8], STRINGS[10]]
    images = (b"\x00" + struct.pack("<i", 1) + b"\x08" + "é🎉ab".encode() +
              b"\x03\xe9\x80z" + b"\x03\x00\xff\x01" + b"\x01\x07")
    fast, slow, projection = _both_paths(_layout(columns), _rules("mask:2", "db.t.*"), images)
    assert fast is not None and fast == slow
    [record] = _read(projection, fast)
    assert (record["vc"], record["cl"], record["vb"], record["bn"]) == (
        "é🎉***", "é€***", b"\x00\xff***", b"\x07\x00***")


@pytest.mark.parametrize("rule", ["exclude", "hash", "mask:1"])
def test_invalid_utf8_in_a_ruled_column_goes_to_the_python_path(rule):
    """Checked as before the rule: the compiled path hands the event over, and the Python
    decoder refuses it."""
    if rule == "hash" and not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    layout = _layout(STRINGS[:1])
    projection = project_layout(layout, _rules(rule, "db.t.vc"))
    assert projection is not None
    stored = projection.layout
    compiled = transcoder.compile_transcoder(TableSchema.from_layout(stored, 1, "").columns,
                                             stored.image_columns, stored.salt)
    assert compiled is not None
    images = b"\x00" + struct.pack("<i", 1) + b"\x02\xc3("
    assert compiled.rows(images, 0, len(images)) is None
    with pytest.raises(UnicodeDecodeError):
        compile_rows_decoder(layout.columns)(images, 0, len(images))
    truncated = b"\x00" + struct.pack("<i", 1) + b"\x05ab"
    assert compiled.rows(truncated, 0, len(truncated)) is None


def test_hashed_tables_need_the_salt_and_sha256():
    """Without the salt the compiled transcoder is not made (the store decodes the rows);
    without SHA-256 in C, ``takes`` keeps the table's rows decoded."""
    if not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    projection = project_layout(_layout(STRINGS[:1]), _rules("hash", "db.t.vc"))
    assert projection is not None
    stored = projection.layout
    fields = TableSchema.from_layout(stored, 1, "").columns
    assert transcoder.takes(stored.image_columns)
    assert transcoder.compile_transcoder(fields, stored.image_columns, None) is None
    assert transcoder.compile_transcoder(fields, stored.image_columns, SALT) is not None


def test_without_libcrypto_hashed_tables_take_the_python_path(monkeypatch):
    """No library with SHA256_Init/_Update/_Final (here: none at all, then only libc): a
    hashed table is not taken, a masked or excluded one still is, and a transcoder made
    before keeps hashing."""
    if not transcoder.sha256_loaded():
        pytest.skip("no libcrypto to hash with in C")
    hashed = project_layout(_layout(STRINGS[:1]), _rules("hash", "db.t.vc"))
    masked = project_layout(_layout(STRINGS[:1]), _rules("mask:1", "db.t.vc"))
    assert hashed is not None and masked is not None
    images = _images(STRINGS[:1], 20, seed=2)
    fields = TableSchema.from_layout(hashed.layout, 1, "").columns
    made = transcoder.compile_transcoder(fields, hashed.layout.image_columns, SALT)
    assert made is not None
    before = made.rows(images, 0, len(images))
    libc = ctypes.util.find_library("c")
    try:
        for candidates in ([], [libc] if libc else []):
            monkeypatch.setattr(transcoder, "_libcrypto_candidates", lambda c=candidates: c)
            transcoder.sha256_loaded.cache_clear()
            transcoder.takes.cache_clear()
            assert not transcoder.takes(hashed.layout.image_columns)
            assert transcoder.takes(masked.layout.image_columns)
            assert made.rows(images, 0, len(images)) == before
    finally:
        monkeypatch.undo()
        transcoder.sha256_loaded.cache_clear()
        transcoder.takes.cache_clear()
    assert transcoder.sha256_loaded() and transcoder.takes(hashed.layout.image_columns)
