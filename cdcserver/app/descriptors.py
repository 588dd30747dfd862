"""File descriptors: take what the environment allows, and share it out before it runs short.

Every client connection, table file held open for writing, dump reader and connection to the
source takes a descriptor. At the shell's default soft limit (1024) a thousand idle
connections used to leave none for the replication thread, which then died with EMFILE and
took every table's stream with it. At start the service raises its soft ``RLIMIT_NOFILE`` to
the hard limit, and derives from the limit it got each budget below; the listener refuses a
connection past its budget (``ERR TOO-MANY-CONNECTIONS``) before the store or the replicator
can run short, and the store keeps at most its budget of table files open.

A connection costs its socket. The stored files clients read have a budget of their own: a
version file is open once for every stream that reads it (``store/inuse.py``), and a dump
being sent once per transfer (with its databus layout's temporary file, when asked for); a
reader past that budget is refused, retriably, with ``ERR TOO-MANY-CONNECTIONS``.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, replace

from cdcserver.core.config import Config
from cdcserver.ops.httpgate import CONNECTIONS as HTTP_CONNECTIONS
from cdcserver.store.inuse import FILES

log = logging.getLogger(__name__)

# Descriptors the process needs besides the budgets: the interpreter and its libraries, the
# connections to the source (replication, lag probe, repairs), the index and views
# (SQLite and its journal), the checkpoint, the log, the Kafka brokers, what a thread opens
# for a moment (96), and the connections of the two HTTP listeners, the monitoring
# endpoint's and the admin API's (ops/httpgate.py: 64 each at most).
RESERVED = 96 + 2 * HTTP_CONNECTIONS
CEILING = 1 << 20  # a hard limit of "unlimited" is not taken whole
PER_CONNECTION = 1  # a client's socket (the files it reads: the stored files' budget)
PER_DUMP_READER = 3  # a reader's connection to the source, the dump file, its progress record


@dataclass(frozen=True)
class Budgets:
    limit: int  # the soft RLIMIT_NOFILE the service runs with
    raised_from: int  # what it was at start
    table_files: int  # the store's table files held open for writing
    connections: int  # client connections served at once
    dump_readers: int  # chunked dump readers at once
    stored_files: int  # version files and dumps open for clients (each version file once)

    def describe(self) -> str:
        raised = f" (raised from {self.raised_from})" if self.raised_from != self.limit else ""
        return (f"file descriptors: limit {self.limit}{raised}: {self.table_files} table "
                f"files, {self.connections} client connections, {self.stored_files} stored "
                f"files read by clients, {self.dump_readers} dump readers, {RESERVED} for "
                f"the rest")


def raise_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most :data:`CEILING`); return
    (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the file descriptor limit from %d to %d: %s", soft, target,
                    exc)
        return soft, soft
    return soft, target


def budgets(config: Config, limit: int, raised_from: int | None = None) -> Budgets:
    """Share ``limit`` descriptors out: what is left after :data:`RESERVED` goes a quarter
    to table files (at most ``store.max_open_files``), up to ``dump.readers`` to dump
    readers; of the rest, a quarter to the stored files clients read and three quarters to
    client connections (at most ``listener.max_connections``). The stored files are at most
    as many as the connections: a client reads one at a time (streams of one table share
    theirs), so past that the budget would only lie idle. Each budget is at least 1 (dump
    readers: as configured, 0 meaning one snapshot), so the service starts whatever the
    limit."""
    free = max(limit - RESERVED, 8)
    table_files = max(1, min(config.store.max_open_files, free // 4))
    dump_readers = min(config.dump.readers, max(1, free // 16))  # 0: one snapshot
    rest = free - table_files - dump_readers * PER_DUMP_READER
    stored = max(1, rest // 4)
    connections = max(1, min(config.listener.max_connections,
                             (rest - stored) // PER_CONNECTION))
    return Budgets(limit, limit if raised_from is None else raised_from, table_files,
                   connections, dump_readers, min(stored, connections))


def within(config: Config, shares: Budgets) -> Config:
    """``config`` with its table files, connections and dump readers within ``shares``."""
    return replace(
        config,
        store=replace(config.store, max_open_files=shares.table_files),
        listener=replace(config.listener, max_connections=shares.connections),
        dump=replace(config.dump, readers=shares.dump_readers))


def take(config: Config) -> Budgets:
    """Raise the limit, derive the budgets (:func:`report` says what they are) and hold the
    stored files clients read to theirs."""
    before, after = raise_limit()
    shares = budgets(config, after, before)
    FILES.limit = shares.stored_files
    return shares


def report(config: Config, shares: Budgets) -> None:
    """Log the budgets, and each setting the limit cut short."""
    log.info("%s", shares.describe())
    for what, wanted, got in (("store.max_open_files", config.store.max_open_files,
                               shares.table_files),
                              ("listener.max_connections", config.listener.max_connections,
                               shares.connections)):
        if got < wanted:
            log.warning("%s is %d, but the file descriptor limit (%d) leaves room for %d: "
                        "raise the limit (ulimit -n, LimitNOFILE=) to serve more", what, wanted,
                        shares.limit, got)
