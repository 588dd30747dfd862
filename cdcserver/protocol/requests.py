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


def state_bound(text: str) -> StateBound:
    """A GTID state as a request names it. A MySQL state may name one source UUID (its
    transactions are stored in domain 0)."""
    try:
        given = GtidState.parse(text)
    except ValueError as exc:
        raise ProtocolError(Code.BAD_SYNTAX, str(exc)) from None
    stored = given
    uuids = [g for g in given if g.source_uuid]
    if uuids:
        if len(list(given)) > 1:
            raise ProtocolError(Code.BAD_SYNTAX, "AFTER takes one MySQL source UUID")
        stored = GtidState([Gtid(0, 0, uuids[0].sequence)])
    return StateBound(stored, given)


def stream_request(request: DataRequest) -> StreamRequest:
    try:
        seek = Gtid.parse(request.gtid) if request.gtid else None
    except ValueError as exc:
        raise ProtocolError(Code.BAD_SYNTAX, str(exc)) from None
    return StreamRequest(
        TableName(request.database, request.table), request.version, seek,
        state_bound(request.after) if request.after else None,
        state_bound(request.until) if request.until else None, request.line())
