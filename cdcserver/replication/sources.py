"""The servers the service may replicate from, and which one it takes when it loses the current.

``[source] url`` names one server, or several (the primary and its replicas, comma-separated)
in order of preference. The service reads one at a time. When it has not been able to read
the current one for ``failover_after`` seconds, it examines every server in order and takes
the first whose binlog continues its stream exactly:

1. the server answers and passes the preflight (binary log, ``ROW``, ``FULL`` images, GTIDs);
2. its binlog holds every transaction the service has stored: ``@@gtid_binlog_pos`` is at or
   past the stored GTID state in every domain. A replica that is behind is passed over (a
   replica's binlog holds what it applied only with ``log_slave_updates``);
3. its binlog holds exactly the stored transactions: it accepts a binlog dump positioned at
   the stored GTID state in strict mode, which MariaDB refuses (error 1236, naming the GTID)
   when a domain's last stored GTID is not in its binlog: another server's transaction in
   its place, a diverged or errant server.

Nothing is lost and nothing is read twice: the stream continues after the stored GTID state,
so GTIDs, event numbers and records are the same as if the server had not changed. A server
refused is named with the reason in the log and in ``/health``; while none can be taken the
service keeps trying every ``failover_after`` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import BinlogPurged, CdcError, SourceError, SourceUnavailable
from cdcserver.core.gtid import GtidState
from cdcserver.replication import preflight
from cdcserver.replication import source as source_sql

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """Why a server cannot continue the stream now."""

    address: SourceAddress
    reason: str

    def text(self) -> str:
        return f"{self.address.describe()}: {self.reason}"


@dataclass
class Sources:
    """The servers, in order of preference, and the one being read (shared by everything
    that queries the source: the replicator switches it, the others follow)."""

    addresses: list[SourceAddress]
    index: int = 0
    switches: int = 0
    refusals: list[Refusal] = field(default_factory=list)  # of the last examination
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("no source")

    @classmethod
    def of(cls, sources: SourceAddress | Sources) -> Sources:
        return sources if isinstance(sources, Sources) else cls([sources])

    @property
    def current(self) -> SourceAddress:
        with self._lock:
            return self.addresses[self.index]

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1

    def switch(self, index: int) -> None:
        with self._lock:
            if index != self.index:
                self.switches += 1
            self.index = index

    def choose(self, stored: GtidState, server_id: int) -> int | None:
        """The first server, in order of preference, that continues the stream exactly after
        ``stored`` (None: none can now; ``refusals`` says why for each)."""
        refusals: list[Refusal] = []
        for index, address in enumerate(self.addresses):
            reason = examine(address, stored, server_id)
            if reason is None:
                with self._lock:
                    self.refusals = refusals
                return index
            refusals.append(Refusal(address, reason))
        with self._lock:
            self.refusals = refusals
        return None


def examine(address: SourceAddress, stored: GtidState, server_id: int) -> str | None:
    """None if the server can continue the stream exactly after ``stored``, else why not."""
    try:
        conn = source_sql.connect(address)
    except (pymysql.err.MySQLError, OSError, CdcError) as exc:
        return f"unreachable ({exc})"
    try:
        report = preflight.check_connection(conn, address.describe())
        if report.fatal:
            return "unsuitable: " + "; ".join(f"{f.check}: {f.detail}" for f in report.fatal)
        info = report.info
        assert info is not None
        if info.flavor != "mariadb":
            return "changing servers needs MariaDB GTIDs; this is MySQL"
        binlog = GtidState.parse(str(source_sql.query(
            conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""))
        missing = [g for g in stored if (b := binlog.get(g.key)) is None or
                   b.sequence < g.sequence]
        if missing:
            return _behind(conn, binlog, stored, missing)
    except (pymysql.err.MySQLError, OSError) as exc:
        return f"unreachable ({exc})"
    finally:
        conn.close()
    return _diverged(address, stored, server_id)


def _behind(conn: pymysql.connections.Connection, binlog: GtidState, stored: GtidState,
            missing: Sequence[object]) -> str:
    text = (f"behind: its binlog ends at '{binlog}', without "
            f"{', '.join(str(g) for g in missing)} which the stream holds (stored: "
            f"'{stored}')")
    replica = preflight.replica_status(conn, "mariadb")
    if replica:
        logs = str(source_sql.query(conn, "SELECT @@GLOBAL.log_slave_updates")[0][0])
        applied = str(source_sql.query(conn, "SELECT @@GLOBAL.gtid_slave_pos")[0][0] or "")
        text += f"; it is a replica at gtid_slave_pos '{applied}'"
        if logs in ("0", "OFF"):
            text += (" without log_slave_updates, so its binlog does not hold what it "
                     "replicates: set log_slave_updates = ON on replicas the service may read")
    return text


def _diverged(address: SourceAddress, stored: GtidState, server_id: int) -> str | None:
    """A binlog dump positioned at ``stored`` in strict mode: MariaDB refuses it when a
    stored GTID is not in its binlog."""
    from cdcserver.replication.connection import BinlogConnection  # the replication protocol

    conn = BinlogConnection(address, server_id, stored, blocking=False)
    try:
        conn.open()
        for _ in conn.packets():
            return None  # the first event: the dump was accepted
        return None
    except BinlogPurged as exc:
        return f"purged: it no longer holds the binlog after '{stored}': {exc}"
    except SourceError as exc:
        # MariaDB's 1236 names the missing GTID; other refusals (access, a replica with
        # the service's server_id) are not a divergence
        kind = "diverged" if "not in the master's binlog" in str(exc) else "refused"
        return f"{kind}: it cannot continue after '{stored}': {exc}"
    except SourceUnavailable as exc:
        return f"unreachable ({exc})"
    finally:
        conn.close()
