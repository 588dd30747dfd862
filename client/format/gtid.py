"""GTID and GTID-state syntax, as commands carry them and the service stores them.

MariaDB names a transaction ``domain-server_id-sequence``; MySQL ``source_uuid:number``. A GTID
state is a comma-separated list: one MariaDB GTID per domain, or MySQL's ``uuid:1-N`` sets.

MariaDB's domain and server id are 32-bit unsigned numbers and its sequence number a 64-bit
unsigned one (``SET gtid_seq_no`` takes up to 2^64-1): every one of them is a GTID here. The
Avro records store them in MaxScale's types (``int``, ``int``, ``long``), which are signed, as
their bit patterns (:func:`stored_metadata`); everything that reads a record back turns them
into the unsigned numbers again (:func:`unsigned_metadata`).
"""

from __future__ import annotations

import re
from typing import Any

MAX_U32 = (1 << 32) - 1  # a domain or server id
MAX_U64 = (1 << 64) - 1  # a sequence number

# numbers as MariaDB reads them: leading zeros taken (its own text has none), the value checked
MARIADB_GTID = re.compile(r"^0*([0-9]{1,10})-0*([0-9]{1,10})-0*([0-9]{1,20})$")
MYSQL_GTID = re.compile(r"^([0-9a-fA-F-]{36}):([0-9]{1,20})$")
MYSQL_SET_ITEM = re.compile(r"^([0-9a-fA-F-]{36}):(?:1-)?([0-9]{1,20})$")  # stored
MYSQL_STATE_ITEM = re.compile(r"^([0-9a-fA-F-]{36}):(?:[0-9]{1,20}-)?([0-9]{1,20})$")  # asked


def in_range(domain: int, server_id: int, sequence: int) -> bool:
    return domain <= MAX_U32 and server_id <= MAX_U32 and sequence <= MAX_U64


def _mariadb(item: str) -> bool:
    m = MARIADB_GTID.match(item)
    return m is not None and in_range(int(m[1]), int(m[2]), int(m[3]))


def _mysql(item: str, pattern: re.Pattern[str]) -> bool:
    m = pattern.match(item)
    return m is not None and int(m[2]) <= MAX_U64


def is_gtid(text: str) -> bool:
    """``D-S-N`` or ``uuid:N``, each number within MariaDB's (or MySQL's) range."""
    return _mariadb(text) or _mysql(text, MYSQL_GTID)


def is_gtid_state(text: str) -> bool:
    """A non-empty comma-separated list of GTIDs (MySQL: ``uuid:N`` or ``uuid:M-N``)."""
    return bool(text) and all(_mariadb(item) or _mysql(item, MYSQL_STATE_ITEM)
                              for item in text.split(","))


def stored_metadata(domain: int, server_id: int, sequence: int) -> tuple[int, int, int]:
    """A GTID's numbers as the Avro record's signed ``int``, ``int`` and ``long`` hold them:
    their bit patterns (a number past the signed range is stored negative)."""
    return (domain - (1 << 32) if domain > 0x7FFFFFFF else domain,
            server_id - (1 << 32) if server_id > 0x7FFFFFFF else server_id,
            sequence - (1 << 64) if sequence > 0x7FFFFFFFFFFFFFFF else sequence)


def unsigned_metadata(record: dict[str, Any]) -> dict[str, Any]:
    """A record read back from Avro with its GTID's numbers unsigned again (in place)."""
    if record["domain"] < 0:
        record["domain"] &= MAX_U32
    if record["server_id"] < 0:
        record["server_id"] &= MAX_U32
    if record["sequence"] < 0:
        record["sequence"] &= MAX_U64
    return record
