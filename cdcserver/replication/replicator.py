"""The replicator: a worker thread that reads the binlog and hands plain changes to the loop.

python-mysql-replication blocks, so it runs in its own thread. The thread decodes each packet
into :mod:`cdcserver.core.changes` records and puts them into the bounded :class:`Handoff` a
transaction at a time (a big transaction in 1 MiB slices). It owns the reconnect policy: when the
connection drops it ends the open transaction with ``Abort`` and reconnects, with exponential
backoff, from the GTID state after the last transaction it handed over; the transaction is read
again whole. An error no retry can fix (an undecodable event, a purged binlog) ends the thread
and is re-raised on the loop by :meth:`Handoff.get`, after every complete transaction before it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql

from cdcserver.core.capture import EVERY_USER_TABLE, CaptureFilter
from cdcserver.core.changes import Change
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import (
    BinlogPurged,
    CdcError,
    DiskFull,
    ServerIdInUse,
    SourceError,
    SourceRefused,
    SourceUnavailable,
    StoreDamaged,
    disk_refusal,
)
from cdcserver.core.gtid import GtidState, same_state
from cdcserver.core.handoff import Handoff, HandoffClosed
from cdcserver.core.names import TableName
from cdcserver.core.retry import Backoff
from cdcserver.mariadb.charsets import CollationTable
from cdcserver.replication import source
from cdcserver.replication.connection import BinlogConnection
from cdcserver.replication.decoder import EventDecoder
from cdcserver.replication.mappedtable import DeferDecoding
from cdcserver.replication.sources import Sources
from cdcserver.replication.xa import PreparedXa
from cdcserver.schema.history import SchemaHistory

log = logging.getLogger(__name__)


def _quote(name: str) -> str:
    return name.replace("`", "``")

SLICE_BYTES = 1 << 20
# Connections in a row that were lost soon after they started before the replicator asks
# whether another replica uses its server_id
FLAPS_BEFORE_LOOKING = 3
# MariaDB's and MySQL's refusal (1236) to read a binlog that ends in a torn event
_TRUNCATED = "binlog truncated in the middle of event"


class Replicator:
    def __init__(self, address: SourceAddress | Sources, server_id: int, handoff: Handoff,
                 start: GtidState, *, blocking: bool = True, heartbeat: float = 5.0,
                 backoff: Backoff | None = None, report_host: str = "cdcserver",
                 history: SchemaHistory | None = None, mariadb: bool = True,
                 file: str = "", pos: int = 4,
                 defer_decoding: DeferDecoding | None = None,
                 failover_after: float = 10.0,
                 connected_to: Callable[[SourceAddress, str], None] | None = None,
                 capture: CaptureFilter = EVERY_USER_TABLE,
                 xa: PreparedXa | None = None) -> None:
        self.capture = capture
        self.xa = xa if xa is not None else PreparedXa()  # kept across reconnects
        self.sources = Sources.of(address)
        self.failover_after = failover_after
        self.connected_to = connected_to  # told the server (and its identity) on each connect
        self._lost_since: float | None = None  # when the server being read was lost
        self._no_source = ""  # the last "no source can continue" message logged
        self.server_id = server_id
        self.handoff = handoff
        self.state = start  # after the last transaction handed over
        self.mariadb = mariadb
        self.file, self.pos = file, pos  # likewise, in the primary's binlog (MySQL without GTIDs)
        self.blocking = blocking
        self.heartbeat = heartbeat
        self.backoff = backoff if backoff is not None else Backoff()
        self.report_host = report_host
        # The port this replicator reports in SHOW SLAVE HOSTS: a tag of its own, so that a
        # registration left by one of its own lost connections (the source never learned it
        # died: a half-open link, a lossy one) is not taken for another replica's.
        self.report_port = secrets.randbelow(65535) + 1
        self.history = history
        self.defer_decoding = defer_decoding  # layouts whose row images go over undecoded
        if history is not None:
            history.lookup = self._show_create_table
        self._control: Any = None  # SQL connection for SHOW CREATE TABLE, in this thread
        self.connected = threading.Event()
        self.reconnects = 0
        self.last_event_time = 0.0
        self._stop = threading.Event()
        self._conn: BinlogConnection | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> SourceAddress:
        """The server being read (it changes when the replicator moves to another)."""
        return self.sources.current

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cdc-replicator", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            conn.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            collations = self._with_retries(self._collations)
            while not self._stop.is_set():
                reading = self.sources.index
                try:
                    if self._stream(collations):
                        break  # a non-blocking dump reached the end of the binlog
                except (SourceUnavailable, SourceRefused) as exc:
                    self.connected.clear()
                    if self._stop.is_set():
                        break
                    if self._past_a_truncated_binlog(exc):
                        continue
                    if isinstance(exc, SourceRefused) and not self.sources.several:
                        raise
                    self._recover(exc)
                if self.sources.index != reading:
                    collations = self._with_retries(self._collations)
            self.handoff.finish()
        except HandoffClosed:
            pass
        except CdcError as exc:
            # the runner says those (a refused disk: replication paused, in one line)
            if not isinstance(exc, (BinlogPurged, ServerIdInUse, DiskFull, StoreDamaged)):
                log.error("replication stopped: %s", exc)
            self.handoff.finish(exc)
        except OSError as exc:  # the disk under replication's own state, or a bug
            refused = disk_refusal(_state_file(exc), exc)
            if refused is None:
                log.exception("replication thread crashed")
            self.handoff.finish(refused or exc)  # (the runner says a refusal, in one line)
        except BaseException as exc:  # a bug: fail the pipeline loudly rather than hang it
            log.exception("replication thread crashed")
            self.handoff.finish(exc)
        finally:
            self.connected.clear()
            if self._stop.is_set():
                self._end_dump_thread()
            if self._control is not None:
                self._control.close()
                self._control = None

    _dump_thread: int | None = None

    def _end_dump_thread(self) -> None:
        """End the server's thread that served our dump. A blocking dump's thread notices
        that its replica hung up only when it next writes (a heartbeat, an event), and a
        replica connecting again with the same server_id waits for the server to kill it
        (100 ms on MariaDB 11): a restarted service would start that much later."""
        thread, self._dump_thread = self._dump_thread, None
        if thread is None:
            return
        try:
            if self._control is None:
                self._control = source.connect(self.address)
            source.query(self._control, f"KILL CONNECTION {int(thread)}")
        except (CdcError, pymysql.err.MySQLError, OSError) as exc:  # gone already, or down
            log.debug("ending the server's dump thread %d: %s", thread, exc)

    def _show_create_table(self, table: TableName) -> str | None:
        """The table's definition on the source now (the schema history's bootstrap)."""
        try:
            rows = self._control_query(f"SHOW CREATE TABLE `{_quote(table.database)}`"
                                       f".`{_quote(table.table)}`")
        except pymysql.err.ProgrammingError as exc:
            if exc.args and exc.args[0] == 1146:  # no such table (any more)
                return None
            raise
        return str(rows[0][1]) if rows else None

    def _control_query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """A query on this thread's ordinary SQL connection to the source (reconnected once
        if it dropped)."""
        for attempt in range(2):
            try:
                if self._control is None:
                    self._control = source.connect(self.address)
                return source.query(self._control, sql, args)
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError, SourceUnavailable):
                if self._control is not None:
                    self._control.close()
                self._control = None
                if attempt:
                    raise
        return []

    def _identity(self) -> str:
        try:
            if self._control is None:
                self._control = source.connect(self.address)
            return source.server_identity(self._control)
        except (pymysql.err.MySQLError, OSError) as exc:
            raise SourceUnavailable(f"cannot ask {self.address.describe()} which server it "
                                    f"is: {exc}") from exc

    def _anchored(self) -> bool:
        """Whether the source's binlog is at exactly ``self.state`` at ``self.file:self.pos``.
        Then replication resumes there by position, which is exact whatever order the GTIDs
        came in; otherwise (another server, a purged or reset binlog) by GTID state, which
        MariaDB can only position when each domain's sequence numbers grew
        (``gtid_strict_mode``)."""
        if not self.mariadb or not self.file:
            return False
        try:
            rows = self._control_query("SELECT BINLOG_GTID_POS(%s, %s)", (self.file, self.pos))
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            raise SourceUnavailable(f"cannot ask {self.address.describe()} for its binlog "
                                    f"position: {exc}") from exc
        except pymysql.err.MySQLError as exc:
            log.warning("cannot check %s:%d against the source (%s); resuming by GTID",
                        self.file, self.pos, exc)
            return False
        found = rows[0][0] if rows else None
        if found is None:
            log.info("the source no longer has %s:%d; resuming by GTID state '%s'", self.file,
                     self.pos, self.state)
            return False
        at = GtidState.parse(str(found))
        if not same_state(at, self.state):
            log.warning("the source's binlog at %s:%d is at GTID state '%s', not '%s' (another "
                        "server or a reset binlog); resuming by GTID state", self.file,
                        self.pos, at, self.state)
            return False
        return True

    def _collations(self) -> CollationTable:
        conn = source.connect(self.address)
        try:
            return source.collations(conn)
        finally:
            conn.close()

    def _past_a_truncated_binlog(self, exc: Exception) -> bool:
        """A source killed while it wrote a transaction to its binlog leaves the file ending
        in the middle of an event; its restart rolls the transaction back and logs on in a
        new file, but a read through the old one is refused (1236, "binlog truncated in the
        middle of event"). By GTID state the source starts in the file that holds the next
        transaction, past the torn one: True (the position forgotten, reconnect at once)
        when that gets further than this connection did, i.e. it read by position or
        delivered transactions before the refusal. A refusal with no progress by GTID state
        stays a refusal."""
        if _TRUNCATED not in str(exc).lower() or not self.mariadb:
            return False
        if not (self._by_position or self.state != self._stream_began):
            return False
        log.warning("the source's binlog %s ends in the middle of an event (the source died "
                    "while it logged a transaction, which its restart rolled back); "
                    "resuming by GTID state '%s'", self.file or "being read", self.state)
        self.file, self.pos = "", 4
        return True

    _by_position = False  # how the last connection was positioned
    _stream_began = GtidState()  # where it began

    def _stream(self, collations: CollationTable) -> bool:
        by_position = self._anchored()
        self._by_position, self._stream_began = by_position, self.state
        conn = BinlogConnection(self.address, self.server_id, self.state,
                                blocking=self.blocking, heartbeat=self.heartbeat,
                                report_host=self.report_host,
                                report_port=self.report_port, mariadb=self.mariadb,
                                file=self.file, pos=self.pos, by_position=by_position)
        self._conn = conn
        batch: list[Change] = []
        weight = 0
        decoder: EventDecoder | None = None
        try:
            conn.open()
            self._dump_thread = conn.server_thread
            decoder = EventDecoder(collations, self.state, checksums=conn.checksums,
                                   history=self.history, defer_decoding=self.defer_decoding,
                                   capture=self.capture, xa=self.xa)
            log.info("replicating from %s as server_id %d, after GTID state '%s'%s",
                     self.address.describe(), self.server_id, self.state,
                     f" at {self.file}:{self.pos}" if by_position else "")
            if self.connected_to is not None:
                self.connected_to(self.address, self._identity())
            self.connected.set()
            self.backoff.connected()
            self._lost_since = None
            self._no_source = ""
            for packet in conn.packets():
                if self._stop.is_set():
                    raise SourceUnavailable("stopping")
                decoder.feed(packet, batch)
                weight += len(packet)
                if batch and (not decoder.in_transaction or weight >= SLICE_BYTES):
                    self.handoff.put(batch, weight)
                    batch, weight = [], 0
                    if not decoder.in_transaction:
                        self.state = decoder.gtid_state
                        self.file, self.pos = decoder.file, decoder.pos
                        self.last_event_time = time.time()
            if self.blocking:
                # A blocking dump never ends by itself: the server is shutting down, or
                # the connection was handed an EOF some other way. Reconnect.
                raise SourceUnavailable("the source ended the binlog dump")
            self._end_batch(decoder, batch, weight, "the binlog dump ended")
            return True
        except CdcError as exc:
            self._end_batch(decoder, batch, weight, str(exc))
            raise
        finally:
            self._conn = None
            conn.close()
            if not self._stop.is_set():
                self._dump_thread = None  # lost, not stopped: the server ends it itself

    def _end_batch(self, decoder: EventDecoder | None, batch: list[Change], weight: int,
                   reason: str) -> None:
        """Hand over the complete transactions read so far and abort the open one."""
        if decoder is not None:
            decoder.abort_open_transaction(batch, reason)
        if batch:
            self.handoff.put(batch, weight)

    def _recover(self, exc: SourceError) -> None:
        """The server being read is lost: try it again with backoff; with several sources,
        once it has been lost for ``failover_after`` seconds (at once if it refused the
        stream), take the first server that continues the stream exactly."""
        if not self.sources.several:
            self._wait_to_reconnect(exc)
            return
        now = time.monotonic()
        if self._lost_since is None:
            self._lost_since = now
        if not isinstance(exc, SourceRefused) and now - self._lost_since < self.failover_after:
            self._wait_to_reconnect(exc)
            return
        before = self.sources.current
        index = self.sources.choose(self.state, self.server_id)
        if index is None:
            message = (f"no source can continue the stream after GTID state '{self.state}' "
                       f"({exc}): " + "; ".join(r.text() for r in self.sources.refusals))
            if all(r.reason.startswith("purged") for r in self.sources.refusals):
                raise BinlogPurged(message)
            if message != self._no_source:
                log.error("%s; trying again every %.0fs", message, self.failover_after)
                self._no_source = message
            self.reconnects += 1
            self._stop.wait(self.failover_after)
            return
        for refusal in self.sources.refusals:
            log.warning("not reading %s", refusal.text())
        if index == self.sources.index and isinstance(exc, SourceRefused):
            self._wait_to_reconnect(exc)  # it refused, then accepted a fresh dump: not at once
        if index != self.sources.index:
            self.sources.switch(index)
            log.warning("moving from %s to %s, after GTID state '%s' (%s)", before.describe(),
                        self.address.describe(), self.state, exc)
            if self._control is not None:
                self._control.close()
                self._control = None
        self.reconnects += 1

    def _wait_to_reconnect(self, exc: Exception) -> None:
        delay = self.backoff.failed()
        if self.backoff.flaps >= FLAPS_BEFORE_LOOKING:
            self._refuse_a_shared_server_id(exc)
        self.reconnects += 1
        log.warning("%s; reconnecting in %.1fs", exc, delay)
        self._stop.wait(delay)

    _suspected = False  # a shared server_id suspected and logged, but not confirmed

    def _refuse_a_shared_server_id(self, exc: Exception) -> None:
        """The connection keeps being cut soon after it starts. MariaDB and MySQL serve one
        replica per server_id and cut the older connection when another registers with the
        same one: two replicas sharing it cut each other forever. Raises ServerIdInUse if
        another replica is registered with ours now. A registration with our host and port
        tag is ours: a connection of ours that we lost but the source did not notice yet (a
        half-open or lossy link), which only the source's own timeouts end."""
        try:
            rows = self._control_query("SHOW SLAVE HOSTS")
        except (SourceError, pymysql.err.MySQLError, OSError) as denied:
            if not self._suspected:
                log.error("the connection to %s keeps being cut soon after it starts (%d "
                          "times in a row): another replica with server_id %d is the likely "
                          "cause, which SHOW SLAVE HOSTS would tell, but it was refused (%s; it "
                          "needs REPLICATION MASTER ADMIN); retrying with backoff",
                          self.address.describe(), self.backoff.flaps, self.server_id, denied)
                self._suspected = True
            return
        for row in rows:
            if int(row[0]) == self.server_id and not self._ours(row):
                where = f"{row[1]}:{row[2]}" if row[1] else "a host that did not report itself"
                raise ServerIdInUse(
                    f"another replica ({where}) reads {self.address.describe()} with server_id "
                    f"{self.server_id}, and the server keeps one connection per server_id: the "
                    f"two cut each other off ({self.backoff.flaps} connections in a row lost "
                    f"within {self.backoff.stable_after:.0f}s; last: {exc}). Give this "
                    "service a server_id of its own ([source] server_id, --server-id, "
                    "CDCSERVER_SOURCE_SERVER_ID) and start it again")

    def _ours(self, row: tuple[Any, ...]) -> bool:
        """Whether a SHOW SLAVE HOSTS row (Server_id, Host, Port, ...) is this replicator's."""
        return str(row[1]) == self.report_host and int(row[2] or 0) == self.report_port

    def _with_retries(self, action):  # type: ignore[no-untyped-def]
        while True:
            try:
                return action()
            except SourceUnavailable as exc:
                if self._stop.is_set():
                    raise
                self._recover(exc)


def _state_file(exc: OSError) -> str:
    """What the replication thread was writing when the disk refused it: a file of its own
    state (prepared XA transactions' events, the record of the server it reads)."""
    if exc.filename:
        return f"replication's state file {exc.filename}"
    return "replication's state (prepared XA transactions' events or the source's record)"
