"""``cdcserver verify``: is a table's stream exactly its rows?

1. On the source, open a consistent snapshot (``START TRANSACTION WITH CONSISTENT SNAPSHOT``;
   MariaDB reports the binlog position it corresponds to in ``binlog_snapshot_file`` /
   ``binlog_snapshot_position``). No lock is taken and writes continue.
2. Wait until the service's checkpoint covers that position, so every transaction before it is
   complete in the store.
3. Replay the table's stream from its files, applying only the transactions at or before the
   snapshot position: inserts add rows, updates replace them (their before-image must match
   what is there), deletes remove them (likewise), a TRUNCATE, DROP or re-creation empties it
   (``replay.py``).
4. Read the table in the snapshot and compare the two row sets by primary-key chunks (a
   checksum per chunk; rows are compared only in chunks whose checksums differ).

Values are compared exactly: FLOAT by its 32-bit pattern (read as ``CAST(f AS DOUBLE)``,
which MariaDB prints exactly), DECIMAL by its digits and scale, TIMESTAMP as instants
(``canonical.py``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdcserver.core.capture import value_function
from cdcserver.core.config import SourceAddress
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.scan import select_expression
from cdcserver.ops.canonical import canonical, same
from cdcserver.ops.replay import Replay, replay_after_dump, replay_stream
from cdcserver.replication import source as source_sql
from cdcserver.store.reader import gtid_state_at, wait_for_checkpoint
from mariadb_cdc_client.format.schema import Field, Kind

CHUNK_ROWS = 1000


@dataclass
class Report:
    table: TableName
    snapshot: tuple[str, int]
    source_rows: int = 0
    stream_rows: int = 0
    chunks: int = 0
    missing: list[tuple[Any, ...]] = field(default_factory=list)  # in the table, not the stream
    extra: list[tuple[Any, ...]] = field(default_factory=list)  # in the stream, not the table
    different: list[tuple[Any, ...]] = field(default_factory=list)  # same key, other values
    inconsistent: list[str] = field(default_factory=list)  # the stream contradicts itself
    duplicates: int = 0  # records that appear more than once in the stream
    records: int = 0  # records replayed
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different or self.inconsistent)

    def lines(self, limit: int = 10) -> list[str]:
        status = "OK" if self.ok else "DIFFERENT"
        out = [f"{self.table}: {status} at {self.snapshot[0]}:{self.snapshot[1]} "
               f"({self.source_rows} rows in the table, {self.stream_rows} from the stream "
               f"of {self.records} records, {self.chunks} chunks)"]
        for label, keys in (("missing from the stream", self.missing),
                            ("in the stream but not the table", self.extra),
                            ("different values", self.different)):
            if keys:
                shown = ", ".join(repr(k if len(k) > 1 else k[0]) for k in keys[:limit])
                more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
                out.append(f"  {len(keys)} {label}: {shown}{more}")
        out += [f"  stream inconsistency: {line}" for line in self.inconsistent[:limit]]
        out += [f"  note: {note}" for note in self.notes]
        return out


# -- the verification ----------------------------------------------------------------------

def verify_table(address: SourceAddress, data_dir: str, table: TableName,
                 timeout: float = 60.0, dump: str | None = None,
                 salt: bytes | None = None) -> Report:
    """Compare the table with its stream (with ``dump``, a dump file's path: with that dump
    followed by the stream after it, as a client loading the dump sees the table). Columns
    stored hashed or masked are compared with the source's values under the same rule
    (``salt``: the hash's)."""
    conn = source_sql.connect(address)
    try:
        source_sql.query(conn, "SET SESSION time_zone = '+00:00'")
        source_sql.query(conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        source_sql.query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
        status = dict(source_sql.query(conn, "SHOW STATUS LIKE 'binlog_snapshot_%'"))
        snapshot = (str(status["Binlog_snapshot_file"]), int(status["Binlog_snapshot_position"]))
        report = Report(table, snapshot)
        at = source_sql.query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", snapshot)[0][0] \
            if source_sql.describe(conn).flavor == "mariadb" else None
        wait_for_checkpoint(data_dir, *snapshot, timeout,
                            GtidState.parse(str(at)) if at is not None else None)
        covered = gtid_state_at(data_dir, *snapshot)
        if dump is not None:
            replay = replay_after_dump(data_dir, table, dump, covered)
        else:
            replay = replay_stream(data_dir, table, covered)
        _reported(replay, report)
        source_rows = _source_rows(conn, table, replay, salt)
        source_sql.query(conn, "COMMIT")
    finally:
        conn.close()
    _compare(source_rows, replay, report)
    return report


def _reported(replay: Replay, report: Report) -> None:
    """What the replay of the stream found, in the report."""
    report.inconsistent = replay.inconsistent
    report.duplicates = replay.duplicates
    report.records = replay.records
    report.stream_rows = len(replay.rows)
    report.notes += replay.notes


def _source_rows(conn: Any, table: TableName, replay: Replay, salt: bytes | None = None
                 ) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    columns = ", ".join(select_expression(f) for f in replay.fields)
    stored = [value_function(rule, salt) if rule else _as_read for rule in replay.rules] \
        if any(replay.rules) else [_as_read] * len(replay.fields)
    name = f"`{table.database.replace('`', '``')}`.`{table.table.replace('`', '``')}`"
    definition = str(source_sql.query(conn, f"SHOW CREATE TABLE {name}")[0][1])
    if "WITH SYSTEM VERSIONING" in definition:
        name += " FOR SYSTEM_TIME ALL"  # its history rows are rows of its stream
    rows = {}
    seen: dict[tuple[Any, ...], int] = {}
    with conn.cursor(pymysql.cursors.SSCursor) as cur:  # streamed, not buffered twice
        cur.execute(f"SELECT {columns} FROM {name}")
        for raw in cur:
            row = tuple(canonical(f.kind, _from_source(f, rule(v)), f.scale)
                        for f, rule, v in zip(replay.fields, stored, raw, strict=True))
            key = tuple(row[i] for i in replay.key)
            if replay.keyless:  # equal rows are counted: the nth is (row, n)
                seen[key] = n = seen.get(key, 0) + 1
                key += (n,)
            rows[key] = row
    return rows


def _as_read(value: Any) -> Any:
    return value


def _from_source(f: Field, value: Any) -> Any:
    if value is None:
        return None
    if f.kind == Kind.FLOAT:
        return float(value)
    if f.kind == Kind.BOOLEAN or (f.real_type == "bit" and f.kind != Kind.DECIMAL):
        return int(value)
    if f.kind == Kind.DATE and isinstance(value, dt.datetime):
        return value.date()
    if f.kind == Kind.STRING and isinstance(value, bytes):
        return value.decode("utf-8")
    if f.kind == Kind.UUID:
        return str(value)
    return value


def _checksum(rows: list[tuple[Any, ...]]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(repr(row).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _compare(source: dict[tuple[Any, ...], tuple[Any, ...]], replay: Replay,
             report: Report) -> None:
    report.source_rows = len(source)
    stream = replay.rows
    keys = sorted(set(source) | set(stream), key=_sort_key)
    for start in range(0, len(keys), CHUNK_ROWS):
        chunk = keys[start : start + CHUNK_ROWS]
        report.chunks += 1
        ours = [stream.get(k) for k in chunk]
        theirs = [source.get(k) for k in chunk]
        if _checksum(ours) == _checksum(theirs):  # type: ignore[arg-type]
            continue
        for key, mine, real in zip(chunk, ours, theirs, strict=True):
            if mine is None:
                report.missing.append(key)
            elif real is None:
                report.extra.append(key)
            elif not same(mine, real):
                report.different.append(key)


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in key)


def format_json(report: Report) -> str:
    return json.dumps({"table": str(report.table), "ok": report.ok,
                       "snapshot": list(report.snapshot), "source_rows": report.source_rows,
                       "stream_rows": report.stream_rows, "missing": len(report.missing),
                       "extra": len(report.extra), "different": len(report.different),
                       "duplicates": report.duplicates, "records": report.records,
                       "inconsistent": len(report.inconsistent)})

