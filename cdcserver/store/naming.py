"""File names in the data directory.

MaxScale names a table version ``<db>.<table>.<NNNNNN>.avro`` (six-digit, zero-padded). MariaDB
identifiers may contain dots, slashes or any Unicode character, which would make such a name
ambiguous or escape the directory. A character outside ``[A-Za-z0-9_$-]`` is therefore written as
``@`` and four hex digits, the way MariaDB names its own table files (``@002e`` for ``.``), so an
ordinary name maps to itself and every name maps back exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAFE = re.compile(r"[A-Za-z0-9_$-]")
_ESCAPE = re.compile(r"@([0-9a-f]{4})")
_VERSION_FILE = re.compile(r"^([^.]+)\.([^.]+)\.(\d{6})\.(avro|avsc)$")
MAX_VERSION = 999_999


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


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    database: str
    table: str

    @property
    def stem(self) -> str:
        return f"{encode_identifier(self.database)}.{encode_identifier(self.table)}"

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``db.table`` (``str()``'s inverse); ValueError without both parts."""
        database, dot, table = text.partition(".")
        if not dot or not database or not table:
            raise ValueError(f"expected DB.TABLE, not {text!r}")
        return cls(database, table)

    def file_name(self, version: int, suffix: str) -> str:
        if not 1 <= version <= MAX_VERSION:
            raise ValueError(f"version {version} out of range 1..{MAX_VERSION}")
        return f"{self.stem}.{version:06d}.{suffix}"


def parse_version_file(name: str) -> tuple[TableName, int, str] | None:
    """``db.t.000003.avro`` -> (TableName('db', 't'), 3, 'avro'); None for other names."""
    m = _VERSION_FILE.match(name)
    if m is None:
        return None
    return TableName(decode_identifier(m[1]), decode_identifier(m[2])), int(m[3]), m[4]
