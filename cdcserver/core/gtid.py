"""GTIDs, GTID states and binlog positions.

MariaDB names a transaction ``domain-server_id-sequence``. Within one replication domain the
sequence numbers grow in binlog order (the property ``gtid_strict_mode`` enforces), so "has this
transaction been applied?" is a per-domain comparison and a GTID *state* is one GTID per domain
(https://mariadb.com/kb/en/gtid/#the-gtid_slave_pos-and-gtid_binlog_pos-variables).

MySQL names a transaction ``source_uuid:number``. It is recorded with domain 0, the event's
server_id and ``sequence = number``; its state is kept per source UUID as the highest number seen,
which is exact for a replica that reads one binlog in order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, KeysView
from dataclasses import dataclass

from cdcserver.core.errors import ConfigError
from mariadb_cdc_client.format.gtid import (
    MARIADB_GTID,
    MAX_U64,
    MYSQL_GTID,
    MYSQL_SET_ITEM,
    in_range,
)


@dataclass(frozen=True, slots=True)
class Gtid:
    domain: int
    server_id: int
    sequence: int
    source_uuid: str | None = None  # MySQL only

    @classmethod
    def parse(cls, text: str) -> Gtid:
        """Parse ``D-S-N`` (MariaDB) or ``uuid:N`` (MySQL)."""
        text = text.strip()
        if (m := MARIADB_GTID.match(text)) and in_range(int(m[1]), int(m[2]), int(m[3])):
            return cls(int(m[1]), int(m[2]), int(m[3]))
        if (m := MYSQL_GTID.match(text)) and int(m[2]) <= MAX_U64:
            return cls(0, 0, int(m[2]), m[1].lower())
        raise ValueError(f"not a GTID: {text!r} (expected domain-server_id-sequence, each "
                         "within MariaDB's range)")

    @property
    def key(self) -> int | str:
        """What a GTID state keeps one entry per: the domain, or the MySQL source UUID."""
        return self.source_uuid if self.source_uuid is not None else self.domain

    def __str__(self) -> str:
        if self.source_uuid is not None:
            return f"{self.source_uuid}:{self.sequence}"
        return f"{self.domain}-{self.server_id}-{self.sequence}"


class GtidState:
    """The last transaction applied in each domain: immutable, cheap to advance."""

    __slots__ = ("_by_key",)

    def __init__(self, gtids: Iterable[Gtid] = ()) -> None:
        self._by_key: dict[int | str, Gtid] = {g.key: g for g in gtids}

    @classmethod
    def parse(cls, text: str) -> GtidState:
        """Parse MariaDB's ``0-1-5,1-2-9`` or a MySQL set ``uuid:1-9,uuid2:1-3``."""
        gtids = []
        for item in filter(None, (p.strip() for p in text.replace("\n", "").split(","))):
            if m := MYSQL_SET_ITEM.match(item):
                gtids.append(Gtid(0, 0, int(m[2]), m[1].lower()))
            else:
                gtids.append(Gtid.parse(item))
        return cls(gtids)

    def advanced(self, gtid: Gtid) -> GtidState:
        state = GtidState()
        state._by_key = {**self._by_key, gtid.key: gtid}
        return state

    def covers(self, gtid: Gtid) -> bool:
        """True if ``gtid`` is at or before this state in its domain."""
        last = self._by_key.get(gtid.key)
        return last is not None and last.sequence >= gtid.sequence

    def get(self, key: int | str) -> Gtid | None:
        return self._by_key.get(key)

    def __iter__(self) -> Iterator[Gtid]:
        return iter(sorted(self._by_key.values(), key=lambda g: (str(g.key), g.domain)))

    def sequences(self) -> frozenset[tuple[int | str, int]]:
        """Each domain's last sequence number: equal for two states that are
        :func:`same_state` (a quick test that tells most apart)."""
        return frozenset((k, g.sequence) for k, g in self._by_key.items())

    def keys(self) -> KeysView[int | str]:
        """The domains (MySQL: source UUIDs) it names, unordered (iterating sorts)."""
        return self._by_key.keys()

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidState) and self._by_key == other._by_key

    def __hash__(self) -> int:
        return hash(frozenset(self._by_key.items()))

    def __str__(self) -> str:
        return ",".join(
            f"{g.source_uuid}:1-{g.sequence}" if g.source_uuid else str(g) for g in self
        )

    def __repr__(self) -> str:
        return f"GtidState({str(self)!r})"

    def minimum(self, other: GtidState) -> GtidState:
        """Per domain, the earlier of the two; a domain missing on either side is dropped,
        because a state without it means "from the beginning of that domain"."""
        keys = self._by_key.keys() & other._by_key.keys()
        return GtidState(
            min(self._by_key[k], other._by_key[k], key=lambda g: g.sequence) for k in keys
        )


def same_transaction(a: Gtid | None, b: Gtid | None) -> bool:
    """Whether two GTIDs name one transaction (a MySQL GTID is its source UUID and number;
    a state parsed from ``uuid:1-N`` does not know the server_id)."""
    if a is None or b is None:
        return False
    if a.source_uuid is not None or b.source_uuid is not None:
        return a.key == b.key and a.sequence == b.sequence
    return a == b


def same_state(a: GtidState, b: GtidState) -> bool:
    """Whether two states name the same last transaction in every domain."""
    keys = a.keys()  # (not ``for k in a``: iterating a state sorts it)
    return keys == b.keys() and all(same_transaction(a.get(k), b.get(k)) for k in keys)


def binlog_ordinal(file: str, pos: int) -> tuple[int, int]:
    """A binlog position as something that orders: (the file's number, the offset)."""
    return _file_number(file), pos


@functools.lru_cache(maxsize=64)
def _file_number(file: str) -> int:
    """A binlog file's number (``mysql-bin.000042``: 42), kept for the few files in use: a
    lagging stream compares every event with each waiting repair's watermark."""
    return int(file.rsplit(".", 1)[-1]) if file and "." in file else 0


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """Where a replica stands: its GTID state and the primary's binlog coordinates."""

    gtid_state: GtidState
    file: str
    pos: int

    def to_json(self) -> dict[str, object]:
        return {"gtid": str(self.gtid_state), "file": self.file, "pos": self.pos}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> BinlogPosition:
        try:
            return cls(GtidState.parse(str(data["gtid"])), str(data["file"]), int(str(data["pos"])))
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"malformed binlog position {data!r}: {exc}") from exc
