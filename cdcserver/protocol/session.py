"""One client's protocol state machine, with no I/O.

``Session.receive(message)`` takes one framed message and returns what to do: a reply (and
whether to hang up afterwards), a stream to start, a dump to send, or a typed query
(:mod:`cdcserver.protocol.queries`: listing dump files, querying the index) that the
connection runs off the event loop and hands back with ``Session.answered``, which returns
one of the others. The session's state changes only in these two calls, on the event loop.
The phases are MaxScale's: authenticate, register, then commands. Verbs are methods named
``verb_<VERB>`` (``-`` becomes ``_``), found by name; ``receive`` alone does the checks
before dispatch (phase, unknown verb, the budget of bad commands). The connection task in
:mod:`cdcserver.protocol.server` owns the socket and executes the outcomes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cdcserver.core.config import ListenerConfig
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.files import DumpInfo
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
from cdcserver.protocol.scram import MECHANISM, ScramFailed, ServerExchange
from cdcserver.protocol.stream import quarantined
from cdcserver.protocol.throttle import Turn, shown_name
from cdcserver.store.transactionlog import RangePlan, TransactionInfo
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import (
    MAX_USER_NAME,
    OK,
    Code,
    DataRequest,
    Dialect,
    Format,
    ProtocolError,
    auth_incomplete,
    parse_auth,
    parse_list_dumps,
    parse_query_range,
    parse_register,
    parse_request_data,
    parse_request_dump,
    parse_start_dump,
    split_command,
)

log = logging.getLogger(__name__)
SCRAM_VERB = "AUTH "  # then the mechanism and the client-first-message


class Phase(StrEnum):
    AUTH = "auth"
    REGISTER = "register"
    READY = "ready"
    STREAMING = "streaming"
    CLOSED = "closed"


@dataclass(frozen=True)
class Reply:
    data: bytes
    close: bool = False


@dataclass(frozen=True)
class StartStream:
    request: StreamRequest
    format: Format
    dialect: Dialect = Dialect.MAXSCALE  # JSON mode


@dataclass(frozen=True)
class SendDump:
    """Send a dump file; then, with ``follow``, stream the changes after it."""

    dump: DumpInfo
    follow: StreamRequest | None
    format: Format
    dialect: Dialect = Dialect.MAXSCALE  # JSON mode
    databus: bool = False  # in mysql-databus's layout (cdcserver.dump.databus)


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (without blocking other connections), then take ``then``'s outcome."""

    seconds: float
    then: Callable[[], Reply]


Outcome = Reply | StartStream | SendDump | Query | Delay


class Session:
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
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            return self._bad(ProtocolError(Code.BAD_SYNTAX, "commands must be UTF-8 text"))
        if not text.strip():
            return None
        try:
            if self.phase == Phase.AUTH:
                if self._scram is not None:
                    return self._scram_final(self._scram, text.strip())
                if text.startswith(SCRAM_VERB):
                    return self._scram_first(text[len(SCRAM_VERB):].strip())
                return self._authenticate(message)
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
        text = str(exc)  # it may quote a command of up to max_line bytes: cut for the log
        log.info("%s: %s", self.peer, text if len(text) <= 300 else
                 f"{text[:300]}... ({len(text) - 300} more characters)")
        if exc.fatal:
            return Reply(exc.reply(), close=True)
        if self.bad_commands >= self.bad_command_limit:
            return Reply(exc.reply() + ProtocolError(
                Code.TOO_MANY_ERRORS, f"{self.bad_commands} bad commands; closing").reply(),
                close=True)
        return Reply(exc.reply())

    # -- phases --------------------------------------------------------------------------

    def _authenticate(self, message: bytes) -> Outcome:
        host = self.peer.rpartition(":")[0] or self.peer
        user, digest = parse_auth(message)
        known = self.context.users.exists(user)
        turn = self.context.throttle.turn(host, user, digest, known)
        if turn.refused:
            raise ProtocolError(Code.THROTTLED, f"too many new passwords tried for {user!r} "
                                f"from {host}; try again in {turn.wait:.0f}s", fatal=True)
        if turn.wait:
            log.info("%s: login as %s waits %.1fs for its turn (too many new passwords "
                     "tried for it from %s)", self.peer, shown_name(user), turn.wait, host)
            return Delay(turn.wait, lambda: self._check(host, user, digest, turn, known))
        return self._check(host, user, digest, turn, known)

    def _check(self, host: str, user: str, digest: bytes, turn: Turn, known: bool) -> Reply:
        if not self.context.users.verify(user, digest):
            if self.context.users.legacy_refused(user):
                log.info("%s: %s may log in with SCRAM-SHA-256 only", self.peer,
                         shown_name(user))
            return self._failed(host, user, digest, known)
        return self._logged_in(host, user, digest, turn, OK)

    def _failed(self, host: str, user: str, digest: bytes, known: bool) -> Reply:
        self.context.failures.failed(self.peer, host, user)
        self.context.login_failures += 1
        self.context.throttle.failed(host, user, digest, known)
        return self._bad(ProtocolError(Code.AUTH_FAILED, "Authentication failed"))

    def _logged_in(self, host: str, user: str, digest: bytes, turn: Turn, reply: bytes
                   ) -> Reply:
        self.context.throttle.succeeded(host, user, turn, digest)
        self.user = user
        self.phase = Phase.REGISTER
        log.info("%s: authenticated as %s", self.peer, shown_name(user))
        return Reply(reply)

    # -- SCRAM-SHA-256 (an extension; see protocol.md) -------------------------------------

    def _scram_first(self, client_first: str) -> Reply:
        """``AUTH SCRAM-SHA-256 <client-first-message>``: the server's first message."""
        mechanism, _, client_first = client_first.partition(" ")
        if mechanism != MECHANISM:
            raise ProtocolError(Code.BAD_AUTH, f"unknown mechanism {mechanism[:40]!r}: "
                                f"{SCRAM_VERB}{MECHANISM} <client-first-message>")
        try:
            exchange = ServerExchange(client_first.strip(), self.context.users.verifier,
                                      self.context.login_secret)
        except ScramFailed as exc:
            raise ProtocolError(Code.BAD_AUTH, f"not a SCRAM client-first-message: {exc}"
                                ) from None
        if not exchange.user or len(exchange.user) > MAX_USER_NAME:
            raise ProtocolError(Code.BAD_AUTH, f"a user name has at most {MAX_USER_NAME} "
                                "characters")
        self._scram = exchange
        return Reply(f"SCRAM {exchange.server_first}\n".encode())

    def _scram_final(self, exchange: ServerExchange, client_final: str) -> Outcome:
        """The client's proof: checked after the throttle's turn, as MaxScale's login is."""
        self._scram = None
        host = self.peer.rpartition(":")[0] or self.peer
        user, attempt = exchange.user, exchange.attempt(client_final)
        known = self.context.users.exists(user)
        turn = self.context.throttle.turn(host, user, attempt, known)
        if turn.refused:
            raise ProtocolError(Code.THROTTLED, f"too many new passwords tried for {user!r} "
                                f"from {host}; try again in {turn.wait:.0f}s", fatal=True)

        def check() -> Reply:
            final = exchange.verify()
            if final is None:
                if known and not exchange.has_verifier:
                    log.info("%s: %s has no SCRAM verifier: `cdcserver users add` gives it "
                             "one", self.peer, shown_name(user))
                return self._failed(host, user, attempt, known)
            return self._logged_in(host, user, attempt, turn, f"OK {final}\n".encode())

        if turn.wait:
            log.info("%s: login as %s waits %.1fs for its turn (too many new passwords "
                     "tried for it from %s)", self.peer, shown_name(user), turn.wait, host)
            return Delay(turn.wait, check)
        return check()

    def verb_REGISTER(self, line: str) -> Outcome:
        registration = parse_register(line)
        self.client_uuid = registration.uuid
        self.format = registration.format
        assert self.user is not None
        self.dialect = (registration.dialect or self.context.users.dialect(self.user)
                        or self.context.dialect)
        self.phase = Phase.READY
        log.info("%s: registered %r, format %s%s", self.peer, registration.uuid,
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

    def verb_LIST_DUMPS(self, argument: str) -> Outcome:
        """Extension: the complete dumps, oldest first, as one JSON line."""
        parsed = parse_list_dumps(argument)
        table = TableName(*parsed) if parsed else None
        if table is not None:
            self._require_access(table)
        return ListDumps(table)

    def _list_dumps(self, query: ListDumps, found: list[DumpInfo]) -> Reply:
        table = query.table
        # "ref": the table as commands name it (protocol.md, "Table names")
        dumps = [{**d.summary(), "ref": _ref(d.table)} for d in found
                 if self._may_read(d.table)]
        listing: dict[str, object] = {"dumps": dumps}
        if self.context.dumps is not None:
            taking = [(TableName(str(p["database"]), str(p["table"])), p)
                      for p in self.context.dumps.listed()]
            listing["taking"] = [p for name, p in taking if self._may_read(name)
                                 and (table is None or name == table)]
        return Reply(json.dumps(listing, separators=(",", ":")).encode() + b"\n")

    def verb_START_DUMP(self, argument: str) -> Outcome:
        """Extension: take new dumps of tables now, while the stream goes on; one JSON line
        names those queued (``LIST-DUMPS`` shows their progress)."""
        refs = parse_start_dump(argument)
        for database, name in refs:
            if name is not None:
                self._require_access(TableName(database, name))
        if self.context.dumps is None or self.context.data_dir is None:
            raise ProtocolError(Code.NO_FILE, "this server takes no dumps on request")
        return ResolveTables(tuple(refs))

    def _start_dumps(self, query: ResolveTables, found: list[TableName] | CdcError) -> Reply:
        refs = query.refs
        control = self.context.dumps
        assert control is not None
        if isinstance(found, CdcError):
            raise ProtocolError(Code.NO_FILE, f"cannot list the tables: {found}")
        tables = [t for t in found if self._may_read(t)]
        missing = [table_ref(d, t) for d, t in refs
                   if t is not None and TableName(d, t) not in found]
        if missing:
            raise ProtocolError(Code.NO_FILE, f"no table {', '.join(missing)} on the source")
        if not tables:
            raise ProtocolError(Code.NO_FILE, "no table you may read matches "
                                + " ".join(table_ref(d, t) if t is not None else f"{d}.*"
                                           for d, t in refs))
        try:
            queued = control.request(tables)
        except CdcError as exc:
            raise ProtocolError(Code.NO_FILE, str(exc)) from None
        log.info("%s: user %r started dumps of %s", self.peer, self.user,
                 ", ".join(_ref(t) for t in queued) or "(already under way)")
        reply = {"started": [_ref(t) for t in queued],
                 "under_way": [_ref(t) for t in tables if t not in queued]}
        return Reply(json.dumps(reply, separators=(",", ":")).encode() + b"\n")

    def verb_REQUEST_DUMP(self, argument: str) -> Outcome:
        """Extension: send a dump (by name, or a table's newest), then optionally follow."""
        request = parse_request_dump(argument)
        return FindDump(request)

    def _send_dump(self, query: FindDump, found: list[DumpInfo]) -> SendDump:
        request = query.request
        named = request.table
        if named is not None:
            dump = found[-1] if found else None
        else:
            dump = next((d for d in found if d.name == request.target), None)
        if dump is None or not self._may_read(dump.table):
            if named is not None:
                self._require_access(TableName(*named))
            raise ProtocolError(Code.NO_FILE, f"no dump of {table_ref(*named)}" if named
                                else f"no dump named {request.target}")
        follow = None
        if request.follow:
            h = dump.header
            follow = stream_request(DataRequest(h.database, h.table, None, None, h.gtid or None))
            self.phase = Phase.STREAMING
        return SendDump(dump, follow, self.format, self.dialect, request.databus)

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
        return PlanRange(query, after, until)

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
