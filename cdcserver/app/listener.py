"""The listener as a component: the CDC protocol's server over the stored data.

Built with everything its sessions read (the catalog, the users, the store's index, the dumps,
what replication has applied); started after the stored data (it serves what is stored, even
while the source does not answer), stopped after replication, so that a client reads until
the final checkpoint is written.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Awaitable, Callable

from cdcserver.app.replicating import Replication
from cdcserver.app.startup import cannot_listen
from cdcserver.app.stored import StoredData
from cdcserver.core.config import Config
from cdcserver.core.gtid import GtidState
from cdcserver.dump.retention import Cleaner
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.ops.latency import CommitLatency
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.scram import LoginSecret
from cdcserver.protocol.server import CdcServer
from cdcserver.protocol.throttle import LoginThrottle
from mariadb_cdc_client.format.wire import Dialect


class Listener:
    def __init__(self, config: Config, data: StoredData, replication: Replication,
                 scheduler: DumpScheduler, cleaner: Cleaner, latency: CommitLatency | None,
                 caught_up: Callable[[GtidState], Awaitable[None]]) -> None:
        cfg = self.config = config.listener
        self._secret = LoginSecret(data.layout.login_secret)
        store = data.store
        context = SessionContext(data.catalog, data.users, lambda: store.index,
                                 config.store.data_dir, caught_up, replication.stored_state,
                                 dialect=Dialect(cfg.json_dialect),
                                 throttle=LoginThrottle(cfg.login_failures,
                                                        max_wait=cfg.login_lockout),
                                 dumps=scheduler, capture=replication.capture,
                                 login_secret=self._secret)
        self.server = CdcServer(context, cfg, zoneinfo.ZoneInfo(cfg.timestamp_zone),
                                databus_labels=config.kafka.databus_labels,
                                dump_released=cleaner.wake,
                                delivered=latency.delivered if latency is not None else None)
        self.address: tuple[str, int] | None = None  # once listening

    async def start(self) -> None:
        self._secret.load()
        host, port = self.config.host_port()
        try:
            self.address = await self.server.start(host, port, ssl=self.config.tls_context())
        except OSError as exc:
            raise cannot_listen(self.config.listen, exc) from exc

    async def stop(self) -> None:
        await self.server.stop()
