"""What a chunked dump records (:mod:`cdcserver.dump.chunked`): its key ranges and the chunks
read of them, the files that hold them, and the table as the dump read it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pymysql

from cdcserver.core.capture import NO_COLUMN_RULES, ColumnRules
from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.names import TableName
from cdcserver.dump.partial import PartialDump
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import (
    ER_NO_SUCH_TABLE,
    qualified,
)
from cdcserver.replication import source as source_sql
from cdcserver.schema import ddl
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.history import TRANSACTIONAL_ENGINES
from cdcserver.schema.layouts import layout_of
from cdcserver.schema.masking import project_definition
from cdcserver.store import checkpoint as ckpt
from cdcserver.store import writerlock
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import dump_stem
from cdcserver.store.schema import TableSchema

log = logging.getLogger(__name__)


class NotChunkable(CdcError):
    """This table is read in one snapshot instead; the message says why."""


class TableChanged(SourceError):
    """The table's definition changed during its dump: it starts over."""


@dataclass
class Chunk:
    start: int  # its bytes in the dump's body (offsets in the .partial file)
    end: int
    rows: int
    file: str  # the binlog position its read view was at: it holds every transaction that
    pos: int   # ends there or before


@dataclass
class KeyRange:
    lo: list[str] | None  # hex of the key values after which the range starts (None: first)
    hi: list[str] | None  # ... and of the last key it holds (None: to the table's end)
    after: list[str] | None = None  # the last key recorded
    rows: int = 0
    done: bool = False
    chunks: list[Chunk] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyRange:
        chunks = [Chunk(**c) for c in data.pop("chunks")]
        return cls(**data, chunks=chunks)


@dataclass
class ChunkedProgress:
    """What a killed dump continues from: the ranges in key order, those done and the
    chunks recorded of the one being appended; ``body``: the durable end of the body."""

    definition: str  # the SHOW CREATE TABLE the chunks were read with (normalised)
    fields: str  # fingerprint of the columns
    stream_version: int
    consistent: bool
    ranges: list[KeyRange]
    body: int = 0  # bytes of the .partial file that are good (reserved header included)
    resumed: bool = False
    # the source's GTID state before the first chunk (every transaction it covers is in
    # every chunk), and the server the chunks are read from (server_id@host:port)
    floor: str = ""
    server: str = ""
    # the binlog position of the snapshot the ranges were split in (the last range ends at
    # the last key there): changes are merged from there on ("": a dump recorded before
    # ranges ended there, whose last range is open; merged from its first chunk)
    split_file: str = ""
    split_pos: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkedProgress:
        return cls(data["definition"], data["fields"], int(data["stream_version"]),
                   bool(data["consistent"]), [KeyRange.from_json(r) for r in data["ranges"]],
                   int(data["body"]), bool(data.get("resumed", False)),
                   str(data.get("floor", "")), str(data.get("server", "")),
                   str(data.get("split_file", "")), int(data.get("split_pos", 0)))


Progressed = Callable[[TableName, int], None]


# -- files -------------------------------------------------------------------------------

def _progress_path(directory: str, table: TableName) -> str:
    return os.path.join(directory, f"{dump_stem(table)}.chunked")


def body_path(directory: str, table: TableName) -> str:
    """The body read, renamed here while the changes made meanwhile are merged into a new
    .partial."""
    return os.path.join(directory, f"{dump_stem(table)}.body")


def discard(directory: str, table: TableName) -> None:
    """Remove a table's unfinished chunked dump (its record and body; a single-snapshot
    attempt's .partial stays)."""
    if os.path.exists(_progress_path(directory, table)):
        PartialDump(directory, table).discard()
    for path in (_progress_path(directory, table), _progress_path(directory, table) + ".tmp",
                 body_path(directory, table)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def load(directory: str, table: TableName) -> ChunkedProgress | None:
    try:
        with open(_progress_path(directory, table), encoding="utf-8") as f:
            return ChunkedProgress.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("dump of %s: its chunk record is damaged (%s); starting over", table, exc)
        return None


def save(directory: str, table: TableName, progress: ChunkedProgress) -> None:
    path = _progress_path(directory, table)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(json.dumps(progress.to_json()))  # (json.dump encodes in Python, slowly)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


# -- the table ---------------------------------------------------------------------------

_AUTO_INCREMENT = re.compile(r" AUTO_INCREMENT=\d+")


def show_create(conn: Any, table: TableName) -> str:
    """SHOW CREATE TABLE without its AUTO_INCREMENT counter (which inserts move)."""
    try:
        text = str(source_sql.query(conn, f"SHOW CREATE TABLE {qualified(table)}")[0][1])
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else 0
        if code == ER_NO_SUCH_TABLE:
            raise SourceError(f"no table {table} on the source") from exc
        raise SourceError(f"cannot read the definition of {table}: {exc}") from exc
    return _AUTO_INCREMENT.sub("", text)


@dataclass
class Table:
    """What every chunk of one attempt is read with."""

    name: TableName
    text: str  # normalised SHOW CREATE TABLE
    definition: TableDefinition
    schema: TableSchema
    plan: ScanPlan
    fields: list[dict[str, Any]]
    fingerprint: str
    consistent: bool


def describe(conn: Any, table: TableName, stream_version: int,
             columns: ColumnRules = NO_COLUMN_RULES) -> Table:
    """The table as the dump reads and writes it: ``columns``, the [capture] column rules,
    applied to its definition."""
    text = show_create(conn, table)
    statement = ddl.parse(text, table.database)
    if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
        raise NotChunkable(f"cannot parse the definition of {table}")
    definition = project_definition(table, statement.definition, columns)
    schema = TableSchema.from_layout(layout_of(table, definition), max(stream_version, 1), "")
    plan = ScanPlan(table, definition, schema.columns, columns.salt)
    if not plan.chunked:
        raise NotChunkable(f"{table} has no primary key that can be read in ranges")
    fields = schema.avsc["fields"][6:]
    fingerprint = hashlib.sha256(json.dumps([fields, schema.avsc.get("primary_key")],
                                            sort_keys=True).encode()).hexdigest()
    return Table(table, text, definition, schema, plan, fields, fingerprint,
                  (definition.engine or "innodb") in TRANSACTIONAL_ENGINES)


def check_store(conn: Any, data_dir: str) -> str:
    """The merge takes the changes between chunks from the store: the service must be
    replicating into ``data_dir`` (it holds the store's writer lock; the merge waits for it
    to reach the dump's point), from the server the dump reads (binlog positions are
    compared with the store's, which only holds on one server). Returns which server it is."""
    if not writerlock.held(DataDir(data_dir).writer_lock):
        raise NotChunkable(f"the service is not replicating into {data_dir}")
    if ckpt.load(DataDir(data_dir).checkpoint) is None:
        raise NotChunkable(f"the service has stored nothing in {data_dir} yet")
    reading = service_source(data_dir)
    here = source_sql.server_identity(conn)
    if reading is None or reading[1] != here:
        raise NotChunkable(
            "the service reads another server" + (f" ({reading[0]}, {reading[1]})"
                                                  if reading else "") +
            f" than this dump ({here}): binlog positions of two servers cannot be compared")
    return here


def service_source(data_dir: str) -> tuple[str, str] | None:
    """The server the service reads (as it recorded when it connected), if it said."""
    try:
        with open(DataDir(data_dir).source, encoding="utf-8") as f:
            record = json.load(f)
        return str(record["source"]), str(record["server"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
