"""Several service instances behind one client: ``host`` may name them all.

``CdcClient("cdc1,cdc2:4002", 4001, ...)`` (and ``SyncCdcClient``, the Spark source's
``host`` option, ``cdc --host``) connects to the first; when a connection fails or drops it
moves to the next at once, and waits (with the client's backoff) only after every one has
failed in a row. Instances that replicate the same source give the same stream (the same
versions, GTIDs and event numbers), so a stream continues on the next instance right after
the last record delivered, with nothing lost and nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def parse_endpoints(host: str, port: int) -> list[tuple[str, int]]:
    """``HOST[:PORT][,HOST[:PORT]...]`` (an IPv6 address in brackets, ``[::1]:4001``) as
    (host, port) pairs; ``port`` is the port of those that name none."""
    endpoints = []
    for item in (part.strip() for part in host.split(",")):
        if not item:
            continue
        if item.startswith("["):
            name, _, rest = item[1:].partition("]")
            number = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            name, _, number = item.partition(":")
        else:
            name, number = item, ""  # a bare IPv6 address, or a name
        try:
            endpoints.append((name, int(number) if number else port))
        except ValueError:
            raise ValueError(f"{item!r} is not HOST or HOST:PORT") from None
    if not endpoints:
        raise ValueError("no server address given")
    return endpoints


@dataclass
class Endpoints:
    """The instances, and the one in use."""

    all: list[tuple[str, int]]
    index: int = 0
    _streak: int = field(default=0, repr=False)  # failures in a row

    @classmethod
    def of(cls, host: str, port: int) -> Endpoints:
        return cls(parse_endpoints(host, port))

    @property
    def current(self) -> tuple[str, int]:
        return self.all[self.index]

    def describe(self) -> str:
        host, port = self.current
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def failed(self) -> bool:
        """The one in use failed: move to the next; True when every one has failed since
        the last success (then wait before trying again)."""
        self._streak += 1
        self.index = (self.index + 1) % len(self.all)
        return self._streak % len(self.all) == 0

    def succeeded(self) -> None:
        self._streak = 0
