"""XA transactions prepared on the source and not yet completed: their binlog events, on disk.

MariaDB (10.5+) logs an XA transaction as two event groups, each with its own GTID: the first
(``FL_PREPARED_XA``) holds the rows and ends with an ``XA_PREPARE`` event; the second
(``FL_COMPLETED_XA``) is one statement, ``XA COMMIT X'..',X'..',n`` or ``XA ROLLBACK ...``,
possibly much later, from another connection, after a restart of the server
(https://mariadb.com/kb/en/xa-transactions/; MDEV-742). The rows belong in the stream once, at
the commit, in commit order.

The decoder hands the prepared group's events here as they come; at ``XA_PREPARE`` they are
made durable (written, fsynced, renamed) before the prepare's GTID can be handed on, so no
checkpoint ever passes a prepare whose rows it could lose. At the completion the decoder takes
them back and decodes them as the completing transaction. A completed entry stays on disk,
marked with the GTID that completed it, until every sink's checkpoint covers that GTID: a
restart before then reads the completion again and needs the rows again (it finds them by that
GTID, so an xid an application reuses later is never confused with this one).

Files, under ``state/xa/``: ``<prepare GTID>.<xid digest>.prepared`` (a JSON header line, then
the events, each a 4-byte little-endian length and the event without its checksum) and, once
completed, ``<same stem>.completed`` (JSON: the completing GTID and whether it committed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cdcserver.core.durable import fsync_dir, write_all, write_atomically
from cdcserver.core.gtid import Gtid, GtidState

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
_XID_SQL = re.compile(r"X'([0-9a-fA-F]*)'\s*,\s*X'([0-9a-fA-F]*)'\s*,\s*(\d+)")
_KEPT_LOST = 20  # completions of unknown XA transactions remembered for /health


@dataclass(frozen=True, slots=True)
class Xid:
    """An XA transaction's identifier: format id, global transaction id, branch qualifier
    (bytes: an application may use any, ``X'00ff'`` too)."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    @classmethod
    def from_statement(cls, sql: str) -> Xid | None:
        """The xid of ``XA COMMIT X'..',X'..',n`` as the binlog writes it (hex, always)."""
        match = _XID_SQL.search(sql)
        if match is None:
            return None
        return cls(int(match[3]), bytes.fromhex(match[1]), bytes.fromhex(match[2]))

    @property
    def digest(self) -> str:
        """A file-name-safe name of the xid (its bytes may be anything)."""
        raw = b"%d:%s:%s" % (self.format_id, self.gtrid.hex().encode(), self.bqual.hex().encode())
        return hashlib.sha1(raw).hexdigest()[:20]

    def __str__(self) -> str:
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{self.format_id}"


@dataclass
class Prepared:
    """One prepared XA transaction: where its events are, and what completed it."""

    xid: Xid
    gtid: Gtid  # the prepare's
    prepared_at: float  # the source's timestamp of the prepare
    path: str | None  # its events' file; None: kept in memory (no data directory)
    events: list[bytes] = field(default_factory=list)  # in memory only
    completed: Gtid | None = None
    committed: bool = False

    @property
    def stem(self) -> str:
        return f"{self.gtid}.{self.xid.digest}"


class Recording:
    """The events of an XA transaction's prepare group, being written as they come."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.events: list[bytes] = []
        self._fd = -1 if path is None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.size = 0

    def add(self, event: bytes) -> None:
        if self._fd < 0:
            self.events.append(event)
        else:
            write_all(self._fd, _LENGTH.pack(len(event)) + event)
        self.size += len(event)

    def seal(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def events_back(self) -> list[bytes]:
        """The events recorded (a transaction committed in one phase), the file gone."""
        self.seal()
        if self.path is None:
            return self.events
        events = list(read_events(self.path))
        self.discard()
        return events

    def discard(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class PreparedXa:
    """Every prepared XA transaction not yet known to be behind every sink's checkpoint.

    The decoder (the replicator's thread) records and completes; the pipeline (the event loop)
    prunes after a checkpoint: one lock between them."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self._entries: list[Prepared] = []
        self._lock = threading.Lock()
        self.lost: list[str] = []  # completions of XA transactions prepared before the start
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self._load()

    # -- what the decoder does ---------------------------------------------------------

    def record(self, gtid: Gtid) -> Recording:
        """Start keeping the events of the prepare group ``gtid``."""
        path = None if self.directory is None else \
            os.path.join(self.directory, f"{gtid}.recording")
        return Recording(path)

    def prepared(self, recording: Recording, xid: Xid, gtid: Gtid, timestamp: int) -> None:
        """The prepare group ended with ``XA PREPARE xid``: its events are durable when this
        returns. Read again after a restart, it replaces its own earlier copy."""
        entry = Prepared(xid, gtid, float(timestamp), None)
        recording.seal()
        if recording.path is not None and self.directory is not None:
            entry.path = os.path.join(self.directory, f"{entry.stem}.prepared")
            header = json.dumps({"xid": str(xid), "format_id": xid.format_id,
                                 "gtrid": xid.gtrid.hex(), "bqual": xid.bqual.hex(),
                                 "gtid": str(gtid), "prepared_at": timestamp}).encode()
            write_atomically(entry.path + ".header", header + b"\n", 0o600)
            os.replace(recording.path, entry.path)
            fsync_dir(self.directory)
        else:
            entry.events = recording.events
        with self._lock:
            known = self._find(lambda e: e.stem == entry.stem)
            if known is None:
                self._entries.append(entry)
            log.info("XA transaction %s prepared at %s (%d bytes of events kept until its "
                     "commit or rollback)", xid, gtid, recording.size)

    def complete(self, xid: Xid, gtid: Gtid, *, commit: bool) -> list[bytes] | None:
        """``XA COMMIT`` (``commit``) or ``XA ROLLBACK`` of ``xid`` in transaction ``gtid``:
        the prepared events (to decode as ``gtid``'s), [] for a rollback, or None if this
        service never saw the prepare. The completion is durable when this returns."""
        with self._lock:
            entry = self._find(lambda e: e.completed == gtid and e.xid == xid) or \
                self._find(lambda e: e.completed is None and e.xid == xid)
        if entry is None:
            self._lost(xid, gtid, commit)
            return None
        if entry.completed is None:
            entry.completed, entry.committed = gtid, commit
            if entry.path is not None:
                write_atomically(self._completion_path(entry), json.dumps(
                    {"gtid": str(gtid), "committed": commit}).encode() + b"\n", 0o600)
        return list(self._events(entry)) if commit else []

    # -- what the pipeline and /health do ----------------------------------------------

    @property
    def completing(self) -> bool:
        """Whether a completed transaction waits to be let go (:meth:`prune` has work)."""
        with self._lock:
            return any(e.completed is not None for e in self._entries)

    def prune(self, durable: list[GtidState]) -> None:
        """Forget the completed transactions every sink's checkpoint covers."""
        with self._lock:
            done = [e for e in self._entries if e.completed is not None and
                    all(state.covers(e.completed) for state in durable)]
            if not done:
                return
            self._entries = [e for e in self._entries if e not in done]
        for entry in done:
            if entry.path is not None:
                for path in (entry.path, entry.path + ".header", self._completion_path(entry)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        if self.directory is not None:
            fsync_dir(self.directory)

    def pending(self) -> list[Prepared]:
        """The prepared transactions not completed yet, oldest first."""
        with self._lock:
            return sorted((e for e in self._entries if e.completed is None),
                          key=lambda e: e.prepared_at)

    def oldest_age(self) -> float:
        pending = self.pending()
        return max(0.0, time.time() - pending[0].prepared_at) if pending else 0.0

    # -- inside ------------------------------------------------------------------------

    def _find(self, match: Callable[[Prepared], bool]) -> Prepared | None:
        return next((e for e in self._entries if match(e)), None)

    def _events(self, entry: Prepared) -> Iterator[bytes]:
        return iter(entry.events) if entry.path is None else read_events(entry.path)

    def _completion_path(self, entry: Prepared) -> str:
        assert entry.path is not None
        return entry.path[: -len(".prepared")] + ".completed"

    def _lost(self, xid: Xid, gtid: Gtid, commit: bool) -> None:
        what = "commit" if commit else "rollback"
        note = (f"XA {what} of {xid} at {gtid}: the transaction was prepared before this "
                "service's start position, so its rows are not in the stream; resync the "
                "tables it changed (`cdcserver resync --table db.t`)")
        if commit:
            log.error("%s", note)
            self.lost = [*self.lost, note][-_KEPT_LOST:]
        else:
            log.info("XA rollback of %s at %s: prepared before the start position, nothing "
                     "to drop", xid, gtid)

    def _load(self) -> None:
        """The entries of the last run (recordings it did not finish are dropped: the
        binlog holds their groups, which are read again)."""
        assert self.directory is not None
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.endswith((".recording", ".tmp")) or (
                    name.endswith(".header") and not os.path.exists(path[:-len(".header")])):
                os.unlink(path)
            elif name.endswith(".prepared"):
                self._entries.append(self._loaded(path))

    def _loaded(self, path: str) -> Prepared:
        with open(path + ".header", "rb") as file:
            header = json.loads(file.read())
        entry = Prepared(Xid(int(header["format_id"]), bytes.fromhex(header["gtrid"]),
                             bytes.fromhex(header["bqual"])),
                         Gtid.parse(header["gtid"]), float(header["prepared_at"]), path)
        with contextlib.suppress(FileNotFoundError), open(self._completion_path(entry),
                                                          "rb") as file:
            completion = json.loads(file.read())
            entry.completed = Gtid.parse(completion["gtid"])
            entry.committed = bool(completion["committed"])
        return entry


def read_events(path: str) -> Iterator[bytes]:
    """The events of a recording's file, in order."""
    with open(path, "rb") as file:
        data = file.read()
    pos = 0
    while pos < len(data):
        (size,) = _LENGTH.unpack_from(data, pos)
        yield data[pos + 4 : pos + 4 + size]
        pos += 4 + size
