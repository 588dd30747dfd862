"""Python client for the CDC protocol (MaxScale-compatible), async and blocking.

    from client import CdcClient, ChangeRecord, SchemaChange

    async with CdcClient("127.0.0.1", 4001, "cdcuser", "cdcpass") as cdc:
        async for event in cdc.stream("shop.orders"):
            if isinstance(event, SchemaChange):
                print("version", event.version, [f.column for f in event.columns])
            else:
                print(event.event_type, event.gtid, event.values)
"""

from client.aio import CdcClient, CdcConnection
from client.stream import ChangeRecord, Event, SchemaChange
from client.sync import SyncCdcClient, SyncCdcConnection
from client.wire import Code, Format, ProtocolError

__all__ = [
    "CdcClient", "CdcConnection", "ChangeRecord", "Code", "Event", "Format", "ProtocolError",
    "SchemaChange", "SyncCdcClient", "SyncCdcConnection",
]
