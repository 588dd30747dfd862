"""How one run of dumps goes: the configuration's ``[dump]`` section and the run's own flag."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdcserver.core.config import DumpConfig


@dataclass(frozen=True)
class DumpOptions:
    """The ``[dump]`` settings, and whether to discard an interrupted attempt instead of
    continuing it (``cdcserver dump --restart``)."""

    config: DumpConfig = field(default_factory=DumpConfig)
    restart: bool = False
