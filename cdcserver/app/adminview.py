"""What the admin API (``cdcserver/ops/admin.py``, docs/admin.md) reads of the running service, and
the actions it takes on it.

Everything is gathered on the service's event loop, where the listener, the catalog and the
scheduler live; what reads files or the index (a version's records, the GTID a client stands
at, the dumps on disk) runs in a worker thread on what was gathered.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcserver.app.runner import ReplicationRunner
from cdcserver.app.stored import StoredData
from cdcserver.core.config import Config
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import Gtid
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.ops.adminjson import Refused
from cdcserver.ops.metrics import ServiceStats, health
from cdcserver.protocol.connection import Connection
from cdcserver.protocol.outcomes import Phase
from cdcserver.protocol.positions import Positions
from cdcserver.protocol.server import CdcServer
from cdcserver.store.catalog import Catalog, TableEntry, VersionInfo
from cdcserver.store.index import StoreIndex
from mariadb_cdc_client.format.names import table_ref
from mariadb_cdc_client.format.wire import Format

RATE_WINDOW = 10.0  # seconds a client's bytes/s is measured over
SAMPLE_EVERY = 2.0
KICKED = "disconnected by an administrator"


class ServiceView:
    """What the admin API reads of the running service's parts, and does to them."""

    def __init__(self, config: Config, data: StoredData, runner: ReplicationRunner,
                 server: CdcServer, scheduler: DumpScheduler,
                 stats: Callable[[], ServiceStats]) -> None:
        self.config = config
        self.catalog = data.catalog
        self.store = data.store
        self.users = data.users
        self.runner = runner
        self.server = server
        self.scheduler = scheduler
        self.stats = stats
        self.positions = Positions()
        self._samples: dict[int, collections.deque[tuple[float, int]]] = {}

    async def sample(self) -> None:
        """Until cancelled: each connection's bytes sent, every two seconds (the rates)."""
        while True:
            self._sample(time.monotonic())
            await asyncio.sleep(SAMPLE_EVERY)

    # -- replication -----------------------------------------------------------------------

    def replication(self) -> dict[str, Any]:
        stats = self.stats()
        _, document = health(stats, self.config.metrics.max_lag)
        replication, lag = stats.replication, stats.lag
        last_commit = self.runner.last_commit()
        resyncing = self.runner.resyncing()
        return {
            "state": _state(replication),
            "problems": document["problems"],
            "source": document["source"],
            "position": stats.applied,
            "last_commit": _iso(last_commit),
            "lag_seconds": lag.seconds if lag is not None else None,
            "lag_transactions": lag.transactions if lag is not None else None,
            "lag_measured_at": _iso(lag.measured_at) if lag is not None else None,
            "transactions": replication.transactions,
            "queue": {"bytes": replication.queue_bytes,
                      "capacity": replication.queue_capacity},
            "quarantined": [{"table": table_ref(t.database, t.table), "cause": q.cause,
                             "since": q.since, "at": _iso(q.at), "resyncing": t in resyncing}
                            for t, q in sorted(self.catalog.quarantined.items())],
            "repairs": [{**r, "at": _iso(r["at"])} for r in stats.repairs.recent],
            "time": _iso(time.time()),
        }

    # -- clients ---------------------------------------------------------------------------

    async def clients(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        self._sample(now)
        seen = [(c, _Where.of(c, self.catalog)) for c in self.server.sessions()]
        index = self.store.index
        found = await asyncio.to_thread(self._locate, index, [w for _, w in seen])
        return [self._client(c, where, located, now)
                for (c, where), located in zip(seen, found, strict=True)]

    def _client(self, c: Connection, where: _Where | None, located: tuple[str | None,
                float | None], now: float) -> dict[str, Any]:
        session = c.session
        registered = session.phase not in (Phase.AUTH, Phase.REGISTER)
        gtid, seconds = located
        return {
            "id": c.id,
            "address": c.peer,
            "user": session.user,
            "uuid": session.client_uuid,
            "format": session.format.value if registered else None,
            "dialect": str(session.dialect.value) if registered else None,
            "phase": _phase(c),
            "reading": table_ref(c.reading.database, c.reading.table)
            if c.reading is not None else None,
            "kind": ("dump" if c.sending is not None else "stream")
            if c.reading is not None else None,
            "request": c.request if c.sending is None else f"REQUEST-DUMP {c.sending}",
            "position": {"version": where.info.version, "offset": where.offset, "gtid": gtid}
            if where is not None else None,
            "behind": {"bytes": where.behind, "seconds": seconds}
            if where is not None else None,
            # an AVRO stream sends stored blocks as they are, without counting their records
            "records_sent": c.out.records_sent if session.format == Format.JSON else None,
            "bytes_sent": c.out.bytes_sent,
            "bytes_per_second": self._rate(c, now),
            "connected_at": _iso(c.connected_at),
        }

    def _locate(self, index: StoreIndex | None, places: list[_Where | None]
                ) -> list[tuple[str | None, float | None]]:
        """(GTID at the position, seconds behind the table's newest commit) of each stream;
        run in a worker thread."""
        newest: dict[TableName, int | None] = {}
        found: list[tuple[str | None, float | None]] = []
        for where in places:
            if where is None:
                found.append((None, None))
                continue
            gtid = self.positions.gtid_at(index, where.info, where.offset)
            if not where.behind:
                found.append((gtid, 0.0))
                continue
            table = where.info.table
            if table not in newest:
                last = index.last_transaction_of({table}) if index is not None else None
                newest[table] = last.timestamp if last is not None else None
            found.append((gtid, _seconds_between(index, gtid, newest[table])))
        return found

    def disconnect(self, client_id: int) -> None:
        if not self.server.disconnect(client_id, KICKED):
            raise Refused(404, f"no client {client_id} is connected (GET /api/v1/clients)")

    def _sample(self, now: float) -> None:
        sessions = self.server.sessions()
        for c in sessions:
            samples = self._samples.setdefault(c.id, collections.deque())
            samples.append((now, c.out.bytes_sent))
            while len(samples) > 1 and now - samples[0][0] > RATE_WINDOW:
                samples.popleft()
        open_ids = {c.id for c in sessions}
        for gone in [i for i in self._samples if i not in open_ids]:
            del self._samples[gone]

    def _rate(self, c: Connection, now: float) -> float:
        samples = self._samples.get(c.id)
        if not samples or now - samples[0][0] < 0.5:  # too new to tell: since it connected
            elapsed = max(time.time() - c.connected_at, 1e-3)
            return round(c.out.bytes_sent / elapsed, 1)
        first_time, first_bytes = samples[0]
        return round((c.out.bytes_sent - first_bytes) / (now - first_time), 1)

    # -- tables ----------------------------------------------------------------------------

    async def tables(self) -> list[dict[str, Any]]:
        readers = collections.Counter(c.reading for c in self.server.sessions()
                                      if c.reading is not None)
        resyncing = self.runner.resyncing()
        entries = [(entry, list(entry.versions.values()))
                   for _, entry in sorted(self.catalog.tables.items())]
        paths = {info.path for _, infos in entries for info in infos}
        self.positions.forget(paths)
        counted = await asyncio.to_thread(self._count, self.store.index, entries)
        listed = []
        for (entry, infos), (records, last) in zip(entries, counted, strict=True):
            why = self.catalog.quarantined.get(entry.name)
            listed.append({
                "table": table_ref(entry.name.database, entry.name.table),
                "database": entry.name.database, "name": entry.name.table,
                "versions": [_version(info) for info in sorted(infos, key=lambda i: i.version)],
                "records": records,
                "bytes": sum(info.committed for info in infos),
                "last_gtid": str(last.gtid) if last is not None else None,
                "last_commit": _iso(last.timestamp) if last is not None else None,
                "quarantined": {"cause": why.cause, "since": why.since, "at": _iso(why.at),
                                "resyncing": entry.name in resyncing}
                if why is not None else None,
                "clients": readers[entry.name],
            })
        return listed

    def _count(self, index: StoreIndex | None,
               entries: list[tuple[TableEntry, list[VersionInfo]]]) -> list[tuple[Any, Any]]:
        """Each table's records (None if a version cannot be read now) and its newest
        transaction; run in a worker thread."""
        counted = []
        for entry, infos in entries:
            each = [self.positions.records(info) for info in infos]
            records = None if any(n is None for n in each) else sum(n or 0 for n in each)
            last = index.last_transaction_of({entry.name}) if index is not None else None
            counted.append((records, last))
        return counted

    def resync(self, table: TableName) -> str:
        ref = table_ref(table.database, table.table)
        why = self.catalog.quarantined.get(table)
        if why is None:
            if self.catalog.get(table) is None:
                raise Refused(404, f"the service stores no table {ref}")
            raise Refused(409, f"{ref} is not quarantined: its stream is whole, there is "
                               "nothing to resync")
        if table in self.runner.resyncing():
            raise Refused(409, f"a resync of {ref} is under way already")
        if not self.runner.replicating.is_set():
            raise Refused(503, "replication does not run now; the service resyncs "
                               f"{ref} once it does")
        if not self.runner.request_resync(table, why.cause):
            raise Refused(409, f"a resync of {ref} cannot be asked for now; try again")
        return ref

    # -- dumps -----------------------------------------------------------------------------

    async def dumps(self) -> dict[str, Any]:
        readers: dict[str, list[int]] = collections.defaultdict(list)
        for c in self.server.sessions():
            if c.sending is not None:
                readers[c.sending].append(c.id)
        found = await asyncio.to_thread(files.list_dumps, self.config.store.data_dir)
        return {
            "dumps": [{"name": d.name, "table": table_ref(d.table.database, d.table.table),
                       "bytes": d.size, "rows": d.header.rows, "created": d.header.created,
                       "gtid": d.header.gtid, "readers": readers.get(d.name, [])}
                      for d in found],
            "taking": self.scheduler.listed(),
        }

    async def take_dumps(self, refs: list[tuple[str, str | None]]) -> dict[str, list[str]]:
        scheduler = self.scheduler
        try:
            found = await asyncio.to_thread(scheduler.resolve, refs)
        except CdcError as exc:
            raise Refused(503, f"cannot list the tables on the source: {exc}") from None
        missing = [table_ref(d, t) for d, t in refs
                   if t is not None and TableName(d, t) not in found]
        if missing:
            raise Refused(404, f"no table {', '.join(missing)} on the source (or not captured)")
        if not found:
            raise Refused(404, "no table matches " + ", ".join(
                f"{table_ref(d, 'x')[:-2]}.*" if t is None else table_ref(d, t) for d, t in refs))
        try:
            queued = scheduler.request(found)
        except CdcError as exc:
            raise Refused(503, str(exc)) from None
        return {"queued": [table_ref(t.database, t.table) for t in queued],
                "under_way": [table_ref(t.database, t.table) for t in found
                              if t not in queued]}

    # -- users -----------------------------------------------------------------------------

    async def reload_users(self) -> int:
        count = await asyncio.to_thread(self.users.reload)
        self.server.revoke_lost_access()
        return count


@dataclass(frozen=True)
class _Where:
    """Where a stream stands: the version being sent, the offset sent up to, and the bytes
    stored past it (over every later version too)."""

    info: VersionInfo
    offset: int
    behind: int

    @classmethod
    def of(cls, c: Connection, catalog: Catalog) -> _Where | None:
        streamer = c.streamer
        if streamer is None or streamer.at is None or c.sending is not None:
            return None
        info, offset = streamer.at, streamer.offset
        entry = catalog.get(info.table)
        later = [v for n, v in entry.versions.items() if n > info.version] if entry else []
        behind = max(0, info.committed - offset) + sum(
            max(0, v.committed - v.header.size) for v in later)
        return cls(info, offset, behind)


def _seconds_between(index: StoreIndex | None, gtid: str | None, newest: int | None
                     ) -> float | None:
    if index is None or gtid is None or newest is None:
        return None
    sent = index.transaction(Gtid.parse(gtid))
    return float(max(0, newest - sent.timestamp)) if sent is not None else None


def _version(info: VersionInfo) -> dict[str, Any]:
    return {"version": info.version, "file": info.path.rsplit("/", 1)[-1],
            "bytes": info.committed, "sealed": info.sealed,
            "created_by": str(info.schema.gtid) if info.schema.gtid else None}


def _phase(c: Connection) -> str:
    phase = c.session.phase
    if c.sending is not None:
        return "dump"
    return {Phase.AUTH: "login", Phase.REGISTER: "register", Phase.READY: "ready",
            Phase.STREAMING: "streaming", Phase.CLOSED: "closing"}[phase]


def _state(replication: Any) -> str:
    if replication.stopped or replication.failure:
        return "stopped"
    if replication.halted:
        return "stopping"
    if replication.paused:
        return "paused"
    if not replication.started:
        return "starting"
    return "replicating" if replication.connected else "connecting"


def _iso(when: float | None) -> str | None:
    if not when:
        return None
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat(timespec="seconds")
