"""What the repair stage counts for /metrics, /health and ``cdcserver status``: rowless
changes recognised, records emitted to repair them, resyncs, and the last repairs out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cdcserver.core.names import TableName

RECENT = 20  # repairs /health names


@dataclass
class RepairStats:
    """Counted for /metrics: rowless changes recognised and records emitted to repair them."""

    rowless: dict[str, int] = field(default_factory=dict)  # by kind of cause
    repairs: int = 0  # repairs attached to the stream
    records: dict[str, int] = field(default_factory=dict)  # by event type
    resyncs: list[float] = field(default_factory=list)  # seconds each took (asked to done)
    widened: int = 0  # repairs of named rows that read the whole table instead
    # The last repairs out, newest last: what happened to which table and when it was
    # repaired (/health, `cdcserver status`, the admin API)
    recent: list[dict[str, Any]] = field(default_factory=list)

    def repaired(self, table: TableName, reason: str, cause: str, records: int) -> None:
        self.recent = [*self.recent, {"table": str(table), "reason": reason, "cause": cause,
                                      "records": records, "at": time.time()}][-RECENT:]
