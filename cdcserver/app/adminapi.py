"""The admin API and the web console as a component (docs/admin.md), with a token file only.

Turned off (``admin.enabled`` false) it imports nothing: aiohttp takes half a second to
import, for nothing. On, it serves on its own listener and samples each client's rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cdcserver.app.lifecycle import Loops
from cdcserver.app.runner import ReplicationRunner
from cdcserver.app.stored import StoredData
from cdcserver.core.config import Config
from cdcserver.core.errors import ConfigError
from cdcserver.dump.scheduler import DumpScheduler
from cdcserver.ops.metrics import ServiceStats
from cdcserver.ops.probes import live, ready
from cdcserver.protocol.server import CdcServer

if TYPE_CHECKING:
    from cdcserver.app.adminview import ServiceView
    from cdcserver.ops.admin import AdminServer


class AdminApi:
    def __init__(self, config: Config, data: StoredData, runner: ReplicationRunner,
                 server: CdcServer, scheduler: DumpScheduler,
                 stats: Callable[[], ServiceStats]) -> None:
        self.config = config.admin
        self.view: ServiceView | None = None  # None: turned off
        self.server: AdminServer | None = None
        self.address: tuple[str, int] | None = None  # once listening
        self._loops = Loops()
        if not self.config.enabled:
            return
        from cdcserver.app.adminview import ServiceView
        from cdcserver.ops.admin import AdminServer, TokenFile

        self.view = ServiceView(config, data, runner, server, scheduler, stats)
        self.server = AdminServer(self.view, TokenFile(self.config.token_file), {
            "/live": lambda: live(runner.stats()),
            "/ready": lambda: ready(stats()),
        })

    async def start(self) -> None:
        if self.server is None or self.view is None:
            return
        cfg = self.config
        try:
            self.address = await self.server.start(*cfg.host_port(), ssl=cfg.tls_context())
        except OSError as exc:
            await self.server.stop()  # what start set up before the address was refused
            raise ConfigError(f"admin.listen {cfg.listen}: {exc.strerror}; choose another "
                              "HOST:PORT (--admin-listen)") from exc
        self._loops.spawn(self.view.sample(), "admin rates")

    async def stop(self) -> None:
        await self._loops.cancel()
        if self.server is not None:
            await self.server.stop()
