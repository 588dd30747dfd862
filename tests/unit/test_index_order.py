"""The transaction log orders transactions by when they were stored, not by sequence number,
once a domain's numbers stop growing (``gtid_strict_mode=OFF``)."""

from __future__ import annotations

import json
import sqlite3

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.store.index import StoreIndex
from cdcserver.store.transactionlog import TransactionInfo


def _log(index: StoreIndex, *gtids: str) -> list[TransactionInfo]:
    table = TableName("d", "t")
    return [index.note_transaction(TransactionInfo(Gtid.parse(g), 0, 1, (table,), "f", 4))
            for g in gtids]


def test_a_domain_whose_numbers_go_down_is_ordered_by_ordinal(tmp_path):
    index = StoreIndex(str(tmp_path / "index.sqlite"))
    _log(index, "0-1-20", "0-1-21", "1-1-5", "0-1-3", "0-2-4", "0-1-3")
    assert not index.ordered(0) and index.ordered(1)
    state = GtidState.parse("0-1-21,1-1-5")
    assert index.covers(state, Gtid.parse("0-1-20"))
    assert not index.covers(state, Gtid.parse("0-2-4"))  # a lower number, stored later
    after_low = GtidState.parse("0-2-4")
    assert index.covers(after_low, Gtid.parse("0-1-21"))  # a higher number, stored earlier
    # The duplicated 0-1-3 is the newest one; the first 0-1-3 is before 0-2-4.
    assert [i.ordinal for i in (index.transaction(Gtid.parse("0-1-3")),)] == [6]
    assert index.ordinal(Gtid.parse("0-2-4")) == 5
    index.persist()
    assert [str(i.gtid) for i in index._transactions_after(GtidState.parse("0-1-21"))] == [
        "1-1-5", "0-1-3", "0-2-4", "0-1-3"]
    assert [str(i.gtid) for i in index._transactions_after(GtidState.parse("0-2-4,1-1-5"))
            ] == ["0-1-3"]
    index.close()
    reopened = StoreIndex(str(tmp_path / "index.sqlite"))
    assert not reopened.ordered(0)
    assert reopened.last_id == 6


def test_recovery_forgets_by_ordinal_what_the_checkpoint_does_not_cover(tmp_path):
    index = StoreIndex(str(tmp_path / "index.sqlite"))
    _log(index, "0-1-20", "0-1-21", "0-1-3", "0-1-4")
    index.persist()
    # The checkpoint covered the first three; the sequence number of its state (3) is lower
    # than the first two's, which a comparison by number would have dropped.
    index.drop_transactions_after(GtidState.parse("0-1-3"), 3)
    assert [index.transaction(Gtid.parse(g)) is not None
            for g in ("0-1-20", "0-1-21", "0-1-3", "0-1-4")] == [True, True, True, False]
    assert index.last_id == 3
    assert _log(index, "0-1-4")[0].ordinal == 4


def test_an_index_of_the_previous_layout_is_migrated_in_its_order(tmp_path):
    path = str(tmp_path / "index.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE blocks (db TEXT NOT NULL, tbl TEXT NOT NULL, version INTEGER NOT NULL,
            offset INTEGER NOT NULL, domain INTEGER NOT NULL, seq INTEGER NOT NULL,
            PRIMARY KEY (db, tbl, version, domain, offset));
        CREATE TABLE transactions (domain INTEGER NOT NULL, source TEXT NOT NULL,
            seq INTEGER NOT NULL, server_id INTEGER NOT NULL, timestamp INTEGER NOT NULL,
            events INTEGER NOT NULL, tables TEXT NOT NULL, file TEXT NOT NULL,
            pos INTEGER NOT NULL, PRIMARY KEY (domain, source, seq));""")
    for seq in (7, 8, 2):
        db.execute("INSERT INTO transactions VALUES (0, '', ?, 1, 0, 1, ?, 'f', 4)",
                   (seq, json.dumps(["d.t"])))
    db.commit()
    db.close()
    index = StoreIndex(path)
    assert [index.ordinal(Gtid.parse(f"0-1-{n}")) for n in (7, 8, 2)] == [1, 2, 3]
    assert not index.ordered(0)
    assert _log(index, "0-1-9")[0].ordinal == 4


def test_an_index_of_the_second_layout_keeps_its_transactions_and_blocks(tmp_path):
    """Version 2 stored sequence numbers as they are; version 3 shifts them by -2^63 so that
    SQLite's signed INTEGER holds MariaDB's whole unsigned range, in order."""
    path = str(tmp_path / "index.sqlite")
    index = StoreIndex(path)
    index.close()
    db = sqlite3.connect(path)  # as version 2 wrote it: the same tables, numbers unshifted
    db.execute("PRAGMA user_version=2")
    db.execute("INSERT INTO blocks VALUES ('d', 't', 1, 100, 0, 5)")
    db.execute("INSERT INTO blocks VALUES ('d', 't', 1, 900, 0, 50)")
    for ordinal, seq in ((1, 5), (2, 50)):
        db.execute("INSERT INTO transactions (id, domain, source, seq, server_id, timestamp, "
                   "events, tables, file, pos) VALUES (?, 0, '', ?, 1, 0, 1, ?, 'f', 4)",
                   (ordinal, seq, json.dumps(["d.t"])))
    db.commit()
    db.close()
    index = StoreIndex(path)
    assert index.transaction(Gtid.parse("0-1-50")).ordinal == 2
    assert index.seek_offset(TableName("d", "t"), 1, 0, 51) == 900
    assert index.seek_offset(TableName("d", "t"), 1, 0, 6) == 100
    big = _log(index, f"0-1-{2**64 - 1}")[0]  # past what version 2 could store
    index.persist()
    assert index.transaction(Gtid.parse(f"0-1-{2**64 - 1}")).ordinal == big.ordinal == 3
    index.close()
    assert StoreIndex(path).last_transaction.gtid.sequence == 2**64 - 1
