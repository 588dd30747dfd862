"""File names in the data directory.

MaxScale names a table version ``<db>.<table>.<NNNNNN>.avro`` (six-digit, zero-padded). MariaDB
identifiers may contain dots, slashes or any Unicode character, which would make such a name
ambiguous or escape the directory. A character outside ``[A-Za-z0-9_$-]`` is therefore written as
``@`` and four hex digits, the way MariaDB names its own table files (``@002e`` for ``.``), so an
ordinary name maps to itself and every name maps back exactly.

A file name has at most 255 bytes (NAME_MAX), and MariaDB allows 64 characters of any script
in a database's and a table's name: written this way, two such names take up to 640 bytes.
A stem (``<db>.<table>``) that would not leave room for its longest suffix therefore writes
each long name as its first characters, ``~`` and 24 hex digits of the name's SHA-256
(:func:`short_identifier`): no other encoded name holds a ``~``, so it never equals one, and
such a name is read back from the file's own header (the schema, a dump's first line), not
from its name. Every stem that fitted before keeps its name, so data directories written
earlier keep working.
"""

from __future__ import annotations

import hashlib
import re

from cdcserver.core.names import TableName

_SAFE = re.compile(r"[A-Za-z0-9_$-]")
_ESCAPE = re.compile(r"@([0-9a-f]{4})")
_VERSION_FILE = re.compile(r"^([^.]+)\.([^.]+)\.(\d{6})\.(avro|avsc)$")
MAX_VERSION = 999_999
NAME_MAX = 255
SHORTENED = "~"  # in a shortened name only: encode_identifier never writes it
# The longest suffixes a stem gets: ".000001.avsc.tmp" in avro/, and
# ".20261121T093000-123456Z.dump.tmp" in dump/ (the lock, partial, progress and chunk files
# of a dump have shorter ones).
AVRO_STEM_MAX = NAME_MAX - len(".000001.avsc.tmp")
DUMP_STEM_MAX = NAME_MAX - len(".20261121T093000-123456Z.dump.tmp")
_PART_MAX = (DUMP_STEM_MAX - 1) // 2  # each name of a shortened stem
_DIGEST = 24  # hex digits of SHA-256 (96 bits)


def encode_identifier(name: str) -> str:
    out = []
    for ch in name:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"@{b:04x}" for b in _utf16_units(ch))
    return "".join(out)


def _utf16_units(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


def short_identifier(name: str) -> str:
    """``name`` encoded, or when that is longer than a shortened stem's part, its first
    characters, ``~`` and a digest of the whole name."""
    encoded = encode_identifier(name)
    if len(encoded) <= _PART_MAX:
        return encoded
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    head = encoded[:_PART_MAX - _DIGEST - 1]
    head = head[:head.rfind("@")] if "@" in head[-4:] else head  # no escape cut in two
    return f"{head}{SHORTENED}{digest}"


def is_shortened(encoded: str) -> bool:
    return SHORTENED in encoded


def decode_identifier(encoded: str) -> str:
    units = bytearray()
    out: list[str] = []
    pos = 0
    for m in _ESCAPE.finditer(encoded):
        if m.start() != pos:
            out.append(units.decode("utf-16-be"))
            units.clear()
            out.append(encoded[pos : m.start()])
        units += int(m[1], 16).to_bytes(2, "big")
        pos = m.end()
    out.append(units.decode("utf-16-be"))
    out.append(encoded[pos:])
    return "".join(out)


def avro_stem(table: TableName) -> str:
    """The table's files in avro/ are named ``<stem>.NNNNNN.avro``/``.avsc``."""
    return _stem(table, AVRO_STEM_MAX)


def dump_stem(table: TableName) -> str:
    """The table's files in dump/ are named ``<dump_stem>.<time>.dump`` (and ``.lock``,
    ``.partial``...)."""
    return _stem(table, DUMP_STEM_MAX)


def _stem(table: TableName, limit: int) -> str:
    plain = f"{encode_identifier(table.database)}.{encode_identifier(table.table)}"
    if len(plain) <= limit:
        return plain
    return f"{short_identifier(table.database)}.{short_identifier(table.table)}"


def version_file(table: TableName, version: int, suffix: str) -> str:
    """``<stem>.NNNNNN.<suffix>``: a version's file name in avro/."""
    if not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version {version} out of range 1..{MAX_VERSION}")
    return f"{avro_stem(table)}.{version:06d}.{suffix}"


def parse_version_file(name: str) -> tuple[TableName | None, int, str] | None:
    """``db.t.000003.avro`` -> (TableName('db', 't'), 3, 'avro'); None for other names. The
    table is None when the name is shortened: the file's schema names it."""
    m = _VERSION_FILE.match(name)
    if m is None:
        return None
    return table_of_stem(m[1], m[2]), int(m[3]), m[4]


def table_of_stem(database: str, table: str) -> TableName | None:
    """The table an encoded stem's two parts name; None if either is shortened."""
    if is_shortened(database) or is_shortened(table):
        return None
    return TableName(decode_identifier(database), decode_identifier(table))
