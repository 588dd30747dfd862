"""When a stream's connection fails: the one reconnect policy of both clients.

:class:`mariadb_cdc_client.aio.CdcClient` and :class:`mariadb_cdc_client.sync.SyncCdcClient`
follow a stream across failures the same way: a failed or dropped connection moves to the
next instance at once (:mod:`mariadb_cdc_client.endpoints`); once every instance has failed
in a row, the client waits before the next round, ``retry_delays`` one after the other (the
last one repeated); a record received starts the count again (a schema alone does not: a
quarantined table's stream is its schema and then ``ERR QUARANTINED``, and a server failing
after its schema would have its clients back ten times a second); after ``max_retries`` failures
in a row (None: never) the failure is the caller's. An error the server says is final (a
wrong password, an unknown table) is the caller's at once, but for one: a table this stream
has had records of that the server no longer knows (``NO-FILE``) is asked for again, for
``NO_FILE_RETRIES`` failures in a row. A service started over from its checkpoint (after a
crash, or a failing disk) removes what it stored after it and replays it from the binlog,
so a table created just before is unknown until the replay has created it again.
"""

from __future__ import annotations

import logging

from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.wire import Code, ProtocolError

log = logging.getLogger(__name__)

# What a connection may fail with and be tried again (EOFError: asyncio's IncompleteReadError)
FAILURES = (ConnectionError, EOFError, TimeoutError, OSError)
DELAYS = (0.1, 0.5, 1, 2, 5)
NO_FILE_RETRIES = 8  # a table streamed that the server no longer knows: about 25 s of tries


def retriable(exc: BaseException) -> bool:
    if isinstance(exc, ProtocolError):
        return exc.retriable
    return isinstance(exc, FAILURES)


class Reconnect:
    def __init__(self, endpoints: Endpoints, delays: tuple[float, ...] = DELAYS,
                 max_retries: int | None = None) -> None:
        self.endpoints = endpoints
        self.delays = delays
        self.max_retries = max_retries
        self.failures = 0  # in a row
        self.streamed = False  # a record of the stream arrived

    def received(self) -> None:
        """A record arrived: the connection works."""
        self.failures = 0
        self.streamed = True
        self.endpoints.succeeded()

    def failed(self, exc: BaseException) -> float:
        """Seconds to wait before connecting again (0: to the next instance at once); raises
        ``exc`` when it is final or the retries are spent."""
        if not (retriable(exc) or self._replaying(exc)) or (
                self.max_retries is not None and self.failures >= self.max_retries):
            raise exc
        tried = self.endpoints.describe()
        self.failures += 1
        if not self.endpoints.failed():
            log.warning("CDC connection to %s failed (%s); continuing on %s", tried, exc,
                        self.endpoints.describe())
            return 0.0
        rounds = (self.failures - 1) // len(self.endpoints.all)
        delay = self.delays[min(rounds, len(self.delays) - 1)]
        log.warning("CDC connection to %s failed (%s); retrying in %.1fs", tried, exc, delay)
        return delay

    def _replaying(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the server does not know a table this stream has had
        records of, within the tries such a table gets (see the module's description)."""
        return isinstance(exc, ProtocolError) and exc.code is Code.NO_FILE and \
            self.streamed and self.failures < NO_FILE_RETRIES
