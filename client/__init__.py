"""Python client for the CDC protocol (MaxScale-compatible), async and blocking.

    from client import CdcClient, ChangeRecord, SchemaChange

    async with CdcClient("127.0.0.1", 4001, "cdcuser", "cdcpass") as cdc:
        async for event in cdc.stream("shop.orders"):
            if isinstance(event, SchemaChange):
                print("version", event.version, [f.column for f in event.columns])
            else:
                print(event.event_type, event.gtid, event.values)

The names below are loaded when first used, so that importing :mod:`client.format` (the wire
format the service shares) loads nothing else; so is ``__version__``, the installed
distribution's version (pyproject.toml's).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CdcClient": "client.aio", "CdcConnection": "client.aio",
    "ChangeRecord": "client.stream", "Event": "client.stream", "SchemaChange": "client.stream",
    "SyncCdcClient": "client.sync", "SyncCdcConnection": "client.sync",
    "Code": "client.format.wire", "Format": "client.format.wire",
    "ProtocolError": "client.format.wire",
    "table_ref": "client.format.names", "parse_table": "client.format.names",
}

__all__ = [
    "CdcClient", "CdcConnection", "ChangeRecord", "Code", "Event", "Format", "ProtocolError",
    "SchemaChange", "SyncCdcClient", "SyncCdcConnection", "parse_table", "table_ref",
]

if TYPE_CHECKING:
    from client.aio import CdcClient, CdcConnection
    from client.format.names import parse_table, table_ref
    from client.format.wire import Code, Format, ProtocolError
    from client.stream import ChangeRecord, Event, SchemaChange
    from client.sync import SyncCdcClient, SyncCdcConnection

    __version__: str


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _version()
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _version() -> str:
    from client.format.version import installed_version

    return installed_version()
