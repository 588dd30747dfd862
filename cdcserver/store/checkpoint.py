"""The store's checkpoint: where replication stands and how much of each file that covers.

``state/checkpoint.json`` holds the binlog position after the last transaction that is durable
in the store, and for each table the newest version and its committed size at that moment. It is
written only after the files it covers were fsynced, through a temporary file, ``fsync`` and an
atomic ``rename`` (then the directory is fsynced), so after a crash at any instant it is either
the old or the new checkpoint, never a mixture. On start the store cuts every newest version
back to its recorded size and removes versions the checkpoint does not know: what was written
after the checkpoint is read again from the binlog.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import BinlogPosition
from cdcserver.store.durable import write_atomically
from cdcserver.store.naming import TableName

FORMAT = 1


@dataclass(frozen=True)
class TableMark:
    version: int
    size: int


@dataclass(frozen=True)
class Checkpoint:
    """``position`` is None in a new data directory's first checkpoint (nothing stored yet),
    which is written before any data so that no file ever predates every checkpoint."""

    position: BinlogPosition | None
    tables: dict[TableName, TableMark] = field(default_factory=dict)
    written_at: float = 0.0
    fresh: frozenset[TableName] = frozenset()  # re-created tables awaiting their first rows
    # Where the store began replicating: nothing before it is stored (None: not recorded).
    origin: BinlogPosition | None = None
    # The ordinal of the last transaction in the index's log that the checkpoint covers
    # (None in checkpoints written before ordinals were kept).
    index_ordinal: int | None = None

    def to_json(self, with_tables: bool = True) -> dict[str, object]:
        tables = [{"database": t.database, "table": t.table, "version": m.version,
                   "size": m.size} for t, m in sorted(self.tables.items())] if with_tables else []
        return {
            "format": FORMAT,
            "position": self.position.to_json() if self.position else None,
            "tables": tables,
            "fresh": [[t.database, t.table] for t in sorted(self.fresh)],
            "written_at": self.written_at,
            "origin": self.origin.to_json() if self.origin else None,
            "index_ordinal": self.index_ordinal,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Checkpoint:
        if data.get("format") != FORMAT:
            raise StoreError(f"checkpoint format {data.get('format')!r} is not {FORMAT}")
        tables = {
            TableName(str(t["database"]), str(t["table"])): TableMark(int(t["version"]),
                                                                     int(t["size"]))
            for t in data["tables"]  # type: ignore[attr-defined]
        }
        raw = data["position"]
        position = BinlogPosition.from_json(raw) if raw else None  # type: ignore[arg-type]
        fresh = frozenset(TableName(*t) for t in data.get("fresh", []))  # type: ignore[attr-defined]
        origin = data.get("origin")
        ordinal = data.get("index_ordinal")
        return cls(position, tables, float(data.get("written_at", 0.0)),  # type: ignore[arg-type]
                   fresh, BinlogPosition.from_json(origin) if origin else None,  # type: ignore[arg-type]
                   int(ordinal) if ordinal is not None else None)  # type: ignore[call-overload]


def load(path: str) -> Checkpoint | None:
    try:
        with open(path, "rb") as f:
            return Checkpoint.from_json(json.loads(f.read()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path} is unreadable: {exc}") from exc


def save(path: str, checkpoint: Checkpoint, encoder: MarksEncoder | None = None) -> None:
    """Write ``checkpoint`` atomically: one line per table, the rest on the first lines.
    With an ``encoder`` (the store keeps one), only tables whose mark changed since the last
    save are encoded again."""
    data = dict(checkpoint.to_json(with_tables=False), written_at=time.time())
    del data["tables"]
    head = json.dumps(data, indent=1).encode("utf-8")
    tables = (encoder or MarksEncoder()).encode(checkpoint.tables)
    write_atomically(path, head[:-2] + b',\n "tables": ' + tables + b"\n}")


class MarksEncoder:
    """The ``tables`` array of checkpoints, each table's entry kept encoded until its mark
    changes: with thousands of tables a checkpoint re-encodes the few that changed, not all
    (a checkpoint is written every ``flush_interval``)."""

    def __init__(self) -> None:
        self._encoded: dict[TableName, tuple[TableMark, bytes]] = {}
        self._order: list[TableName] = []

    def encode(self, tables: dict[TableName, TableMark]) -> bytes:
        if len(self._order) != len(tables) or tables.keys() != self._encoded.keys():
            self._encoded = {t: e for t, e in self._encoded.items() if t in tables}
            self._order = sorted(tables)
        encoded = self._encoded
        entries = []
        for name in self._order:
            mark = tables[name]
            known = encoded.get(name)
            if known is None or known[0] != mark:
                known = encoded[name] = (mark, json.dumps(
                    {"database": name.database, "table": name.table, "version": mark.version,
                     "size": mark.size}).encode("utf-8"))
            entries.append(known[1])
        return b"[\n  " + b",\n  ".join(entries) + b"\n ]" if entries else b"[]"
