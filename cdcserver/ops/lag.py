"""How far behind the source the service is, in transactions and in seconds.

Every ``interval`` seconds the probe asks the source for its GTID position (an ordinary SQL
connection, in a thread) and compares it with what every sink has applied. Transactions behind
are counted per replication domain from the sequence numbers; seconds behind are the age of
the newest applied commit while any transaction is missing (0 when none is: an idle source is
not a lagging one). A source that cannot be asked leaves the last figures in place and says so
(``error``), which ``/health`` reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import CdcError
from cdcserver.core.gtid import GtidState
from cdcserver.replication import source as source_sql
from cdcserver.replication.sources import Sources

log = logging.getLogger(__name__)


@dataclass
class Lag:
    transactions: int | None = None  # None until the source first answered
    seconds: float | None = None
    measured_at: float = 0.0  # time.time() of the last answer
    error: str = ""  # why the last probe failed ("" when it did not)


def transactions_behind(source: GtidState, applied: GtidState) -> int:
    """Per domain (per source UUID for MySQL), the source's sequence minus the applied one."""
    behind = 0
    for gtid in source:
        done = applied.get(gtid.domain)
        behind += max(0, gtid.sequence - (done.sequence if done is not None else 0))
    return behind


class LagProbe:
    def __init__(self, address: SourceAddress | Sources, applied: Callable[[], GtidState],
                 last_commit: Callable[[], float | None], interval: float) -> None:
        self.sources = Sources.of(address)
        self.applied = applied  # what every sink has applied
        self.last_commit = last_commit  # the source timestamp of the newest applied commit
        self.interval = interval
        self.lag = Lag()

    @property
    def address(self) -> SourceAddress:
        """The server being read now (it changes when the service moves to another)."""
        return self.sources.current

    async def run(self) -> None:
        while True:
            await self.measure()
            await asyncio.sleep(self.interval)

    async def measure(self) -> Lag:
        try:
            head = await asyncio.to_thread(self._source_position)
        except (CdcError, OSError) as exc:
            self.lag.error = str(exc)
            return self.lag
        except Exception as exc:  # noqa: BLE001 - a probe must not end the service
            log.warning("lag probe failed: %s", exc)
            self.lag.error = str(exc)
            return self.lag
        behind = transactions_behind(head, self.applied())
        committed = self.last_commit()
        now = time.time()
        if behind == 0:
            seconds: float | None = 0.0
        else:
            seconds = max(0.0, now - committed) if committed is not None else None
        self.lag = Lag(behind, seconds, now)
        return self.lag

    def _source_position(self) -> GtidState:
        conn = source_sql.connect(self.address)
        try:
            return source_sql.newest_position(conn, source_sql.describe(conn)).gtid_state
        finally:
            conn.close()
