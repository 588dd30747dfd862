"""How one run of dumps goes: the configuration's ``[dump]`` section and the run's own flag."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdcserver.core.capture import NO_COLUMN_RULES, ColumnRules
from cdcserver.core.config import DumpConfig


@dataclass(frozen=True)
class DumpOptions:
    """The ``[dump]`` settings, whether to discard an interrupted attempt instead of
    continuing it (``cdcserver dump --restart``), and the ``[capture]`` column rules the
    rows are written under (set from the capture filter by ``dump_tables``)."""

    config: DumpConfig = field(default_factory=DumpConfig)
    restart: bool = False
    columns: ColumnRules = NO_COLUMN_RULES
