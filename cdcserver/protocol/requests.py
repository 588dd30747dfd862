"""Stream requests parsed once: what a ``REQUEST-DATA`` (or a dump's ``FOLLOW``) asks for,
with its GTIDs and GTID states checked and typed.

The wire grammar (``client/format/wire.py``) splits a command into its words; this turns them
into the values the stream works with, raising ``BAD-SYNTAX`` for a state the store cannot
answer, so that a malformed request is refused before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from mariadb_cdc_client.format.wire import Code, DataRequest, ProtocolError


@dataclass(frozen=True)
class StateBound:
    """A GTID state from a request (``AFTER``, ``UNTIL``)."""

    stored: GtidState  # in the domains records are stored with
    given: GtidState  # as the client named it (what the service is waited for)


@dataclass(frozen=True)
class StreamRequest:
    table: TableName
    version: int | None
    seek: Gtid | None = None  # MaxScale's GTID: from that transaction's first record
    after: StateBound | None = None  # every transaction the state does not cover
    until: StateBound | None = None  # only transactions the state covers, then the end line
    line: str = ""  # the request as a command, for the log


MAX_STATE_DOMAINS = 1024  # GTIDs a state in a request may name (one per domain)


def state_bound(text: str) -> StateBound:
    """A GTID state as a request names it: one GTID per domain, at most
    ``MAX_STATE_DOMAINS`` of them (a client's state of thousands held memory and a check
    per commit for each: found by attack). A MySQL state may name one source UUID (its
    transactions are stored in domain 0)."""
    items = [item for item in text.split(",") if item.strip()]
    if len(items) > MAX_STATE_DOMAINS:
        raise ProtocolError(Code.BAD_SYNTAX, f"a GTID state names at most "
                                             f"{MAX_STATE_DOMAINS} domains, not {len(items)}")
    try:
        given = GtidState.parse(text)
    except ValueError as exc:
        raise ProtocolError(Code.BAD_SYNTAX, str(exc)) from None
    if len(list(given)) != len(items):
        raise ProtocolError(Code.BAD_SYNTAX, f"a GTID state names one GTID per domain; "
                                             f"{_named_twice(items)} appears twice")
    stored = given
    uuids = [g for g in given if g.source_uuid]
    if uuids:
        if len(list(given)) > 1:
            raise ProtocolError(Code.BAD_SYNTAX, "AFTER takes one MySQL source UUID")
        stored = GtidState([Gtid(0, 0, uuids[0].sequence)])
    return StateBound(stored, given)


def _named_twice(items: list[str]) -> int | str:
    """The first domain (or MySQL source UUID) the state's items name a second time."""
    seen: set[int | str] = set()
    for item in items:
        key = next(iter(GtidState.parse(item))).key
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no domain named twice")


def stream_request(request: DataRequest) -> StreamRequest:
    try:
        seek = Gtid.parse(request.gtid) if request.gtid else None
    except ValueError as exc:
        raise ProtocolError(Code.BAD_SYNTAX, str(exc)) from None
    return StreamRequest(
        TableName(request.database, request.table), request.version, seek,
        state_bound(request.after) if request.after else None,
        state_bound(request.until) if request.until else None, request.line())
