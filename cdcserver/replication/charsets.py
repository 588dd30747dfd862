"""MariaDB/MySQL character sets as Python codecs.

The table map names each character column's collation by number; the replicator asks the
server for its collation table once (``information_schema.COLLATIONS``) and resolves names here.
A character set with no Python codec stops replication with a clear error rather than guessing.
"""

from __future__ import annotations

import codecs

# MariaDB's and MySQL's "latin1" is Windows-1252, except that the five bytes cp1252 leaves
# undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D) map to the C1 controls U+0081...
# (strings/ctype-latin1.c).
_LATIN1_TABLE = "".join(
    bytes([b]).decode("cp1252", errors="replace").replace("\ufffd", chr(b)) for b in range(256)
)
_LATIN1_ENCODING = codecs.charmap_build(_LATIN1_TABLE)


def _latin1_decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
    return codecs.charmap_decode(data, errors, _LATIN1_TABLE)


def _latin1_encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
    return codecs.charmap_encode(text, errors, _LATIN1_ENCODING)


def _search(name: str) -> codecs.CodecInfo | None:
    if name == "mariadb_latin1":
        return codecs.CodecInfo(_latin1_encode, _latin1_decode,  # type: ignore[arg-type]
                                name="mariadb_latin1")
    return None


codecs.register(_search)

# Server character set name -> Python codec.
CODECS: dict[str, str] = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "latin1": "mariadb_latin1",
    "ascii": "ascii",
    "latin2": "iso8859_2",
    "latin5": "iso8859_9",
    "latin7": "iso8859_13",
    "greek": "iso8859_7",
    "hebrew": "iso8859_8",
    "cp1250": "cp1250",
    "cp1251": "cp1251",
    "cp1256": "cp1256",
    "cp1257": "cp1257",
    "cp850": "cp850",
    "cp852": "cp852",
    "cp866": "cp866",
    "cp932": "cp932",
    "koi8r": "koi8_r",
    "koi8u": "koi8_u",
    "macce": "mac_latin2",
    "macroman": "mac_roman",
    "sjis": "shift_jis",
    "ujis": "euc_jp",
    "eucjpms": "euc_jp",
    "euckr": "euc_kr",
    "gb2312": "gb2312",
    "gbk": "gbk",
    "gb18030": "gb18030",
    "big5": "big5",
    "tis620": "tis_620",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
}

BINARY = "binary"


def codec_for(charset_name: str) -> str | None:
    """The Python codec of a server character set; None for ``binary``."""
    if charset_name == BINARY:
        return None
    try:
        return CODECS[charset_name]
    except KeyError:
        raise LookupError(f"character set {charset_name!r} has no Python codec") from None


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
