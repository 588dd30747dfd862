"""One publisher among several service instances: a named lock on the source.

With ``[kafka] publisher_lock``, an instance publishes to Kafka only while it holds the
MariaDB/MySQL named lock of that name (``GET_LOCK(name, 0)``) on a connection of its own to
the source. The lock is the connection's: when the instance stops or dies, the server ends
the connection and frees the lock, and one of the instances standing by takes it within
``interval`` seconds. The one that takes it reads the position the last publisher recorded
in ``state_topic`` (all instances share its key) and replication feeds the sink from there:
what the last publisher sent after its last recorded position is sent again (at least once,
never lost). Nothing is written to the source.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pymysql

from cdcserver.core.errors import CdcError
from cdcserver.replication import source as source_sql
from cdcserver.replication.sources import Sources

log = logging.getLogger(__name__)


class PublisherLease:
    def __init__(self, sources: Sources, name: str, interval: float = 1.0) -> None:
        self.sources = sources
        self.name = name
        self.interval = interval
        self.held = False

    async def run(self, acquired: Callable[[], Awaitable[None]],
                  lost: Callable[[], Awaitable[None]],
                  can_publish: Callable[[], bool] = lambda: True) -> None:
        """Forever: wait for the lock (while ``can_publish``), call ``acquired``; when its
        connection fails or this instance cannot publish any more, let it go, call ``lost``
        and wait for it again. A failed ``acquired`` lets the lock go too (and says why)."""
        while True:
            conn = await asyncio.to_thread(self._take) if can_publish() else None
            if conn is None:
                await asyncio.sleep(self.interval)
                continue
            self.held = True
            log.warning("kafka: this instance publishes (it holds the lock %r on %s)",
                        self.name, self.sources.current.describe())
            try:
                await acquired()
                while True:  # a poll: the server tells no one when a connection fails
                    await asyncio.sleep(self.interval)
                    if not can_publish() or \
                            not await asyncio.to_thread(self._still_held, conn):
                        break
            except (CdcError, OSError) as exc:
                log.error("kafka: cannot publish (%s); letting the lock %r go", exc,
                          self.name)
            finally:
                self.held = False
                await asyncio.to_thread(conn.close)
            log.warning("kafka: lost the lock %r; standing by", self.name)
            await lost()

    def _take(self) -> Any:
        """A connection holding the lock, or None (another instance holds it, or the source
        does not answer)."""
        try:
            conn = source_sql.connect(self.sources.current)
        except (CdcError, pymysql.err.MySQLError, OSError):
            return None
        try:
            got = source_sql.query(conn, "SELECT GET_LOCK(%s, 0)", (self.name,))[0][0]
        except (pymysql.err.MySQLError, OSError):
            got = None
        if got == 1:
            return conn
        conn.close()
        return None

    def _still_held(self, conn: Any) -> bool:
        try:
            return bool(source_sql.query(conn, "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()",
                                         (self.name,))[0][0])
        except (pymysql.err.MySQLError, OSError):
            return False
