"""The index file's tables (``state/index.sqlite``), how it stores sequence numbers, and the
migrations that bring an index written by an older version to this layout.

The tables are described in :mod:`cdcserver.store.index`; the migrations run when the index is
opened (``migrate``), but for naming tables by (database, table), which needs the store's
catalog to split an older "db.table" text and runs once it is loaded (``name_tables``).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable

from cdcserver.core.names import TableName

log = logging.getLogger("cdcserver.store.index")  # as before: operators grep for it

SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS blocks (
    db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL, offset INTEGER NOT NULL,
    domain INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (db, tbl, version, domain, offset));
CREATE TABLE IF NOT EXISTS transactions (
    id INTEGER PRIMARY KEY,
    domain INTEGER NOT NULL, source TEXT NOT NULL, seq INTEGER NOT NULL, server_id INTEGER NOT NULL,
    timestamp INTEGER NOT NULL, events INTEGER NOT NULL, tables TEXT NOT NULL,
    file TEXT NOT NULL, pos INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS transactions_gtid ON transactions (domain, source, seq);
CREATE TABLE IF NOT EXISTS unordered (
    domain INTEGER NOT NULL, source TEXT NOT NULL, PRIMARY KEY (domain, source));
CREATE TABLE IF NOT EXISTS notes (
    db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL, offset INTEGER NOT NULL,
    note TEXT NOT NULL, PRIMARY KEY (db, tbl, version, offset));
CREATE TABLE IF NOT EXISTS touched (
    db TEXT NOT NULL, tbl TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (db, tbl, id));
"""
# PRAGMA user_version: 1 keyed transactions by (domain, source, seq); 2 stored sequence
# numbers as they are, which SQLite's signed 64-bit INTEGER cannot hold past 2^63-1; 3 named
# tables as "db.table" text, which two tables can share (`a.b`.c and a.`b.c`)
VERSION = 4
# Sequence numbers are MariaDB's unsigned 64-bit ones (SET gtid_seq_no takes up to 2^64-1):
# they are stored shifted by -2^63 (stored_sequence), which keeps their order in SQLite's
# signed INTEGER, and shifted back when read (sequence_of). Every reader of the file, in any
# process, goes through these two.
_SHIFT = 1 << 63
DB_MIN = -_SHIFT  # every sequence number is at or above it


def stored_sequence(sequence: int) -> int:
    return sequence - _SHIFT


def sequence_of(value: int) -> int:
    return value + _SHIFT


def migrate(db: sqlite3.Connection) -> bool:
    """Bring an index written by an older version to this layout: the transaction log of
    version 1 had no ordinals (its insertion order is kept as theirs); versions 1 and 2
    stored sequence numbers unshifted (all below 2^63, so the shift cannot overflow). False
    while tables are named as "db.table" text (versions 1 to 3: see ``name_tables``)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    columns = [r[1] for r in db.execute("PRAGMA table_info(transactions)")]
    if version >= VERSION or not columns:
        return True
    if "id" not in columns:
        _add_ordinals(db)
    if version < 3:
        db.executescript("""
            BEGIN;
            UPDATE blocks SET seq = seq + (-9223372036854775807 - 1);
            UPDATE transactions SET seq = seq + (-9223372036854775807 - 1);
            PRAGMA user_version = 3;
            COMMIT;
        """)
    return False


def name_tables(db: sqlite3.Connection, split: Callable[[str], TableName]) -> None:
    """Version 3 to 4: each transaction's tables as [database, table, null, null], and the
    ``touched`` table that finds a table's transactions."""
    log.info("the store's index names tables by (database, table) from now on: converting "
             "its transaction log (once)")
    db.executescript(SCHEMA.replace("PRAGMA journal_mode=WAL;", ""))
    db.execute("BEGIN")
    try:
        rows = db.execute("SELECT id, tables FROM transactions").fetchall()
        for ordinal, text in rows:
            names = [split(t) for t in json.loads(text)]
            db.execute("UPDATE transactions SET tables=? WHERE id=?",
                       (json.dumps([[n.database, n.table, None, None] for n in names]),
                        ordinal))
            db.executemany("INSERT OR IGNORE INTO touched VALUES (?,?,?)",
                           [(n.database, n.table, ordinal) for n in names])
        db.execute("PRAGMA user_version = 4")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _add_ordinals(db: sqlite3.Connection) -> None:
    db.executescript(f"""
        BEGIN;
        ALTER TABLE transactions RENAME TO transactions_v1;
        {SCHEMA.replace("PRAGMA journal_mode=WAL;", "")}
        INSERT INTO transactions (domain, source, seq, server_id, timestamp, events, tables,
                                  file, pos)
            SELECT domain, source, seq, server_id, timestamp, events, tables, file, pos
            FROM transactions_v1 ORDER BY rowid;
        DROP TABLE transactions_v1;
        INSERT OR IGNORE INTO unordered
            SELECT DISTINCT domain, source FROM (
                SELECT domain, source, seq, LAG(seq) OVER (PARTITION BY domain, source
                                                           ORDER BY id) AS previous
                FROM transactions) WHERE previous >= seq;
        COMMIT;
    """)
