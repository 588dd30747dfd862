"""``cdcserver verify``: is a table's stream exactly its rows?

1. On the source, open a consistent snapshot (``START TRANSACTION WITH CONSISTENT SNAPSHOT``;
   MariaDB reports the binlog position it corresponds to in ``binlog_snapshot_file`` /
   ``binlog_snapshot_position``). No lock is taken and writes continue.
2. Wait until the service's checkpoint covers that position, so every transaction before it is
   complete in the store.
3. Replay the table's stream from its files, applying only the transactions at or before the
   snapshot position: inserts add rows, updates replace them (their before-image must match
   what is there), deletes remove them (likewise), a TRUNCATE, DROP or re-creation empties it.
4. Read the table in the snapshot and compare the two row sets by primary-key chunks (a
   checksum per chunk; rows are compared only in chunks whose checksums differ).

Values are compared exactly: FLOAT by its 32-bit pattern (read as ``CAST(f AS DOUBLE)``,
which MariaDB prints exactly), DECIMAL by its digits and scale, TIMESTAMP as instants.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Context, Decimal
from typing import Any

import pymysql

from cdcserver.core.capture import value_function
from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.scan import select_expression
from cdcserver.replication import source as source_sql
from cdcserver.schema import ddl
from cdcserver.schema.statements import AlterTable, ChangeColumn, RenameColumn
from cdcserver.store.avrofile import scan_blocks
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.reader import (
    gtid_state_at,
    repair_blocks,
    table_life,
    wait_for_checkpoint,
)
from cdcserver.store.records import decode_records
from mariadb_cdc_client.format.dump import DumpDecoder, DumpHeader, DumpRows
from mariadb_cdc_client.format.schema import METADATA_FIELDS, Field, Kind, from_avro_value

CHUNK_ROWS = 1000
_WIDE = Context(prec=100)  # DECIMAL(65,30) exceeds the default context's 28 digits


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


# -- canonical values ------------------------------------------------------------------------

def canonical(kind: Kind, value: Any, scale: int = 0) -> Any:
    """One value in a form that compares equal exactly when the values are the same."""
    if value is None:
        return None
    if kind == Kind.FLOAT:
        return struct.pack("<f", value)
    if kind == Kind.DECIMAL:
        # the number, whatever its column's scale: a row sent before a widening has fewer
        # digits after the point than the table shows now
        number = Decimal(value) if scale == 0 else \
            _WIDE.quantize(Decimal(value), Decimal(1).scaleb(-scale))
        return format(number.normalize(_WIDE), "f")
    if kind == Kind.BOOLEAN:
        return int(value)
    if kind == Kind.TIMESTAMP and isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)  # the session reads in UTC
        return value.astimezone(dt.UTC)
    if kind == Kind.UUID:
        return str(value)
    if kind == Kind.BYTES and isinstance(value, bytearray):
        return bytes(value)
    return value


# -- the stream side -----------------------------------------------------------------------

class _Unknown:
    """A value the stream cannot know: a column added after the row was last written (its
    value in the table comes from the column's default, which no row event carried)."""

    def __repr__(self) -> str:
        return "?"


UNKNOWN = _Unknown()


class _Replay:
    """The table's rows rebuilt from its records."""

    def __init__(self) -> None:
        self.rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.fields: tuple[Field, ...] = ()
        self.rules: tuple[str | None, ...] = ()  # each field's [capture] rule ("masked")
        self.key: tuple[int, ...] = ()
        self.inconsistent: list[str] = []
        self.partial = 0  # rows carried over a column change without the new columns
        self.records = 0
        self.duplicates = 0
        self._seen: set[tuple[int, int, int, int]] = set()  # (domain, server, seq, event)
        # update_before/delete records that did not match, not yet explained by a repair
        self._unexplained: list[str] = []
        self.explained = 0  # such records a later repair of the table explains
        self.keyless = False  # no primary key: rows are (row, n), the nth of equal rows
        self.counts: Counter[tuple[Any, ...]] = Counter()

    def use(self, info: VersionInfo, *, continues: bool = False) -> None:
        """Switch to ``info``'s columns. A TRUNCATE, DROP or re-creation empties the table,
        unless the version ``continues`` one followed here (a rename); rows keep the values
        of the columns that remain."""
        ddl = info.schema.avsc.get("ddl") or {}
        if ddl.get("kind") in ("truncate", "drop", "create") and not continues:
            self.rows.clear()
            self.counts.clear()
        fields = info.schema.columns
        names = [f.column for f in fields]
        pk = info.schema.avsc.get("primary_key") or []
        key = tuple(names.index(n) for n in pk if n in names) or tuple(range(len(names)))
        rows = list(self.rows.values())
        if self.fields and ([(f.column, f.kind) for f in fields] !=
                            [(f.column, f.kind) for f in self.fields]):
            # new columns or types: rows keep the values of the columns that remain (under
            # their new names; a value whose kind changed is unknown)
            renamed = _column_renames(ddl.get("statement") or "", info.table.database)
            kinds = {f.column: f.kind for f in fields}
            old = {renamed.get(f.column.lower(), f.column): i for i, f in enumerate(self.fields)
                   if kinds.get(renamed.get(f.column.lower(), f.column)) == f.kind}
            rows = [tuple(row[old[n]] if n in old else UNKNOWN for n in names)
                    for row in rows]
            self.partial += sum(any(v is UNKNOWN for v in row) for row in rows)
        self.fields, self.key = fields, key
        self.rules = masked_rules(info.schema.avsc)
        self.keyless = len(key) != len(pk) or not pk
        self.rows, self.counts = {}, Counter()
        for row in rows:
            self._put(row)

    def _put(self, row: tuple[Any, ...]) -> None:
        # A key column added since the row was written (a system-versioned table's row end)
        # holds nothing for it: a record for that row (a repair's update_before) names it
        # with the column null, as a consumer holds it.
        key = tuple(None if row[i] is UNKNOWN else row[i] for i in self.key)
        if self.keyless:  # a table without a key holds equal rows: the nth is (row, n)
            self.counts[key] += 1
            key = (*key, self.counts[key])
        self.rows[key] = row

    def row(self, record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(canonical(f.kind, from_avro_value(f.kind, record.get(f.name)), f.scale)
                     for f in self.fields)

    def apply(self, record: dict[str, Any]) -> None:
        position = (record["domain"], record["server_id"], record["sequence"],
                    record["event_number"])
        self.records += 1
        if position in self._seen:
            self.duplicates += 1
            self.inconsistent.append("record {}-{}-{}:{} appears twice".format(*position))
            return
        self._seen.add(position)
        row = self.row(record)
        key = tuple(row[i] for i in self.key)
        kind = record["event_type"]
        where = f"{record['domain']}-{record['server_id']}-{record['sequence']}" \
                f":{record['event_number']}"
        if self.keyless:
            count = self.counts[key]
            if kind in ("insert", "update_after"):
                self._put(row)
            elif count == 0:
                self._unexplained.append(f"{kind} at {where} matches no row")
            else:
                self.counts[key] = count - 1
                self.rows.pop((*key, count), None)
            return
        if kind in ("insert", "update_after"):
            self.rows[key] = row
        elif kind in ("update_before", "delete"):
            known = self.rows.get(key)
            if known is None or not _same(known, row):
                self._unexplained.append(f"{kind} at {where} does not match the row for key "
                                         f"{key!r}")
            self.rows.pop(key, None)

    def repaired(self) -> None:
        """A repair's records follow: rows had changed without row events since some earlier
        point, and records between that change and the repair carry the binlog's row images
        (docs/repairs.md, "Changes without binlog rows"): mismatches so far are explained."""
        self.explained += len(self._unexplained)
        self._unexplained = []

    def finish(self) -> None:
        self.inconsistent += self._unexplained
        self._unexplained = []


# -- the verification ----------------------------------------------------------------------

def masked_rules(avsc: dict[str, Any]) -> tuple[str | None, ...]:
    """Each column field's [capture] rule, from the schema's ``masked`` keys."""
    return tuple(f.get("masked") for f in avsc["fields"][len(METADATA_FIELDS):])


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
            replay = _replay_after_dump(data_dir, table, dump, covered, report)
        else:
            replay = _replay(data_dir, table, covered, report)
        source_rows = _source_rows(conn, table, replay, salt)
        source_sql.query(conn, "COMMIT")
    finally:
        conn.close()
    _compare(source_rows, replay, report)
    return report


def _replay(data_dir: str, table: TableName, covered: GtidState, report: Report) -> _Replay:
    replay = _Replay()
    repairs = repair_blocks(data_dir, table)
    for info, continues in table_life(data_dir, table):
        replay.use(info, continues=continues)
        _replay_version(replay, info, repairs, covered.covers)
    if not replay.fields:
        raise StoreError(f"{table} has no stream in {data_dir}")
    replay.finish()
    if replay.explained:
        report.notes.append(f"{replay.explained} update_before/delete records between a change "
                            "without binlog rows and its repair show the row as the source had "
                            "it then (expected)")
    report.inconsistent = replay.inconsistent
    report.duplicates = replay.duplicates
    report.records = replay.records
    report.stream_rows = len(replay.rows)
    partial = sum(any(v is UNKNOWN for v in row) for row in replay.rows.values())
    if partial:
        report.notes.append(f"{partial} rows were compared without the columns added after "
                            "they were last written (no row event carries those values)")
    return replay


def _replay_version(replay: _Replay, info: Any, repairs: dict[tuple[str, int], set[int]],
                    wanted: Callable[[Gtid], bool]) -> None:
    """Apply a version's records of the transactions ``wanted``; a repair's block explains
    the mismatches before it, and its own (its before images are in the new columns'
    types: a narrowed value shows as the table has it)."""
    noted = repairs.get((str(info.table), info.version), set())
    for block in scan_blocks(info.path, info.header, info.header.size, info.committed):
        if block.offset in noted:
            replay.repaired()
        for record in decode_records(info, block):
            if wanted(Gtid(record["domain"], record["server_id"], record["sequence"])):
                replay.apply(record)
        if block.offset in noted:
            replay.repaired()


def _replay_after_dump(data_dir: str, table: TableName, path: str, covered: GtidState,
                       report: Report) -> _Replay:
    """The dump's rows, then the stream's records after the dump's GTID state, from the
    version the table was in at the dump's point (as ``REQUEST-DATA ... AFTER`` sends them):
    earlier versions hold only changes the dump already has, and that version's creation
    (a TRUNCATE, say) precedes the dump, so it does not empty the rows."""
    replay = _Replay()
    header = _load_dump(replay, path)
    in_dump = GtidState.parse(header.gtid)
    life = table_life(data_dir, table)
    before = [i for i, (info, _) in enumerate(life)
              if info.schema.gtid and in_dump.covers(Gtid.parse(info.schema.gtid))]
    start = before[-1] if before else 0
    repairs = repair_blocks(data_dir, table)
    for i, (info, continues) in enumerate(life[start:]):
        replay.use(info, continues=continues or (i == 0 and bool(before)))
        # a dump taken between a change without binlog rows and its repair already has the
        # rows the repair writes
        _replay_version(replay, info, repairs,
                        lambda gtid: covered.covers(gtid) and not in_dump.covers(gtid))
    replay.finish()
    if replay.explained:
        report.notes.append(f"{replay.explained} update_before/delete records of a repair "
                            "after the dump show the row as the stream had it before the "
                            "repair (expected)")
    report.inconsistent = replay.inconsistent
    report.duplicates = replay.duplicates
    report.records = replay.records
    report.stream_rows = len(replay.rows)
    report.notes.append(f"from dump {os.path.basename(path)} ({header.rows} rows at "
                        f"{header.gtid or 'the start'})")
    return replay


def _load_dump(replay: _Replay, path: str) -> DumpHeader:
    """Load a dump's rows, checking its checksum."""
    decoder = DumpDecoder()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            for item in decoder.feed(data):
                if isinstance(item, DumpHeader):
                    replay.fields = item.columns
                    replay.rules = masked_rules(item.schema)
                    names = [c.column for c in item.columns]
                    pk = item.schema.get("primary_key") or []
                    replay.key = tuple(names.index(n) for n in pk) or tuple(range(len(names)))
                    continue
                for before, after in _changes(item, replay.fields):
                    if before is not None:
                        replay.rows.pop(_key(replay, before), None)
                    if after is not None:
                        replay.rows[_key(replay, after)] = after
    try:
        return decoder.finish()
    except ValueError as exc:
        raise StoreError(f"{path}: {exc}") from exc


def _changes(op: DumpRows, fields: tuple[Field, ...]) -> Iterator[tuple[Any, Any]]:
    rows = [tuple(canonical(f.kind, row[f.column], f.scale) for f in fields)
            for row in op.rows]
    if op.action == "insert":
        yield from ((None, r) for r in rows)
    elif op.action == "delete":
        yield from ((r, None) for r in rows)
    else:
        yield from zip(rows[0::2], rows[1::2], strict=True)


def _column_renames(statement: str, database: str) -> dict[str, str]:
    """The columns an ALTER TABLE renamed: lowercase old name -> new name."""
    parsed = ddl.parse(statement, database) if statement else None
    if not isinstance(parsed, AlterTable):
        return {}
    renames = {}
    for action in parsed.actions:
        if isinstance(action, RenameColumn):
            renames[action.old.lower()] = action.new
        elif isinstance(action, ChangeColumn) and action.old.lower() != \
                action.column.name.lower():
            renames[action.old.lower()] = action.column.name
    return renames


def _key(replay: _Replay, values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(values[i] for i in replay.key)


def _source_rows(conn: Any, table: TableName, replay: _Replay, salt: bytes | None = None
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


def _compare(source: dict[tuple[Any, ...], tuple[Any, ...]], replay: _Replay,
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
            elif not _same(mine, real):
                report.different.append(key)


def _same(stream: tuple[Any, ...], table: tuple[Any, ...]) -> bool:
    return all(a is UNKNOWN or a == b for a, b in zip(stream, table, strict=True))


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in key)


def format_json(report: Report) -> str:
    return json.dumps({"table": str(report.table), "ok": report.ok,
                       "snapshot": list(report.snapshot), "source_rows": report.source_rows,
                       "stream_rows": report.stream_rows, "missing": len(report.missing),
                       "extra": len(report.extra), "different": len(report.different),
                       "duplicates": report.duplicates, "records": report.records,
                       "inconsistent": len(report.inconsistent)})

