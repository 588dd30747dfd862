"""The session state machine in memory, verb by verb: no socket, no event loop for the verbs.

A real store (synthetic changes, as in test_listener.py) and a real users file under tmp_path;
each test feeds messages to ``Session.receive`` and checks the outcome it returns. Work that
reads files or the index comes back as a typed query (the connection runs its ``fetch`` in a
thread and hands the result back with ``Session.answered``); here both run directly. The
socket tests (test_listener.py) check the same verbs end to end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from cdcserver.core.changes import Begin, Commit, Rows, RowsKind
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.protocol.outcomes import Outcome, Phase, Reply, SendDump, StartStream
from cdcserver.protocol.queries import QUERIES, ListDumps, LookupTransaction, SessionContext
from cdcserver.protocol.session import Session
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.store import AvroStore
from mariadb_cdc_client.format.wire import Dialect, Format, auth_message
from tests.helpers import PASSWORD, USER
from tests.unit.test_listener import LAYOUT


@pytest.fixture
def context(tmp_path: os.PathLike[str]) -> Iterator[SessionContext]:
    path = str(tmp_path)
    catalog = Catalog(os.path.join(path, "avro"))
    store = AvroStore(path, catalog)
    store.open()
    for sequence in (1, 2):
        gtid = Gtid(0, 1, sequence)
        store.apply_now([Begin(gtid, 1700000000 + sequence),
                         Rows(LAYOUT, RowsKind.INSERT, 1700000000 + sequence, [(sequence, "x")]),
                         Commit(BinlogPosition(GtidState([gtid]), "b.000001", 100 * sequence),
                                0)])
    users = UsersFile(os.path.join(path, "cdcusers"))
    users.add(USER, PASSWORD)
    users.add("narrow", "secret", "other.*")
    yield SessionContext(catalog, users, lambda: store.index, path,
                         stored_state=lambda: GtidState.parse("0-1-2"))
    store.close()


def _outcome(session: Session, message: bytes) -> Outcome | None:
    outcome = session.receive(message)
    while isinstance(outcome, QUERIES):
        outcome = session.answered(outcome, outcome.fetch(session.context))
    return outcome


def _reply(session: Session, message: bytes) -> bytes:
    outcome = _outcome(session, message)
    assert isinstance(outcome, Reply), outcome
    return outcome.data


def _ready(context: SessionContext, user: str = USER, password: str = PASSWORD,
           kind: str = "JSON") -> Session:
    session = Session(context, "10.0.0.1:5000")
    assert _reply(session, auth_message(user, password)) == b"OK\n"
    assert _reply(session, f"REGISTER UUID=t1, TYPE={kind}\n".encode()) == b"OK\n"
    assert session.phase == Phase.READY
    return session


def test_login_and_registration(context):
    session = Session(context, "10.0.0.1:5000")
    assert _reply(session, auth_message(USER, "wrong")).startswith(b"ERR AUTH-FAILED")
    assert session.phase == Phase.AUTH and context.login_failures == 1
    assert _reply(session, auth_message(USER, PASSWORD)) == b"OK\n"
    assert _reply(session, b"REQUEST-DATA shop.items\n").startswith(b"ERR NOT-REGISTERED")
    assert _reply(session, b"REGISTER UUID=a, TYPE=AVRO\n") == b"OK\n"
    assert session.format == Format.AVRO


def test_request_data_is_parsed_once_into_typed_fields(context):
    session = _ready(context)
    outcome = _outcome(session, b"REQUEST-DATA shop.items AFTER 0-1-1 UNTIL 0-1-2\n")
    assert isinstance(outcome, StartStream) and session.phase == Phase.STREAMING
    request = outcome.request
    assert request.table == TableName("shop", "items") and request.version is None
    assert request.after is not None and request.after.given == GtidState.parse("0-1-1")
    assert request.until is not None and request.until.stored == GtidState.parse("0-1-2")
    seek = _outcome(_ready(context), b"REQUEST-DATA shop.items.000001 0-1-2\n")
    assert isinstance(seek, StartStream) and seek.request.seek == Gtid(0, 1, 2)
    assert seek.request.version == 1


@pytest.mark.parametrize(("command", "error"), [
    (b"REQUEST-DATA shop.nothing\n", b"ERR NO-FILE"),
    (b"REQUEST-DATA shop.items.000009\n", b"ERR NO-FILE"),
    (b"REQUEST-DATA shop.items AFTER 0-1-x\n", b"ERR BAD-SYNTAX"),
    (b"REQUEST-DATA shop.items UNTIL tomorrow\n", b"ERR BAD-SYNTAX"),
    (b"QUERY-RANGE shop.items AFTER 1-2 LIMIT 5\n", b"ERR BAD-SYNTAX"),
    (b"QUERY-TRANSACTION 0-1-99\n", b"ERR NO-TRANSACTION"),
    (b"QUERY-TRANSACTION nonsense\n", b"ERR BAD-SYNTAX"),
    (b"REQUEST-DUMP shop.items\n", b"ERR NO-FILE"),
    (b"NOPE\n", b"ERR UNKNOWN-COMMAND"),
])
def test_bad_requests_get_their_error_and_keep_the_session(context, command, error):
    session = _ready(context)
    assert _reply(session, command).startswith(error)
    assert session.phase == Phase.READY


def test_a_user_reads_only_the_tables_the_users_file_gives(context):
    session = _ready(context, "narrow", "secret")
    assert _reply(session, b"REQUEST-DATA shop.items\n").startswith(b"ERR FORBIDDEN")
    assert json.loads(_reply(session, b"LIST-TABLES\n")) == {"tables": []}
    # no transaction changed a table this user may read: there is none to tell of
    assert _reply(session, b"QUERY-LAST-TRANSACTION\n").startswith(b"ERR NO-TRANSACTION")
    assert json.loads(_reply(session, b"QUERY-STATE\n")) == {"gtid_state": ""}


def test_queries_about_transactions_and_state(context):
    session = _ready(context)
    last = json.loads(_reply(session, b"QUERY-LAST-TRANSACTION\n"))
    assert last["GTID"] == "0-1-2" and last["tables"] == ["shop.items"]
    # it takes no argument, as QUERY-STATE takes none (it took any, found by attack)
    assert _reply(session, b"QUERY-LAST-TRANSACTION extra\n") == \
        b"ERR BAD-SYNTAX QUERY-LAST-TRANSACTION takes no argument\n"
    assert session.receive(b"QUERY-TRANSACTION 0-1-1\n") == \
        LookupTransaction(Gtid(0, 1, 1), None)  # SQLite: read off the loop
    first = json.loads(_reply(session, b"QUERY-TRANSACTION 0-1-1\n"))
    assert first["GTID"] == "0-1-1" and first["events"] == 1
    assert json.loads(_reply(session, b"QUERY-STATE\n")) == {"gtid_state": "0-1-2"}
    planned = json.loads(_reply(session, b"QUERY-RANGE shop.items LIMIT 1\n"))
    assert planned["end"] == "0-1-1" and planned["events"] == 1
    assert planned["next"] == {"gtid": "0-1-2", "events": 1}


def test_listing_tables_and_dumps(context):
    session = _ready(context)
    tables = json.loads(_reply(session, b"LIST-TABLES\n"))["tables"]
    assert [(t["ref"], len(t["versions"])) for t in tables] == [("shop.items", 1)]
    assert session.receive(b"LIST-DUMPS\n") == ListDumps(None)  # reads the dump files
    assert json.loads(_reply(session, b"LIST-DUMPS\n")) == {"dumps": []}
    assert not isinstance(_outcome(session, b"REQUEST-DUMP shop.items FOLLOW\n"), SendDump)


def test_bad_command_budget_and_close(context):
    session = Session(context, "10.0.0.1:5000", bad_command_limit=2)
    assert _reply(session, auth_message(USER, PASSWORD)) == b"OK\n"
    assert _reply(session, b"REGISTER UUID=x, TYPE=JSON\n") == b"OK\n"
    first = _outcome(session, b"NOPE\n")
    assert isinstance(first, Reply) and not first.close
    second = _outcome(session, b"NOPE\n")
    assert isinstance(second, Reply) and second.close and b"ERR TOO-MANY-ERRORS" in second.data
    closing = _outcome(_ready(context), b"CLOSE\n")
    assert isinstance(closing, Reply) and closing.close and closing.data == b""


def _dialect(context: SessionContext, register: str, user: str = USER,
             password: str = PASSWORD) -> Dialect:
    session = Session(context, "10.0.0.1:5000")
    assert _reply(session, auth_message(user, password)) == b"OK\n"
    assert _reply(session, register.encode()) == b"OK\n"
    outcome = _outcome(session, b"REQUEST-DATA shop.items")
    assert isinstance(outcome, StartStream)
    return outcome.dialect


def test_a_connection_gets_its_json_dialect_from_register_then_its_user_then_the_listener(
        context):
    plain = "REGISTER UUID=t1, TYPE=JSON"
    # MaxScale's clients send nothing new: the listener's default, maxscale unless set.
    assert _dialect(context, plain) == Dialect.MAXSCALE
    assert _dialect(context, plain + ", DIALECT=EXACT") == Dialect.EXACT
    context.users.add("etl", "pw", dialect=Dialect.EXACT)  # the users file's json=exact
    assert _dialect(context, plain, "etl", "pw") == Dialect.EXACT
    assert _dialect(context, plain + ", DIALECT=maxscale", "etl", "pw") == Dialect.MAXSCALE
    context.dialect = Dialect.EXACT  # [listener] json_dialect = "exact"
    assert _dialect(context, plain) == Dialect.EXACT
    session = Session(context, "10.0.0.1:5000")
    assert _reply(session, auth_message(USER, PASSWORD)) == b"OK\n"
    assert _reply(session, b"REGISTER UUID=t1, TYPE=JSON, DIALECT=fast").startswith(
        b"ERR REGISTRATION-FAILED DIALECT must be EXACT or MAXSCALE")
