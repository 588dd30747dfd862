"""A user sees only its tables (issue 36, items 6 and 7): the ``QUERY-*`` replies, the schemas'
``ddl.statement``, and the index that answers them, which keys tables by (database, table).

The store is fed by hand (no MariaDB): three tables, two of which ``db.table`` text cannot tell
apart (`` `a.b`.c `` and ``a.`b.c` ``), and a user ``alice`` who may read ``a.*`` only, which
holds ``a.`b.c``` and not `` `a.b`.c ``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from cdcserver.core.changes import (
    Begin,
    ColumnDef,
    Commit,
    Ddl,
    Rows,
    RowsKind,
    TableChange,
    TableLayout,
)
from cdcserver.core.config import ListenerConfig
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.server import CdcServer
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.index import StoreIndex
from cdcserver.store.store import AvroStore
from mariadb_cdc_client.format.wire import auth_message
from tests.helpers import PASSWORD, USER, RawClient


def _layout(database: str, table: str) -> TableLayout:
    return TableLayout(database, table, (
        ColumnDef("id", ColumnType.LONG, nullable=False),
        ColumnDef("v", ColumnType.VARCHAR, meta=64, charset="utf-8"),
    ), primary_key=(0,))


DOTTED_DB = _layout("a.b", "c")  # `a.b`.c: alice may not read it
DOTTED_TABLE = _layout("a", "b.c")  # a.`b.c`: alice may
OTHER = _layout("shop", "other")  # alice may not


@dataclass
class Fed:
    store: AvroStore
    server: CdcServer
    port: int
    sequence: int = 0

    async def commit(self, *changes: Rows | Ddl) -> None:
        self.sequence += 1
        gtid = Gtid(0, 1, self.sequence)
        await self.store.apply([
            Begin(gtid, 1700000000 + self.sequence), *changes,
            Commit(BinlogPosition(GtidState([gtid]), "mysql-bin.000001", 100 * self.sequence),
                   0)])
        await self.store.flush()


def _rows(layout: TableLayout, *keys: int) -> Rows:
    return Rows(layout, RowsKind.INSERT, 1700000000, [(k, f"v{k}") for k in keys])


@pytest.fixture
async def fed(tmp_path: os.PathLike[str]) -> AsyncIterator[Fed]:
    path = str(tmp_path)
    catalog = Catalog(os.path.join(path, "avro"))
    store = AvroStore(path, catalog)
    store.open()
    users = UsersFile(os.path.join(path, "cdcusers"))
    users.add(USER, PASSWORD)
    users.add("alice", "pw-a", "a.*")
    context = SessionContext(catalog, users, lambda: store.index,
                             stored_state=lambda: store.position.gtid_state)
    server = CdcServer(context, ListenerConfig(auth_timeout=5, idle_timeout=5))
    _, port = await server.start("127.0.0.1", 0)
    running = Fed(store, server, port)
    await running.commit(_rows(DOTTED_TABLE, 1))                      # 0-1-1: a.`b.c`
    await running.commit(_rows(OTHER, 1, 2), _rows(DOTTED_TABLE, 2),  # 0-1-2: both, alice's
                         _rows(OTHER, 3))                             # records are event 3
    await running.commit(_rows(DOTTED_DB, 1, 2, 3))                   # 0-1-3: `a.b`.c
    await running.commit(_rows(OTHER, 4))                             # 0-1-4: shop.other
    yield running
    await server.stop()
    store.close()


async def _ask(port: int, user: str, password: str, *commands: str) -> list[bytes]:
    client = await RawClient.connect(port)
    try:
        await client.send(auth_message(user, password))
        assert await client.line() == b"OK\n"
        await client.send(b"REGISTER UUID=v, TYPE=JSON\n")
        assert await client.line() == b"OK\n"
        replies = []
        for command in commands:
            await client.send(command.encode() + b"\n")
            replies.append(await client.line())
        return replies
    finally:
        await client.close()


async def test_query_replies_name_only_the_users_tables(fed: Fed):
    last, first, mixed, hidden, state = await _ask(
        fed.port, "alice", "pw-a", "QUERY-LAST-TRANSACTION", "QUERY-TRANSACTION 0-1-1",
        "QUERY-TRANSACTION 0-1-2", "QUERY-TRANSACTION 0-1-3", "QUERY-STATE")
    # The newest transaction alice may see is 0-1-2, not 0-1-4 (shop.other's)
    assert json.loads(last) == {"GTID": "0-1-2", "events": 3, "timestamp": 1700000002,
                                "tables": ["a.`b.c`"]}
    assert json.loads(first)["tables"] == ["a.`b.c`"] and json.loads(first)["events"] == 1
    # 0-1-2 has four records; alice's is the third: events tells no more than its own do
    assert json.loads(mixed)["events"] == 3 and json.loads(mixed)["tables"] == ["a.`b.c`"]
    # 0-1-3 changed only `a.b`.c, whose old index text was the same "a.b.c": alice is
    # told nothing,
    # exactly as for a transaction that does not exist
    assert hidden == b"ERR NO-TRANSACTION no transaction 0-1-3 in the store\n"
    assert (await _ask(fed.port, "alice", "pw-a", "QUERY-TRANSACTION 0-1-99"))[0] == \
        b"ERR NO-TRANSACTION no transaction 0-1-99 in the store\n"
    assert json.loads(state) == {"gtid_state": "0-1-2"}
    # A user who may read every table sees every transaction whole
    everything = await _ask(fed.port, USER, PASSWORD, "QUERY-LAST-TRANSACTION",
                            "QUERY-TRANSACTION 0-1-2", "QUERY-STATE")
    assert json.loads(everything[0])["GTID"] == "0-1-4"
    assert json.loads(everything[1]) == {"GTID": "0-1-2", "events": 4,
                                         "timestamp": 1700000002,
                                         "tables": ["shop.other", "a.`b.c`"]}
    assert json.loads(everything[2]) == {"gtid_state": "0-1-4"}


async def test_a_user_with_no_changed_table_is_told_of_none(fed: Fed):
    fed.server.context.users.add("bob", "pw-b", "crm.*")
    replies = await _ask(fed.port, "bob", "pw-b", "QUERY-LAST-TRANSACTION", "QUERY-STATE")
    assert replies[0].startswith(b"ERR NO-TRANSACTION")
    assert replies[1] == b'{"gtid_state": ""}\n'


async def test_query_range_counts_only_the_tables_records(fed: Fed):
    reply = (await _ask(fed.port, USER, PASSWORD, "QUERY-RANGE shop.other LIMIT 3"))[0]
    # 0-1-2 holds 3 records of shop.other (4 events in all), 0-1-4 one more
    assert json.loads(reply) == {"end": "0-1-3", "events": 3,
                                 "next": {"gtid": "0-1-4", "events": 1}}


async def test_query_range_ends_within_what_the_user_may_know(fed: Fed):
    """QUERY-RANGE's end, for a user who may not read every table, stays within the state
    of its tables' newest transactions (QUERY-STATE's, 0-1-2 for alice): before, it ran on
    to the whole store's (0-1-4), telling alice of later transactions of other tables
    (found by attack)."""
    reply, state = await _ask(fed.port, "alice", "pw-a", "QUERY-RANGE a.`b.c` LIMIT 100",
                              "QUERY-STATE")
    assert json.loads(reply) == {"end": "0-1-2", "events": 2, "next": None}
    assert json.loads(state) == {"gtid_state": "0-1-2"}
    everything = (await _ask(fed.port, USER, PASSWORD, "QUERY-RANGE a.`b.c` LIMIT 100"))[0]
    assert json.loads(everything) == {"end": "0-1-4", "events": 2, "next": None}


def test_the_index_keeps_two_tables_one_text_could_name_apart(fed: Fed):
    index = fed.store.index
    assert index is not None
    assert index.last_transaction_of({TableName("a.b", "c")}).gtid == Gtid(0, 1, 3)
    assert index.last_transaction_of({TableName("a", "b.c")}).gtid == Gtid(0, 1, 2)
    versions = fed.store.stats().versions
    assert versions[TableName("a.b", "c")] == versions[TableName("a", "b.c")] == 1


def test_an_index_of_version_3_is_converted_once(tmp_path):
    """An index written before tables were keyed by (database, table): its "db.table" texts
    are split at the dot that names a stored table."""
    path = str(tmp_path / "index.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE transactions (id INTEGER PRIMARY KEY, domain INTEGER NOT NULL,
            source TEXT NOT NULL, seq INTEGER NOT NULL, server_id INTEGER NOT NULL,
            timestamp INTEGER NOT NULL, events INTEGER NOT NULL, tables TEXT NOT NULL,
            file TEXT NOT NULL, pos INTEGER NOT NULL);
        PRAGMA user_version = 3;
    """)
    shift = -(1 << 63)
    db.execute("INSERT INTO transactions VALUES (1, 0, '', ?, 1, 5, 2, "
               "'[\"a.b.c\", \"shop.t\"]', 'f', 4)", (7 + shift,))
    db.commit()
    db.close()
    index = StoreIndex(path)
    index.name_tables(lambda text: TableName("a.b", "c") if text == "a.b.c" else
                      TableName.parse(text))
    info = index.transaction(Gtid(0, 1, 7))
    assert info is not None and info.tables == (TableName("a.b", "c"), TableName("shop", "t"))
    assert info.counts == () and info.records_of(TableName("shop", "t")) is None
    assert index.last_transaction_of({TableName("a.b", "c")}) == info
    assert index.last_transaction_of({TableName("a", "b.c")}) is None
    index.close()
    reopened = StoreIndex(path)  # converted: nothing more to do
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 4
    reopened.close()


async def test_a_schema_names_no_other_table_of_a_statement(fed: Fed):
    """``RENAME TABLE a TO b, hidden TO gone``: the version of b says only its own part."""
    renamed = Ddl("a", "RENAME TABLE `a`.`b.c` TO `a`.`d`, `shop`.`other` TO `shop`.`gone`",
                  1700000009, kind="rename", changes=(
                      TableChange("drop", "a", "b.c", note="renamed to a.d",
                                  renamed=TableName("a", "d")),
                      TableChange("create", "a", "d", _layout("a", "d"),
                                  note="renamed from a.`b.c`", renamed=TableName("a", "b.c")),
                      TableChange("drop", "shop", "other", renamed=TableName("shop", "gone")),
                      TableChange("create", "shop", "gone", _layout("shop", "gone"),
                                  renamed=TableName("shop", "other"))))
    await fed.commit(renamed)
    await fed.commit(_rows(_layout("a", "d"), 9))
    client = await RawClient.connect(fed.port)
    try:
        await client.send(auth_message("alice", "pw-a"))
        await client.line()
        await client.send(b"REGISTER UUID=v, TYPE=JSON\nREQUEST-DATA a.d\n")
        await client.line()
        schema = json.loads(await client.line())
    finally:
        await client.close()
    assert schema["ddl"]["statement"] == "RENAME TABLE `a`.`b.c` TO `a`.`d`"
    assert schema["ddl"]["renamed_from"] == "a.`b.c`"  # a reference a client can request
    assert "other" not in json.dumps(schema) and "gone" not in json.dumps(schema)
