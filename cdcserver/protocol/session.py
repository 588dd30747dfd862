"""One client's protocol state machine, with no I/O.

``Session.receive(message)`` takes one framed message and returns what to do: a reply (and
whether to hang up afterwards), a stream to start, a dump to send, or a typed query
(:mod:`cdcserver.protocol.queries`: listing dump files, querying the index) that the
connection runs off the event loop and hands back with ``Session.answered``, which returns
one of the others. The session's state changes only in these two calls, on the event loop.
The phases are MaxScale's: authenticate, register, then commands. Verbs are methods named
``verb_<VERB>`` (``-`` becomes ``_``), found by name; ``receive`` alone does the checks
before dispatch (phase, unknown verb, the budget of bad commands). The connection task in
:mod:`cdcserver.protocol.connection` owns the socket and executes the outcomes
(:mod:`cdcserver.protocol.outcomes`). The login's steps (``login.py``) and the verbs of
dumps (``dumpverbs.py``) are methods of the session from modules of their own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from cdcserver.core.config import ListenerConfig
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.files import DumpInfo
from cdcserver.protocol.dumpverbs import DumpVerbs
from cdcserver.protocol.login import SCRAM_VERB, Login
from cdcserver.protocol.outcomes import Delay, Outcome, Phase, Reply, StartStream
from cdcserver.protocol.queries import (
    DumpedTable,
    FindDump,
    ListDumps,
    LookupTransaction,
    PlanRange,
    Query,
    ResolveTables,
    SessionContext,
    StateOf,
)
from cdcserver.protocol.requests import StreamRequest, state_bound, stream_request
from cdcserver.protocol.scram import ServerExchange
from cdcserver.protocol.stream import quarantined
from cdcserver.store.transactionlog import RangePlan, TransactionInfo
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import (
    OK,
    Code,
    Dialect,
    Format,
    ProtocolError,
    auth_incomplete,
    parse_query_range,
    parse_register,
    parse_request_data,
    split_command,
)

log = logging.getLogger(__name__)

LOGGED_CHARACTERS = 300  # of a client's text in a log line: a command may have 64 KiB


def for_log(text: str) -> str:
    """``text`` as a log line quotes a client's: cut after :data:`LOGGED_CHARACTERS`, saying
    how much more there was (a long UUID or GTID state was logged whole: found by attack)."""
    if len(text) <= LOGGED_CHARACTERS:
        return text
    return f"{text[:LOGGED_CHARACTERS]}... ({len(text) - LOGGED_CHARACTERS} more characters)"

class Session(Login, DumpVerbs):
    def __init__(self, context: SessionContext, peer: str,
                 bad_command_limit: int = ListenerConfig.bad_command_limit) -> None:
        self.context = context
        self.peer = peer
        self.bad_command_limit = bad_command_limit
        self.phase = Phase.AUTH
        self.user: str | None = None
        self.client_uuid: str | None = None
        self.format = Format.JSON
        self.dialect = context.dialect
        self.bad_commands = 0
        self._scram: ServerExchange | None = None  # a SCRAM login waiting for its proof
        self._verbs: dict[str, Callable[[str], Outcome]] = {
            name[len("verb_"):].replace("_", "-"): getattr(self, name)
            for name in dir(self) if name.startswith("verb_")
        }
        self._answers: dict[type, Callable[[Any, Any], Outcome]] = {
            ListDumps: self._list_dumps, FindDump: self._send_dump,
            DumpedTable: self._dumped_table, ResolveTables: self._start_dumps,
            LookupTransaction: self._transaction, StateOf: self._state,
            PlanRange: self._plan_range,
        }

    def receive(self, message: bytes) -> Outcome | None:
        """Handle one message; None for an empty line (ignored)."""
        try:
            text: str | None = message.decode("utf-8")
        except UnicodeDecodeError:
            text = None  # a login's answer is the login's (BAD-AUTH), a command's BAD-SYNTAX
        if text is not None and not text.strip():
            return None
        try:
            if self.phase == Phase.AUTH:
                return self._login(message, text)
            if text is None:
                raise ProtocolError(Code.BAD_SYNTAX, "commands must be UTF-8 text")
            command = split_command(text)
            verb = self._verbs.get(command.verb)
            if verb is None:
                raise ProtocolError(Code.UNKNOWN_COMMAND, f"unknown command {command.verb!r}")
            if self.phase == Phase.REGISTER and command.verb not in ("REGISTER", "CLOSE"):
                raise ProtocolError(Code.NOT_REGISTERED, "send REGISTER UUID=<id>, "
                                    "TYPE=JSON|AVRO first")
            return verb(command.argument if command.verb != "REGISTER" else text)
        except ProtocolError as exc:
            return self._bad(exc)

    def _login(self, message: bytes, text: str | None) -> Outcome:
        """A message of the login phase: SCRAM's (text), else MaxScale's hex login."""
        if self._scram is not None:
            if text is None:
                raise ProtocolError(Code.BAD_AUTH, "not a SCRAM client-final-message: not "
                                    "UTF-8 text")
            return self._scram_final(self._scram, text.strip())
        if text is not None and text.startswith(SCRAM_VERB):
            return self._scram_first(text[len(SCRAM_VERB):].strip())
        return self._authenticate(message)

    def incomplete(self, message: bytes) -> bool:
        """Whether a login message that arrived without a newline is only its start: SCRAM's
        lines always end with one; MaxScale's hex login may not (see ``auth_incomplete``)."""
        if self._scram is not None:
            return True
        verb = SCRAM_VERB.encode()
        return message.startswith(verb) or verb.startswith(message) or \
            auth_incomplete(message)

    def _bad(self, exc: ProtocolError) -> Reply:
        self.bad_commands += 1
        # it may quote a command of up to max_line bytes: cut for the log
        log.info("%s: %s", self.peer, for_log(str(exc)))
        if exc.fatal:
            return Reply(exc.reply(), close=True)
        if self.bad_commands >= self.bad_command_limit:
            return Reply(exc.reply() + ProtocolError(
                Code.TOO_MANY_ERRORS, f"{self.bad_commands} bad commands; closing").reply(),
                close=True)
        return Reply(exc.reply())

    def verb_REGISTER(self, line: str) -> Outcome:
        registration = parse_register(line)
        self.client_uuid = registration.uuid
        self.format = registration.format
        assert self.user is not None
        self.dialect = (registration.dialect or self.context.users.dialect(self.user)
                        or self.context.dialect)
        self.phase = Phase.READY
        log.info("%s: registered %s, format %s%s", self.peer, for_log(repr(registration.uuid)),
                 registration.format.value, f", {self.dialect.value} JSON"
                 if registration.format == Format.JSON else "")
        return Reply(OK)

    # -- commands ------------------------------------------------------------------------

    def verb_REQUEST_DATA(self, argument: str) -> Outcome:
        parsed = parse_request_data(argument)
        table = TableName(parsed.database, parsed.table)
        self._require_access(table)
        request = stream_request(parsed)
        entry = self.context.catalog.get(table)
        if entry is None or not entry.versions:
            stopped = self.context.catalog.quarantined.get(table)
            if stopped is not None:  # quarantined before anything of it was stored
                error = quarantined(table, stopped)
                raise ProtocolError(error.code, error.message)
            # After a dump, the table may not have changed yet: wait for its first change
            # (a bounded read of it is empty).
            if not (request.after and request.version is None):
                raise self._no_file(request, f"unknown table {_ref(table)}")
            return DumpedTable(request)
        if request.version is not None and request.version not in entry.versions:
            first, last = min(entry.versions), max(entry.versions)
            stored = f"version {first:06d}" if first == last else \
                f"versions {first:06d} to {last:06d}"
            raise self._no_file(request, f"{_ref(table)} has {stored}")
        return self._start(request)

    def _dumped_table(self, query: DumpedTable, dumps: list[DumpInfo]) -> Outcome:
        if not dumps:
            raise self._no_file(query.request, f"unknown table {_ref(query.request.table)}")
        return self._start(query.request)

    def _no_file(self, request: StreamRequest, cause: str) -> ProtocolError:
        """MaxScale's reply for a version file it does not have, byte for byte; a client
        that asked for the exact dialect (this project's) also reads why, after it."""
        name = f"{_ref(request.table)}.{request.version or 1:06d}"
        message = f"File '{name}.avro' not found."
        if self.dialect is Dialect.EXACT:
            message += f" ({cause})"
        return ProtocolError(Code.NO_FILE, message)

    def _start(self, request: StreamRequest) -> StartStream:
        self.phase = Phase.STREAMING
        return StartStream(request, self.format, self.dialect)

    def answered(self, query: Query, result: Any) -> Outcome:
        """The connection ran ``query``: what to do now (a protocol error is its reply)."""
        answer = self._answers[type(query)]
        try:
            outcome = answer(query, result)
        except ProtocolError as exc:
            return self._bad(exc)
        assert not isinstance(outcome, Delay)
        return outcome

    def lost_access(self, reading: TableName | None) -> str | None:
        """Why this session must end now that the users file changed, if it must: its user
        was removed, or may no longer read the table it is being sent."""
        if self.user is None:
            return None
        if not self.context.users.exists(self.user):
            return f"user {self.user} was removed"
        if reading is not None and not self._may_read(reading):
            return f"user {self.user} may no longer read {_ref(reading)}"
        return None

    def _may_read(self, table: TableName) -> bool:
        return self.user is not None and self.context.capture.captures_table(table) and \
            self.context.users.may_read(self.user, table)

    def _require_access(self, table: TableName) -> None:
        """FORBIDDEN (the connection stays open) unless the users file lets this user read
        the table."""
        why = self.context.capture.why_not(table)
        if why is not None:
            raise ProtocolError(Code.FORBIDDEN, f"{_ref(table)} is not captured: {why}")
        if not self._may_read(table):
            log.warning("%s: user %r may not read %s", self.peer, self.user, _ref(table))
            raise ProtocolError(Code.FORBIDDEN, f"user {self.user} may not read {_ref(table)}")

    def _visible(self, info: TransactionInfo) -> bytes:
        """A transaction's reply as this user may see it: only the tables it may read (each
        as commands name it), and where it may not read them all, ``events`` up to the last
        of its records (what its own records' event numbers show). NO-TRANSACTION when it
        may read none of them."""
        readable = {t for t in info.tables if self._may_read(t)}
        if not readable:
            # the same reply as for a transaction not stored: it tells nothing of others
            raise ProtocolError(Code.NO_TRANSACTION, f"no transaction {info.gtid} in the store")
        events = info.events
        if len(readable) < len(info.tables):
            last = info.last_event_of(readable)
            events = info.events if last is None else last
        return _transaction_json(info.gtid, events, info.timestamp,
                                 [_ref(t) for t in info.tables if t in readable])

    def _readable(self) -> frozenset[TableName] | None:
        """The stored tables this user may read; None when that is every one."""
        tables = frozenset(self.context.catalog.tables)
        readable = frozenset(t for t in tables if self._may_read(t))
        return None if readable == tables else readable

    def verb_QUERY_LAST_TRANSACTION(self, argument: str) -> Outcome:
        """The newest stored transaction that changed a table this user may read."""
        if argument.strip():
            raise ProtocolError(Code.BAD_SYNTAX, "QUERY-LAST-TRANSACTION takes no argument")
        return LookupTransaction(None, self._readable())

    def _transaction(self, query: LookupTransaction, info: TransactionInfo | None) -> Reply:
        if info is None and query.gtid is not None:
            raise ProtocolError(Code.NO_TRANSACTION, f"no transaction {query.gtid} in the store")
        if info is None:
            raise ProtocolError(Code.NO_TRANSACTION, "no transaction has been replicated yet"
                                if query.tables is None else "no transaction has changed a "
                                "table you may read yet")
        return Reply(self._visible(info))

    def verb_QUERY_TRANSACTION(self, argument: str) -> Outcome:
        try:
            gtid = Gtid.parse(argument)
        except ValueError:
            raise ProtocolError(Code.BAD_SYNTAX, "expected QUERY-TRANSACTION <gtid>") from None
        return LookupTransaction(gtid, None)

    def verb_QUERY_STATE(self, argument: str) -> Outcome:
        """Extension: the GTID state of everything stored, where a bounded read can end."""
        if argument.strip():
            raise ProtocolError(Code.BAD_SYNTAX, "QUERY-STATE takes no argument")
        # Everything stored; for a user that may not read every table, the state of the
        # newest transactions of its tables within it (which ends the same reads of them,
        # and tells nothing of the other tables).
        return StateOf(self._readable())

    def _state(self, query: StateOf, state: GtidState) -> Reply:
        return Reply(json.dumps({"gtid_state": str(state)}).encode() + b"\n")

    def verb_QUERY_RANGE(self, argument: str) -> Outcome:
        """Extension: where a bounded read of a table holding at most n records can end."""
        query = parse_query_range(argument)
        self._require_access(TableName(query.database, query.table))
        after = state_bound(query.after).given if query.after else GtidState()
        until = state_bound(query.until).given if query.until else None
        return PlanRange(query, after, until, self._readable())

    def _plan_range(self, query: PlanRange, plan: RangePlan) -> Reply:
        following = None if plan.next is None else {"gtid": str(plan.next.gtid),
                                                     "events": plan.next.events}
        return Reply(json.dumps({"end": str(plan.end), "events": plan.events,
                                 "next": following}).encode() + b"\n")

    def verb_LIST_TABLES(self, argument: str) -> Outcome:
        """Extension: every stored table, with the schema of each of its versions."""
        if argument.strip():
            raise ProtocolError(Code.BAD_SYNTAX, "LIST-TABLES takes no argument")
        tables = []
        catalog = self.context.catalog.tables
        for name in sorted(catalog, key=str):
            entry = catalog[name]
            if entry.versions and self._may_read(name):
                # "ref": the table as commands name it (protocol.md, "Table names")
                versions = [entry.versions[v].schema.avsc for v in sorted(entry.versions)]
                tables.append({"database": entry.name.database, "table": entry.name.table,
                               "ref": _ref(name), "versions": versions})
        return Reply(json.dumps({"tables": tables}, separators=(",", ":")).encode() + b"\n")

    def verb_CLOSE(self, argument: str) -> Outcome:
        self.phase = Phase.CLOSED
        return Reply(b"", close=True)


def _ref(table: TableName) -> str:
    return table_ref(table.database, table.table)


def _transaction_json(gtid: Gtid, events: int, timestamp: int, tables: list[str]) -> bytes:
    """MaxScale 2.0-2.2's reply shape, on one line."""
    return json.dumps({"GTID": str(gtid), "events": events, "timestamp": timestamp,
                       "tables": tables}).encode() + b"\n"
