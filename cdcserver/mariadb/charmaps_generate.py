"""Generates ``charmaps.json.gz``: MariaDB's own mapping of every character of every character
set to Unicode, read from a running server.

Python's codecs differ from MariaDB's tables in many places (latin1's C1 bytes, greek, hebrew,
cp866, koi8u, eucjpms, big5's extension characters...) and have no codec at all for armscii8,
dec8, geostd8, hp8, keybcs2 and swe7. The only authority on what a byte means in a column is
the server, so the table is the server's answer for every byte sequence a character can be:

- a single-byte character set: what ``CONVERT(CONVERT(X'nn' USING cs) USING utf8mb4)`` gives
  for each of the 256 bytes (``?`` where MariaDB has no character for it, as the server does);
- a multibyte one: every sequence of one, two or three bytes the server reads as one unit
  (every byte, every pair, every triple of the bytes that lead three-byte sequences, as 0x8F
  in ujis and eucjpms), and the character it makes of each: ``?`` for a well-formed sequence
  it has no character for, which it skips as a whole, where it skips one byte of a sequence
  that is not well-formed.

The Unicode character sets (utf8mb3, utf8mb4, ucs2, utf16, utf16le, utf32) and ``binary`` are
not tabulated: they are Unicode encodings Python decodes exactly. Run against the oldest
supported server after a MariaDB upgrade adds or changes a character set::

    python -m cdcserver.mariadb.charmaps_generate --socket /run/mysqld/mysqld.sock
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pymysql

UNICODE = frozenset({"utf8mb3", "utf8mb4", "utf8", "ucs2", "utf16", "utf16le", "utf32", "binary"})
OUTPUT = Path(__file__).with_name("charmaps.json.gz")
_BATCH = 2000


def generate(conn: pymysql.connections.Connection) -> dict:
    """The tables of every tabulated character set the server has."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = cur.fetchone()[0]
        cur.execute("SELECT CHARACTER_SET_NAME, MAXLEN FROM information_schema.CHARACTER_SETS "
                    "ORDER BY CHARACTER_SET_NAME")
        charsets = [(name, int(maxlen)) for name, maxlen in cur.fetchall()
                    if name not in UNICODE]
    tables = {}
    for name, maxlen in charsets:
        tables[name] = (_single_byte(conn, name) if maxlen == 1
                        else _multibyte(conn, name, maxlen))
    return {"server": version, "charsets": tables}


def _single_byte(conn: pymysql.connections.Connection, charset: str) -> dict:
    chars = _convert(conn, charset, (bytes([b]) for b in range(256)))
    return {"maxlen": 1, "bytes": "".join(chars[bytes([b])] for b in range(256))}


def _multibyte(conn: pymysql.connections.Connection, charset: str, maxlen: int) -> dict:
    found = _units(conn, charset, [bytes([b]) for b in range(256)])
    found.update(_units(conn, charset, [bytes([a, b]) for a in range(256) for b in range(256)]))
    if maxlen >= 3:
        for lead in _triple_leads(conn, charset):
            found.update(_units(conn, charset, [bytes([lead, a, b]) for a in range(256)
                                                for b in range(256)]))
    return {"maxlen": maxlen, "chars": _rows(found)}


def _triple_leads(conn: pymysql.connections.Connection, charset: str) -> list[int]:
    """The bytes that lead three-byte sequences (0x8F in ujis and eucjpms)."""
    probes = [bytes([lead, a, b]) for lead in range(256)
              for a in (0xA1, 0xB0, 0xC8, 0xE0, 0xF4) for b in (0xA1, 0xB0, 0xC8, 0xE0, 0xF4)]
    return sorted({seq[0] for seq in _units(conn, charset, probes)})


def _units(conn: pymysql.connections.Connection, charset: str,
           sequences: list[bytes]) -> dict[bytes, str]:
    """The sequences the server reads as one unit, and the character it makes of each: a
    sequence followed by ``A`` converts to one character and then ``A``. A unit without a
    character (a well-formed sequence MariaDB has no mapping for) converts to ``?`` as a
    whole, as does a byte that is no character at all; a sequence that is not a unit
    converts to more (``?`` for its first byte, then the rest)."""
    converted = _convert(conn, charset, (seq + b"A" for seq in sequences))
    return {seq: text[0] for seq in sequences
            if len(text := converted[seq + b"A"]) == 2 and text[1] == "A"}


def _rows(found: dict[bytes, str]) -> dict[str, str]:
    """The characters by all but their last byte (hex; "" for single bytes): 256 characters,
    one for each last byte, NUL where the sequence is not a unit (a single byte always is)."""
    rows: dict[str, list[str]] = {}
    for seq, char in found.items():
        rows.setdefault(seq[:-1].hex(), ["\0"] * 256)[seq[-1]] = char
    return {prefix: "".join(row) for prefix, row in sorted(rows.items())}


def _convert(conn: pymysql.connections.Connection, charset: str,
             sequences: Iterable[bytes]) -> dict[bytes, str]:
    """What the server makes of each byte sequence in ``charset``, as Unicode text."""
    out: dict[bytes, str] = {}
    for batch in _batches(sequences):
        convert = f"CONVERT(CONVERT(X'%s' USING {charset}) USING utf8mb4)"
        query = "SELECT " + ", ".join(convert % seq.hex() for seq in batch)
        with conn.cursor() as cur:
            cur.execute(query)
            out.update(zip(batch, cur.fetchone(), strict=True))
    return out


def _batches(sequences: Iterable[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for seq in sequences:
        batch.append(seq)
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", help="the server's Unix socket")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--user", default="root")
    parser.add_argument("--password", default="")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    conn = pymysql.connect(unix_socket=args.socket, host=args.host, port=args.port,
                           user=args.user, password=args.password, charset="utf8mb4",
                           autocommit=True)
    try:
        data = generate(conn)
    finally:
        conn.close()
    text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    args.output.write_bytes(gzip.compress(text.encode(), mtime=0))
    sys.stdout.write(f"{args.output}: {len(data['charsets'])} character sets of "
                     f"{data['server']}\n")


if __name__ == "__main__":
    main()
