"""The verbs of dumps (extensions): ``LIST-DUMPS``, ``START-DUMP`` and ``REQUEST-DUMP``,
each with the answer to the query it hands the connection. :class:`Session` has these as
its own methods, found by name like the others."""

from __future__ import annotations

import json
import logging

from cdcserver.core.errors import CdcError
from cdcserver.core.names import TableName
from cdcserver.dump.files import DumpInfo
from cdcserver.protocol.outcomes import Outcome, Phase, Reply, SendDump
from cdcserver.protocol.queries import FindDump, ListDumps, ResolveTables, SessionContext
from cdcserver.protocol.requests import stream_request
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import (
    Code,
    DataRequest,
    Dialect,
    Format,
    ProtocolError,
    parse_list_dumps,
    parse_request_dump,
    parse_start_dump,
)

# the session's log, wherever its lines are written from
log = logging.getLogger("cdcserver.protocol.session")


class DumpVerbs:
    """The dump verbs, on what :class:`Session` holds."""

    context: SessionContext
    peer: str
    phase: Phase
    user: str | None
    format: Format
    dialect: Dialect

    def _may_read(self, table: TableName) -> bool:
        raise NotImplementedError  # Session's: whether the user may read the table

    def _require_access(self, table: TableName) -> None:
        raise NotImplementedError  # Session's: FORBIDDEN unless the user may read it

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


def _ref(table: TableName) -> str:
    return table_ref(table.database, table.table)
