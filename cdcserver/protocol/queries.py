"""What sessions read, and the reads that must not run on the event loop.

A :class:`SessionContext` is shared by every connection of one listener. A session never
blocks: where a command needs the dump files, the index (SQLite) or the source, it returns a
typed query (:data:`Query`) holding everything the read needs. The connection runs the
query's ``fetch`` in a thread and hands the result back to the session
(``Session.answered``), on the event loop, where the reply is made and the session's state
changes. ``fetch`` reads; it never touches a session.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.files import DumpInfo, list_dumps
from cdcserver.protocol.requests import StreamRequest
from cdcserver.protocol.scram import LoginSecret
from cdcserver.protocol.throttle import FailureLog, LoginThrottle
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.index import StoreIndex
from cdcserver.store.transactionlog import RangePlan, TransactionInfo
from mariadb_cdc_client.format.wire import Dialect, DumpRequest, RangeQuery

log = logging.getLogger("cdcserver.protocol.session")


class DumpControl(Protocol):
    """The service's dumps, as sessions start and watch them (cdcserver.dump.scheduler)."""

    def resolve(self, refs: list[tuple[str, str | None]]) -> list[TableName]:
        """The tables that ``db.table`` and ``db.*`` (None) name on the source (blocking)."""

    def request(self, tables: list[TableName]) -> list[TableName]:
        """Queue dumps; the tables queued now."""

    def listed(self) -> list[dict[str, object]]:
        """The dumps queued, running, or failed lately."""


@dataclass
class SessionContext:
    """What sessions read: shared by every connection of one server."""

    catalog: Catalog
    users: UsersFile
    index: Callable[[], StoreIndex | None]
    data_dir: str | None = None  # where dumps are; None: no dumps
    # Waits until the service has stored every transaction up to a GTID state.
    caught_up: Callable[[GtidState], Awaitable[None]] | None = None
    # The GTID state of everything stored so far (what a bounded read can end at).
    stored_state: Callable[[], GtidState] | None = None
    # The JSON dialect of a client that does not ask for one and whose user has none.
    dialect: Dialect = Dialect.MAXSCALE
    login_failures: int = 0  # counted for the metrics
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    failures: FailureLog = field(default_factory=lambda: FailureLog(log.warning))
    dumps: DumpControl | None = None  # None: no dumps on request
    # What the service captures: nothing else is served, even if stored by an earlier version
    capture: CaptureFilter = EVERY_USER_TABLE
    # What the SCRAM verifiers of unknown names come from (the service's is kept in its
    # data directory, so that they are the same after a restart)
    login_secret: LoginSecret = field(default_factory=LoginSecret)

    def dumps_of(self, table: TableName | None) -> list[DumpInfo]:
        """The complete dumps of a table (None: of every table), oldest first."""
        return list_dumps(self.data_dir, table) if self.data_dir is not None else []

    def stored(self) -> GtidState:
        return self.stored_state() if self.stored_state is not None else GtidState()


# -- the queries: each reads, off the event loop, what one command needs --------------------


@dataclass(frozen=True)
class ListDumps:
    """LIST-DUMPS: the dumps of a table, or of every table."""

    table: TableName | None

    def fetch(self, context: SessionContext) -> list[DumpInfo]:
        return context.dumps_of(self.table)


@dataclass(frozen=True)
class FindDump:
    """REQUEST-DUMP: the dumps the request may name (its table's, or every table's)."""

    request: DumpRequest

    def fetch(self, context: SessionContext) -> list[DumpInfo]:
        named = self.request.table
        return context.dumps_of(TableName(*named) if named is not None else None)


@dataclass(frozen=True)
class DumpedTable:
    """REQUEST-DATA of a table nothing of which is stored yet: whether a dump of it exists
    (its stream then starts with the table's first change)."""

    request: StreamRequest

    def fetch(self, context: SessionContext) -> list[DumpInfo]:
        return context.dumps_of(self.request.table)


@dataclass(frozen=True)
class ResolveTables:
    """START-DUMP: the tables ``db.table`` and ``db.*`` name on the source (or why that
    cannot be said)."""

    refs: tuple[tuple[str, str | None], ...]  # None: every table of the database

    def fetch(self, context: SessionContext) -> list[TableName] | CdcError:
        assert context.dumps is not None
        try:
            return context.dumps.resolve(list(self.refs))
        except CdcError as exc:
            return exc


@dataclass(frozen=True)
class LookupTransaction:
    """QUERY-TRANSACTION (``gtid``) or QUERY-LAST-TRANSACTION (None), among the transactions
    that changed ``tables`` (None: any table)."""

    gtid: Gtid | None
    tables: frozenset[TableName] | None

    def fetch(self, context: SessionContext) -> TransactionInfo | None:
        index = context.index()
        if index is None:
            return None
        if self.gtid is not None:
            return index.transaction(self.gtid)
        if self.tables is None:
            return index.last_transaction
        return index.last_transaction_of(set(self.tables)) if self.tables else None


@dataclass(frozen=True)
class StateOf:
    """QUERY-STATE: the stored state, or (``tables``) that of their newest transactions."""

    tables: frozenset[TableName] | None

    def fetch(self, context: SessionContext) -> GtidState:
        state = context.stored()
        if self.tables is None:
            return state
        index = context.index()
        return index.state_of(set(self.tables), state) if index is not None and self.tables \
            else GtidState()


@dataclass(frozen=True)
class PlanRange:
    """QUERY-RANGE: where a bounded read of a table holding at most ``query.limit`` records
    can end."""

    query: RangeQuery
    after: GtidState
    until: GtidState | None
    # the tables the user may read, when not every one: the plan ends within the state of
    # their newest transactions (QUERY-STATE's), telling nothing of the others' later ones
    readable: frozenset[TableName] | None = None

    def fetch(self, context: SessionContext) -> RangePlan:
        index = context.index()
        stored = context.stored()
        if self.readable is not None and index is not None:
            stored = index.state_of(set(self.readable), stored) if self.readable \
                else GtidState()
        if self.until is not None:
            stored = stored.minimum(self.until) if index is None else \
                index.earliest(stored, self.until)
        if index is None:
            return RangePlan(self.after, 0, None)
        return index.plan_range(TableName(self.query.database, self.query.table), self.after,
                                stored, self.query.limit)


Query = ListDumps | FindDump | DumpedTable | ResolveTables | LookupTransaction | StateOf | \
    PlanRange
QUERIES = (ListDumps, FindDump, DumpedTable, ResolveTables, LookupTransaction, StateOf,
           PlanRange)  # for isinstance
