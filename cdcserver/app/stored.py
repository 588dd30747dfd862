"""The stored data as a component: the data directory, its catalog and store, and the users
file.

Started first: the users file must exist, the data directory is created private to the service
(or the start stops in one line), the users are read (each malformed line is warned about and
skipped), and the store opens, which repairs it back to its checkpoint. Stopped last: the store
closes once nothing writes or reads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cdcserver.app.startup import check_users_file, unusable_data_dir
from cdcserver.core.config import Config
from cdcserver.core.durable import private_files
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.store import AvroStore


class StoredData:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.layout = DataDir(config.store.data_dir)
        self.catalog = Catalog(self.layout.avro)
        self.store = AvroStore(config.store.data_dir, self.catalog, codec=config.store.codec,
                               block_size=config.store.block_size,
                               max_open_files=config.store.max_open_files)
        self.users = UsersFile(config.listener.users_file)

    async def start(self) -> None:
        check_users_file(self.config.listener.users_file)
        private_files(self.config.store.group_access)
        self._usable(self._create_data_dir)
        self.users.load()
        self._usable(self.store.open)

    async def stop(self) -> None:
        self.store.close()

    def _create_data_dir(self) -> None:
        os.makedirs(self.config.store.data_dir, exist_ok=True)
        self.layout.restrict(self.config.store.group_access)

    def _usable(self, action: Callable[[], object]) -> None:
        """Run ``action`` on the data directory; stop, in one line, when it cannot be used."""
        try:
            action()
        except OSError as exc:
            unusable = unusable_data_dir(self.config.store.data_dir, exc)
            if unusable is None:
                raise
            raise unusable from exc
