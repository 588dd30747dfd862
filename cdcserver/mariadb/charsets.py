"""MariaDB/MySQL character sets as Python codecs, with MariaDB's own mappings.

The table map names each character column's collation by number; the replicator asks the
server for its collation table once (``information_schema.COLLATIONS``) and resolves names here.

A value must come out as the character the server means, which is what
``CONVERT(col USING utf8mb4)`` gives, not what a Python codec of a similar name makes of the
bytes: Python's tables differ from MariaDB's for latin1's C1 bytes, greek, hebrew, cp866,
koi8u, eucjpms, big5's extension characters and more, and Python has no codec at all for
armscii8, dec8, geostd8, hp8, keybcs2 or swe7. So every character set that is not a Unicode
encoding is decoded by MariaDB's table, generated from the server and shipped as
``charmaps.json.gz`` (``charmaps_generate.py`` says how); each registers as the Python codec
``mariadb_<name>``. A sequence the table has no character for decodes as ``?``, as the server
converts it; decoding never fails.

Speed: a single-byte set decodes through ``codecs.charmap_decode`` (C); a multibyte one through
the Python codec of the same encoding where that agrees with MariaDB's table on every sequence
(checked when first used), else by the table.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

_DATA = Path(__file__).with_name("charmaps.json.gz")
_PREFIX = "mariadb_"

# Python codecs that may decode a multibyte set exactly as MariaDB does (checked, not assumed).
_PYTHON_CANDIDATES = {
    "big5": "big5", "cp932": "cp932", "eucjpms": "euc_jp", "euckr": "cp949",
    "gb2312": "gb2312", "gbk": "gbk", "sjis": "shift_jis", "ujis": "euc_jp",
}

# The Unicode encodings, which Python decodes as MariaDB does; ucs2 is MariaDB's own.
UNICODE_CODECS: dict[str, str] = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "ucs2": "mariadb_ucs2",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
}

BINARY = "binary"


@cache
def _tables() -> dict[str, Any]:
    with gzip.open(_DATA, "rt", encoding="utf-8") as f:
        return json.load(f)["charsets"]


def codec_for(charset_name: str) -> str | None:
    """The Python codec of a server character set; None for ``binary``."""
    if charset_name == BINARY:
        return None
    if charset_name in UNICODE_CODECS:
        return UNICODE_CODECS[charset_name]
    if charset_name in _tables():
        return _PREFIX + charset_name
    raise LookupError(f"character set {charset_name!r} is not one this service knows; "
                      "regenerate cdcserver/mariadb/charmaps.json.gz from the source "
                      "(python -m cdcserver.mariadb.charmaps_generate)")


def single_byte_table(codec: str) -> str | None:
    """The 256 characters of a single-byte set's codec (``codec_for``'s name), or None."""
    name = codecs.lookup(codec).name
    if not name.startswith(_PREFIX):
        return None
    table = _tables().get(name[len(_PREFIX):])
    return table["bytes"] if table is not None and table["maxlen"] == 1 else None


# -- single-byte character sets ------------------------------------------------------------


def _single_byte_codec(name: str, table: str) -> codecs.CodecInfo:
    encoding: dict[int, int] = {}
    for byte in reversed(range(256)):  # the lowest byte of a character wins ("?" is 0x3F)
        encoding[ord(table[byte])] = byte

    def decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
        return codecs.charmap_decode(data, errors, table)

    def encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
        return codecs.charmap_encode(text, errors, encoding)

    return codecs.CodecInfo(encode, decode, name=name)  # type: ignore[arg-type]


# -- multibyte character sets --------------------------------------------------------------


class _MultibyteTable:
    """MariaDB's characters of one multibyte set: by all bytes but the last, then the last."""

    def __init__(self, rows: dict[str, str]) -> None:
        self.rows = {bytes.fromhex(prefix): row for prefix, row in rows.items()}
        self.chars: dict[bytes, str] = {}
        for prefix, row in self.rows.items():
            for last, char in enumerate(row):
                if char != "\0" or (not prefix and last == 0):
                    self.chars[prefix + bytes([last])] = char
        self.singles = self.rows[b""]
        self.encoding = {c: seq for seq, c in sorted(self.chars.items(), reverse=True)}
        self.ascii_safe = self.singles[:128] == "".join(map(chr, range(128)))
        leads3 = {p[0] for p in self.rows if len(p) == 2}
        leads2 = {p[0] for p in self.rows if len(p) == 1}
        self.tokens = re.compile(
            (b"[" + _byte_class(leads3) + b"][\\x00-\\xff]{2}|" if leads3 else b"")
            + (b"[" + _byte_class(leads2) + b"][\\x00-\\xff]|" if leads2 else b"")
            + b"[\\x00-\\xff]", re.DOTALL)

    def decode(self, data: bytes) -> str:
        if self.ascii_safe and data.isascii():
            return data.decode("ascii")
        tokens = self.tokens.findall(data)
        chars = self.chars
        try:
            return "".join([chars[t] for t in tokens])
        except KeyError:
            return self._decode_loose(data)

    def _decode_loose(self, data: bytes) -> str:
        """The server's way through bytes that are not all characters: the longest unit
        (``?`` for a well-formed one without a character), else ``?`` for one byte, then on."""
        out: list[str] = []
        i, n = 0, len(data)
        while i < n:
            for size in (3, 2, 1):
                char = self.chars.get(data[i:i + size]) if i + size <= n else None
                if char is not None:
                    out.append(char)
                    i += size
                    break
            else:
                out.append("?")
                i += 1
        return "".join(out)

    def disagreements(self, python_codec: str) -> dict[bytes, str | None]:
        """The sequences the Python codec decodes otherwise than MariaDB, and what Python
        makes of each (None: rejects it): every byte, every pair, every triple of this
        table's three-byte prefixes."""
        leads = [bytes([b]) for b in range(256)]
        prefixes = [b""] + leads + [p for p in self.rows if len(p) == 2]
        out: dict[bytes, str | None] = {}
        for prefix in prefixes:
            for last in range(256):
                seq = prefix + bytes([last])
                try:
                    text: str | None = seq.decode(python_codec)
                except UnicodeDecodeError:
                    text = None
                if text is not None and len(text) > 1:
                    continue  # two characters to Python: its first byte is the difference
                if self.chars.get(seq) != text:
                    out[seq] = text
        return out


def _byte_class(values: set[int]) -> bytes:
    return b"".join(b"\\x%02x" % v for v in sorted(values))


def _multibyte_codec(name: str, charset: str, rows: dict[str, str]) -> codecs.CodecInfo:
    """Python's codec where it decodes the bytes as MariaDB does, MariaDB's table otherwise.
    Python's output tells which: a character Python gives only where the two differ (and an
    error, where Python rejects what MariaDB reads) sends the value to the table."""
    table = _MultibyteTable(rows)
    python = _PYTHON_CANDIDATES.get(charset)
    differing = table.disagreements(python) if python is not None else {}
    suspects = "".join(sorted({t for t in differing.values() if t is not None}))
    risky = re.compile("[" + re.escape(suspects) + "]") if suspects else None

    def decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
        data = bytes(data)
        if python is not None:
            try:
                text = data.decode(python)
            except UnicodeDecodeError:
                pass
            else:
                if risky is None or risky.search(text) is None:
                    return text, len(data)
        return table.decode(data), len(data)

    def encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
        out = bytearray()
        for position, char in enumerate(text):
            seq = table.encoding.get(char)
            if seq is None:
                raise UnicodeEncodeError(name, text, position, position + 1,
                                         f"{charset} has no such character")
            out += seq
        return bytes(out), len(text)

    return codecs.CodecInfo(encode, decode, name=name)  # type: ignore[arg-type]


# -- ucs2 ------------------------------------------------------------------------------------

_NOT_UCS2 = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")


def _ucs2_decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
    """MariaDB's ucs2 holds any 16-bit unit, surrogates included, each one character; a
    surrogate has no UTF-8 form (the server's CONVERT gives invalid bytes), so it becomes
    U+FFFD rather than stopping replication."""
    data = bytes(data)
    text = data.decode("utf-16-be", "surrogatepass")
    if _NOT_UCS2.search(text):
        units = (data[i:i + 2] for i in range(0, len(data) - 1, 2))
        text = "".join("\ufffd" if 0xD8 <= u[0] <= 0xDF else u.decode("utf-16-be")
                       for u in units)
    return text, len(data)


def _ucs2_encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
    return text.encode("utf-16-be", errors), len(text)


@cache
def _codec_info(name: str) -> codecs.CodecInfo | None:
    if not name.startswith(_PREFIX):
        return None
    charset = name[len(_PREFIX):]
    if charset == "ucs2":
        return codecs.CodecInfo(_ucs2_encode, _ucs2_decode, name=name)  # type: ignore[arg-type]
    table = _tables().get(charset)
    if table is None:
        return None
    if table["maxlen"] == 1:
        return _single_byte_codec(name, table["bytes"])
    return _multibyte_codec(name, charset, table["chars"])


codecs.register(_codec_info)


class CollationTable:
    """Collation id -> character set name, as the connected server defines it."""

    def __init__(self, names_by_id: dict[int, str]) -> None:
        self._names = dict(names_by_id)
        self._names.setdefault(63, BINARY)

    def charset(self, collation_id: int) -> str:
        try:
            return self._names[collation_id]
        except KeyError:
            raise LookupError(f"unknown collation id {collation_id}") from None

    @classmethod
    def defaults(cls) -> CollationTable:
        """The common ids, for decoding without a server (tests, captured binlogs)."""
        return cls({8: "latin1", 33: "utf8mb3", 45: "utf8mb4", 46: "utf8mb4", 47: "latin1",
                    48: "latin1", 63: BINARY, 83: "utf8mb3", 192: "utf8mb3", 224: "utf8mb4",
                    255: "utf8mb4", 11: "ascii", 65: "ascii", 9: "latin2", 51: "cp1251"})
