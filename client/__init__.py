"""Python client for the CDC protocol (MaxScale-compatible), async and blocking.

    from mariadb_cdc_client import CdcClient, ChangeRecord, SchemaChange

    async with CdcClient("127.0.0.1", 4001, "cdcuser", "cdcpass") as cdc:
        async for event in cdc.stream("shop.orders"):
            if isinstance(event, SchemaChange):
                print("version", event.version, [f.column for f in event.columns])
            else:
                print(event.event_type, event.gtid, event.values)

The names below are loaded when first used, so that importing
:mod:`mariadb_cdc_client.format` (the wire format the service shares) loads nothing else; so
is ``__version__``, the installed distribution's version (pyproject.toml's).

The import name was ``client`` up to 0.1.0; that name still works, deprecated, until the next
release (``client/_legacy/client``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CdcClient": "mariadb_cdc_client.aio", "CdcConnection": "mariadb_cdc_client.aio",
    "ChangeRecord": "mariadb_cdc_client.stream", "Event": "mariadb_cdc_client.stream",
    "SchemaChange": "mariadb_cdc_client.stream",
    "SyncCdcClient": "mariadb_cdc_client.sync", "SyncCdcConnection": "mariadb_cdc_client.sync",
    "Code": "mariadb_cdc_client.format.wire", "Format": "mariadb_cdc_client.format.wire",
    "ProtocolError": "mariadb_cdc_client.format.wire",
    "table_ref": "mariadb_cdc_client.format.names",
    "parse_table": "mariadb_cdc_client.format.names",
}

__all__ = [
    "CdcClient", "CdcConnection", "ChangeRecord", "Code", "Event", "Format", "ProtocolError",
    "SchemaChange", "SyncCdcClient", "SyncCdcConnection", "parse_table", "table_ref",
]

if TYPE_CHECKING:
    from mariadb_cdc_client.aio import CdcClient, CdcConnection
    from mariadb_cdc_client.format.names import parse_table, table_ref
    from mariadb_cdc_client.format.wire import Code, Format, ProtocolError
    from mariadb_cdc_client.stream import ChangeRecord, Event, SchemaChange
    from mariadb_cdc_client.sync import SyncCdcClient, SyncCdcConnection

    __version__: str


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _version()
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mariadb_cdc_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _version() -> str:
    from mariadb_cdc_client.format.version import installed_version

    return installed_version()
