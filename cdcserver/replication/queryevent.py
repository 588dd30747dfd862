"""The body of a ``QUERY`` event: the statement's text, in its own character set, and its default
database; with the patterns that sort a statement into transaction control and statement-logged
data changes.

The statement's character set is the client collation in the ``Q_CHARSET_CODE`` status
variable; the status variables before it are walked by their sizes (MySQL ``log_event.cc``).
"""

from __future__ import annotations

import re

from cdcserver.mariadb.charsets import CollationTable, codec_for
from cdcserver.mariadb.constants import EventKind
from cdcserver.replication import compression
from cdcserver.replication.cursor import Cursor

STATEMENT_DML = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA)\b", re.I | re.S)
TRANSACTION_CONTROL = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT)\b", re.I)
_Q_CHARSET_CODE = 4
# Query status variable sizes, for walking to Q_CHARSET_CODE (MySQL log_event.cc).
_STATUS_SIZES = {0: 4, 1: 8, 3: 4, 4: 6, 7: 2, 8: 2, 9: 8, 10: 4, 13: 3, 16: 1, 17: 8, 18: 2,
                 19: 1, 20: 1, 128: 3, 129: 8, 130: 1}


def query_statement(kind: EventKind, body: Cursor,
                    collations: CollationTable) -> tuple[str, str]:
    """The statement and its default database."""
    body.u32()  # thread id
    body.u32()  # execution time
    db_len = body.u8()
    body.u16()  # error code
    status = body.take(body.u16())
    database = body.take(db_len).decode("utf-8")
    body.u8()
    raw = body.rest()
    if kind == EventKind.QUERY_COMPRESSED:
        raw = compression.mariadb_uncompress(raw)
    return raw.decode(_query_codec(status, collations), errors="surrogateescape"), database


def _query_codec(status: bytes, collations: CollationTable) -> str:
    """The statement's character set, from the Q_CHARSET_CODE status variable."""
    cur = Cursor(status)
    while cur.remaining() > 0:
        code = cur.u8()
        if code == _Q_CHARSET_CODE:
            client_collation = cur.u16()
            try:
                return codec_for(collations.charset(client_collation)) or "utf-8"
            except LookupError:
                return "utf-8"
        if code in (2, 5, 6):  # catalog, time zone, catalog (length-prefixed strings)
            cur.take(cur.u8() + (1 if code == 2 else 0))
        elif code == 11:  # invoker: user, host
            cur.take(cur.u8())
            cur.take(cur.u8())
        elif code in _STATUS_SIZES:
            cur.take(_STATUS_SIZES[code])
        else:
            break
    return "utf-8"

