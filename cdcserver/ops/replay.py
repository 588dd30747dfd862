"""The stream side of ``cdcserver verify``: a table's rows rebuilt from its stored records
(after a dump's rows, when it is compared with a dump), applying only the transactions the
source's snapshot covers. Inserts add rows, updates replace them (their before-image must
match what is there), deletes remove them (likewise), a TRUNCATE, DROP or re-creation empties
the table; what contradicts the rows so far is noted, unless a repair explains it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.ops.canonical import UNKNOWN, canonical, same
from cdcserver.schema import ddl
from cdcserver.schema.statements import AlterTable, ChangeColumn, RenameColumn
from cdcserver.store.avrofile import scan_blocks
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.reader import repair_blocks, table_life
from cdcserver.store.records import decode_records
from mariadb_cdc_client.format.dump import DumpDecoder, DumpHeader, DumpRows
from mariadb_cdc_client.format.schema import METADATA_FIELDS, Field, from_avro_value


class Replay:
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
        self.notes: list[str] = []  # what the report should say of the replay

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
            if known is None or not same(known, row):
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


def masked_rules(avsc: dict[str, Any]) -> tuple[str | None, ...]:
    """Each column field's [capture] rule, from the schema's ``masked`` keys."""
    return tuple(f.get("masked") for f in avsc["fields"][len(METADATA_FIELDS):])


def replay_stream(data_dir: str, table: TableName, covered: GtidState) -> Replay:
    """The table's rows as its stream has them after the transactions ``covered``."""
    replay = Replay()
    repairs = repair_blocks(data_dir, table)
    for info, continues in table_life(data_dir, table):
        replay.use(info, continues=continues)
        _replay_version(replay, info, repairs, covered.covers)
    if not replay.fields:
        raise StoreError(f"{table} has no stream in {data_dir}")
    replay.finish()
    if replay.explained:
        replay.notes.append(f"{replay.explained} update_before/delete records between a change "
                            "without binlog rows and its repair show the row as the source had "
                            "it then (expected)")
    partial = sum(any(v is UNKNOWN for v in row) for row in replay.rows.values())
    if partial:
        replay.notes.append(f"{partial} rows were compared without the columns added after "
                            "they were last written (no row event carries those values)")
    return replay


def _replay_version(replay: Replay, info: Any, repairs: dict[tuple[str, int], set[int]],
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


def replay_after_dump(data_dir: str, table: TableName, path: str, covered: GtidState
                      ) -> Replay:
    """The dump's rows, then the stream's records after the dump's GTID state, from the
    version the table was in at the dump's point (as ``REQUEST-DATA ... AFTER`` sends them):
    earlier versions hold only changes the dump already has, and that version's creation
    (a TRUNCATE, say) precedes the dump, so it does not empty the rows."""
    replay = Replay()
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
        replay.notes.append(f"{replay.explained} update_before/delete records of a repair "
                            "after the dump show the row as the stream had it before the "
                            "repair (expected)")
    replay.notes.append(f"from dump {os.path.basename(path)} ({header.rows} rows at "
                        f"{header.gtid or 'the start'})")
    return replay


def _load_dump(replay: Replay, path: str) -> DumpHeader:
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


def _key(replay: Replay, values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(values[i] for i in replay.key)
