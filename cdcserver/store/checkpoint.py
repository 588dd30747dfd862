"""The store's checkpoint: where replication stands and how much of each file that covers.

A checkpoint is the binlog position after the last transaction that is durable in the store
and, for each table, the newest version and its committed size at that moment. It lives in two
files in ``state/``:

- ``checkpoint.json``, the base: a whole checkpoint, replaced only through a temporary file,
  ``fsync`` and an atomic ``rename`` (then the directory is fsynced);
- ``checkpoint.log``, the journal: one line per checkpoint written since the base, holding
  the position and the marks of only the tables that changed since the checkpoint before,
  appended and made durable with one ``fdatasync``. Each line is ``<crc32> <json>`` and
  numbered (``seq``), so a line torn by a crash is recognised and ignored, and the line
  before it is the checkpoint.

Writing a checkpoint therefore costs the tables that changed, not every table there is (with
thousands of tables the whole list is hundreds of kilobytes); once the journal outgrows the
base, the next checkpoint is written as a new base and the journal is emptied. Checkpoints are
written only after the files they cover were fsynced, so after a crash at any instant the last
whole one describes data that is on disk. On start the store cuts every newest version back
to its recorded size and removes versions the checkpoint does not know: what was written
after the checkpoint is read again from the binlog.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass, field, replace

from cdcserver.core.durable import fsync_dir, write_all, write_atomically
from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import BinlogPosition, GtidState
from cdcserver.core.names import TableName

FORMAT = 1
JOURNAL_MIN_BYTES = 64 * 1024  # below this the journal is never folded into the base


@dataclass(frozen=True)
class TableMark:
    version: int
    size: int


@dataclass(frozen=True)
class Quarantined:
    """Why a table's stream stopped, since which transaction, and since when (Unix time)."""

    cause: str
    since: str  # the GTID of the transaction it stopped at
    at: float

    def to_json(self, table: TableName) -> dict[str, object]:
        return {"database": table.database, "table": table.table, "cause": self.cause,
                "since": self.since, "at": self.at}


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
    seq: int = 0  # the checkpoint's number: the base's, or its journal line's
    # Tables whose stream stopped at a transaction the checkpoint covers (a resync, later,
    # brings them back): every line holds them all, they are few.
    quarantined: dict[TableName, Quarantined] = field(default_factory=dict)

    def head_json(self) -> dict[str, object]:
        """Everything but the tables' marks."""
        return {
            "format": FORMAT,
            "seq": self.seq,
            "position": self.position.to_json() if self.position else None,
            "fresh": [[t.database, t.table] for t in sorted(self.fresh)],
            "written_at": self.written_at,
            "origin": self.origin.to_json() if self.origin else None,
            "index_ordinal": self.index_ordinal,
            "quarantined": [q.to_json(t) for t, q in sorted(self.quarantined.items())],
        }

    def to_json(self) -> dict[str, object]:
        tables = [{"database": t.database, "table": t.table, "version": m.version,
                   "size": m.size} for t, m in sorted(self.tables.items())]
        return {**self.head_json(), "tables": tables}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Checkpoint:
        tables = {
            TableName(str(t["database"]), str(t["table"])): TableMark(int(t["version"]),
                                                                     int(t["size"]))
            for t in data["tables"]  # type: ignore[attr-defined]
        }
        return _with_head(cls(None, tables), data)


def _with_head(checkpoint: Checkpoint, data: dict[str, object]) -> Checkpoint:
    """``checkpoint`` with the head (position, fresh tables, ...) of a base or journal line."""
    if data.get("format") != FORMAT:
        raise StoreError(f"checkpoint format {data.get('format')!r} is not {FORMAT}")
    raw, origin, ordinal = data["position"], data.get("origin"), data.get("index_ordinal")
    return replace(
        checkpoint,
        position=BinlogPosition.from_json(raw) if raw else None,  # type: ignore[arg-type]
        written_at=float(data.get("written_at", 0.0)),  # type: ignore[arg-type]
        fresh=frozenset(TableName(*t) for t in data.get("fresh", [])),  # type: ignore[attr-defined]
        origin=BinlogPosition.from_json(origin) if origin else None,  # type: ignore[arg-type]
        index_ordinal=int(ordinal) if ordinal is not None else None,  # type: ignore[call-overload]
        seq=int(data.get("seq", 0)),  # type: ignore[call-overload]
        quarantined={TableName(str(q["database"]), str(q["table"])): Quarantined(
            str(q["cause"]), str(q["since"]), float(q["at"]))
            for q in data.get("quarantined", [])})  # type: ignore[attr-defined]


def journal_path(path: str) -> str:
    """The journal beside a checkpoint's base (``checkpoint.json`` -> ``checkpoint.log``)."""
    return os.path.splitext(path)[0] + ".log"


def load(path: str) -> Checkpoint | None:
    """The newest whole checkpoint: the base at ``path`` and the journal lines after it.

    The writer replaces the base, then empties the journal; a reader in between could pair
    the old base with a journal emptied or cut short under it (a checkpoint older than one
    it saw before). So the reader takes the journal only if the base is still the file it
    read afterwards, and otherwise reads both again."""
    for _ in range(1000):
        read = _load_base(path)
        if read is None:
            return None
        base, inode = read
        checkpoint = _replay(base, _journal_lines(journal_path(path)))
        if checkpoint is not None and _inode(path) == inode:
            return checkpoint
    raise StoreError(f"{path} keeps changing under the reader; is a writer looping?")


def covered_state(path: str) -> GtidState:
    """The GTID state the checkpoint at ``path`` covers (empty when there is none yet)."""
    checkpoint = load(path)
    if checkpoint is None or checkpoint.position is None:
        return GtidState()
    return checkpoint.position.gtid_state


def _load_base(path: str) -> tuple[Checkpoint, int] | None:
    try:
        with open(path, "rb") as f:
            return Checkpoint.from_json(json.loads(f.read())), os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path} is unreadable: {exc}") from exc


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _journal_lines(path: str) -> list[tuple[int, dict[str, object]]]:
    """The journal's whole lines, each with the offset after it; the first torn or
    damaged line ends it (only the last append can be torn)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines, pos = [], 0
    while (end := data.find(b"\n", pos)) >= 0:
        record = _parse_line(data[pos:end])
        if record is None:
            break
        pos = end + 1
        lines.append((pos, record))
    return lines


def _parse_line(line: bytes) -> dict[str, object] | None:
    crc, _, body = line.partition(b" ")
    try:
        if int(crc, 16) != zlib.crc32(body):
            return None
        record: dict[str, object] = json.loads(body)
    except ValueError:
        return None
    return record


def _replay(base: Checkpoint, lines: list[tuple[int, dict[str, object]]]
            ) -> Checkpoint | None:
    """``base`` with the journal's lines after it applied in order; None when the journal
    starts past the base (a newer base was written meanwhile)."""
    checkpoint, tables = base, None
    for _, record in lines:
        seq = int(record["seq"])  # type: ignore[call-overload]
        if seq <= checkpoint.seq:
            continue  # folded into the base already
        if seq != checkpoint.seq + 1:
            return None
        if tables is None:
            tables = dict(base.tables)
        for database, table, version, size in record["marks"]:  # type: ignore[attr-defined]
            tables[TableName(database, table)] = TableMark(version, size)
        for database, table in record["gone"]:  # type: ignore[attr-defined]
            tables.pop(TableName(database, table), None)
        checkpoint = _with_head(checkpoint, record)
    return checkpoint if tables is None else replace(checkpoint, tables=tables)


def save(path: str, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` whole as the base, atomically (the journal is left as it is:
    its lines up to the base's ``seq`` are skipped by readers)."""
    data = dict(checkpoint.to_json(), written_at=time.time())
    write_atomically(path, json.dumps(data, indent=1).encode("utf-8"))


class CheckpointWriter:
    """Writes the store's checkpoints: a journal line with the tables that changed, or,
    once the journal has grown past the base, a new base and an empty journal.

    Used by one flush at a time. Keeps every table's mark as last written, which the new
    bases are made of."""

    def __init__(self, path: str, checkpoint: Checkpoint) -> None:
        self.path = path
        self.journal = journal_path(path)
        self.tables = dict(checkpoint.tables)
        self.seq = checkpoint.seq
        self._base_bytes = JOURNAL_MIN_BYTES
        self._journal_bytes = 0
        self.compact(checkpoint)  # a clean start: no torn line, nothing to replay

    def write(self, checkpoint: Checkpoint, changed: dict[TableName, TableMark | None]
              ) -> None:
        """Make ``checkpoint`` durable; ``changed`` holds the marks that differ from the
        previous checkpoint's (None: the table has no version any more). Its ``tables``
        are ignored: they are the previous ones with ``changed`` applied. On a failure
        nothing changes here (the caller passes the same tables again next time)."""
        seq = self.seq + 1
        stamped = replace(checkpoint, seq=seq, written_at=time.time())
        line = self._line(stamped, changed)
        if self._journal_bytes + len(line) <= self._base_bytes:
            self._append(line)
            _apply(self.tables, changed)
            self.seq = seq
            return
        tables = dict(self.tables)
        _apply(tables, changed)
        save(self.path, replace(stamped, tables=tables))
        self.tables, self.seq = tables, seq  # durable from here, whatever follows fails
        self._empty_journal()

    def compact(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` with every table as the new base, then empty the journal."""
        save(self.path, replace(checkpoint, tables=dict(self.tables), seq=self.seq))
        self._empty_journal()

    def _empty_journal(self) -> None:
        self._base_bytes = max(JOURNAL_MIN_BYTES, os.path.getsize(self.path))
        new = not os.path.exists(self.journal)
        fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(os.path.dirname(self.journal) or ".")
        self._journal_bytes = 0

    def _line(self, checkpoint: Checkpoint, changed: dict[TableName, TableMark | None]
              ) -> bytes:
        record = checkpoint.head_json()
        record["marks"] = [[t.database, t.table, m.version, m.size]
                           for t, m in changed.items() if m is not None]
        record["gone"] = [[t.database, t.table] for t, m in changed.items() if m is None]
        body = json.dumps(record, separators=(",", ":")).encode("utf-8")
        return b"%08x %s\n" % (zlib.crc32(body), body)

    def _append(self, line: bytes) -> None:
        """One durable append; on a failure the journal is cut back to where it was, so
        no torn line stays in front of the next one."""
        fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            try:
                write_all(fd, line)
                os.fdatasync(fd)
            except OSError:
                os.ftruncate(fd, self._journal_bytes)
                raise
        finally:
            os.close(fd)
        self._journal_bytes += len(line)


def _apply(tables: dict[TableName, TableMark], changed: dict[TableName, TableMark | None]
           ) -> None:
    for table, mark in changed.items():
        if mark is None:
            tables.pop(table, None)
        else:
            tables[table] = mark
