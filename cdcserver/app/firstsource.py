"""Which source replication reads first, and where a new store starts on it.

The first source, in order of preference, that answers and passes the preflight checks is
read; while none answers, the runner retries (the listener serves meanwhile). A store without a
checkpoint starts at ``source.start_gtid``: the oldest or newest position the source holds, or
the given GTID state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from cdcserver.core.config import SourceAddress, SourceConfig
from cdcserver.core.errors import ConfigError, SourceError, SourceUnavailable
from cdcserver.core.gtid import BinlogPosition, GtidState
from cdcserver.core.retry import Backoff
from cdcserver.replication import preflight, source
from cdcserver.replication.sources import Sources
from cdcserver.sinks.base import SourceInfo

log = logging.getLogger("cdcserver.app.runner")  # as before: operators grep for it
T = TypeVar("T")


def choose_source(sources: Sources, config: SourceConfig) -> tuple[BinlogPosition, SourceInfo]:
    """The first source, in order of preference, that answers and can be captured
    becomes the one read; unavailable while none answers, refused if none can be
    captured."""
    failures: list[SourceError] = []
    order = [sources.index] + [i for i in range(len(sources.addresses))
                               if i != sources.index]
    for index in order:
        try:
            found = check_source(sources.addresses[index], config)
        except SourceError as exc:
            failures.append(exc)
            continue
        if sources.several and not found[1].mariadb:
            raise ConfigError("several sources need MariaDB (its GTIDs name a transaction "
                              "on every server); give one MySQL source")
        sources.switch(index)
        for failure in failures:
            log.warning("not reading it: %s", failure)
        return found
    if all(isinstance(f, SourceUnavailable) for f in failures):
        raise failures[0]
    raise next(f for f in failures if not isinstance(f, SourceUnavailable))


def check_source(address: SourceAddress, config: SourceConfig
                 ) -> tuple[BinlogPosition, SourceInfo]:
    """Where to start without a checkpoint, and what the source is."""
    conn = source.connect(address)
    try:
        report = preflight.check_connection(conn, address.describe(), config.server_id)
        if report.fatal:
            raise SourceError(report.refusal() + "\n(`cdcserver check` prints every "
                              "finding)")
        for finding in report.warnings:
            log.warning("preflight: %s", finding.text())
        info = report.info
        assert info is not None
        flavor = SourceInfo(mariadb=info.flavor == "mariadb")
        wanted = config.start_gtid.strip()  # checked when the configuration loaded
        if wanted == "oldest":
            return source.oldest_position(conn, info), flavor
        if wanted == "newest":
            return source.newest_position(conn, info), flavor
        return BinlogPosition(GtidState.parse(wanted), "", 4), flavor
    finally:
        conn.close()


async def retrying(action: Callable[[], T]) -> T:
    """Run ``action`` in a thread until the source answers (the listener keeps serving)."""
    backoff = Backoff()
    while True:
        try:
            return await asyncio.to_thread(action)
        except SourceUnavailable as exc:
            delay = backoff.failed()
            log.warning("%s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
