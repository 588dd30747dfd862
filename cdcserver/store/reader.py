"""Reading a table's stream straight from a data directory, beside a running service.

Used by ``verify`` and by dumps, which may run as their own processes. Everything up to the
checkpoint is complete; past it a block may belong to a transaction still being written, so a
table's newest version is read only up to its checkpointed size.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import Gtid, GtidState, binlog_ordinal
from cdcserver.core.names import TableName
from cdcserver.store import checkpoint as ckpt
from cdcserver.store.avrofile import scan_blocks
from cdcserver.store.catalog import Catalog, VersionInfo
from cdcserver.store.indexschema import sequence_of
from cdcserver.store.layout import DataDir
from cdcserver.store.records import decode_records


def version_ddl(info: VersionInfo) -> dict[str, str]:
    """The schema's ``ddl`` key: why this version exists (empty when rows made it)."""
    about: dict[str, str] = info.schema.avsc.get("ddl") or {}
    return about


def _table_versions(catalog: Catalog, checkpoint: ckpt.Checkpoint | None,
                    table: TableName) -> list[VersionInfo]:
    entry = catalog.get(table)
    if entry is None:
        return []
    mark = checkpoint.tables.get(table) if checkpoint else None
    versions = [entry.versions[v] for v in sorted(entry.versions)]
    for info in versions:
        if mark is not None and info.version == mark.version:
            info.committed = mark.size  # past it, blocks may belong to an open transaction
        elif mark is not None and info.version > mark.version:
            info.committed = info.header.size
    return versions


def table_life(data_dir: str, table: TableName) -> list[tuple[VersionInfo, bool]]:
    """The versions whose records make up the table's rows now, oldest first, each with a
    flag that is True when it continues a renamed table's rows. Only the table's current
    life counts (from its last creation); when it was created by a rename, the life of the
    table it was renamed from comes first."""
    catalog = Catalog(DataDir(data_dir).avro)
    catalog.load()
    checkpoint = ckpt.load(DataDir(data_dir).checkpoint)
    chain: list[tuple[VersionInfo, bool]] = []
    end: int | None = None  # for an older table: the version that renamed it away
    seen: set[tuple[TableName, int | None]] = set()  # a name has several lives (swaps)
    while (table, end) not in seen:
        seen.add((table, end))
        versions = _table_versions(catalog, checkpoint, table)[:end]
        if not versions:
            break
        start = max((i for i, v in enumerate(versions) if version_ddl(v).get("kind") ==
                     "create"), default=0)
        life = versions[start:]
        chain[:0] = [(v, False) for v in life]
        origin = life[0].ddl.renamed_from
        if origin is None:
            break
        chain[0] = (chain[0][0], True)
        newer, table = table, origin
        older = _table_versions(catalog, checkpoint, table)
        end = next((i for i, v in enumerate(older)  # the version the same rename made
                    if v.ddl.renamed_to == newer
                    and v.schema.gtid == life[0].schema.gtid), None)
        if end is None:
            break
    return chain


def committed_records(info: VersionInfo, start: int | None = None) -> Iterator[dict[str, Any]]:
    """The records of a version up to its committed size, from ``start`` (a block offset)."""
    for block in scan_blocks(info.path, info.header, start or info.header.size,
                             info.committed):
        yield from decode_records(info, block)


def repair_blocks(data_dir: str, table: TableName) -> dict[tuple[str, int], set[int]]:
    """The offsets of the blocks holding repair records, by (table, version), for ``table``
    and the tables its life began as (renames)."""
    path = DataDir(data_dir).index
    if not os.path.exists(path):
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT db, tbl, version, offset FROM notes").fetchall()
    except sqlite3.OperationalError:  # an index from before repairs
        rows = []
    finally:
        db.close()
    found: dict[tuple[str, int], set[int]] = {}
    for database, name, version, offset in rows:
        found.setdefault((str(TableName(database, name)), version), set()).add(offset)
    return found


def gtid_state_at(data_dir: str, file: str, pos: int) -> GtidState:
    """The GTIDs of the stored transactions at or before a binlog position."""
    db = sqlite3.connect(f"file:{DataDir(data_dir).index}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT domain, source, server_id, seq, file, pos FROM transactions"
                          ).fetchall()
    finally:
        db.close()
    state: dict[int | str, Gtid] = {}
    limit = binlog_ordinal(file, pos)
    for domain, source_uuid, server_id, stored, at_file, at_pos in rows:
        seq = sequence_of(stored)
        if binlog_ordinal(at_file, at_pos) <= limit:
            gtid = Gtid(domain, server_id, seq, source_uuid or None)
            if gtid.key not in state or state[gtid.key].sequence < seq:
                state[gtid.key] = gtid
    return GtidState(state.values())


def wait_for_checkpoint(data_dir: str, file: str, pos: int, timeout: float,
                        state: GtidState | None = None) -> ckpt.Checkpoint:
    """Wait until the store's checkpoint is at or past a binlog position, or (``state``:
    the source's GTID state there) holds every transaction before it. An idle source whose
    binlog rotated stands in a file no transaction has reached: the state tells."""
    path = DataDir(data_dir).checkpoint
    deadline = time.monotonic() + timeout
    target = binlog_ordinal(file, pos)
    while True:
        checkpoint = ckpt.load(path)
        position = checkpoint.position if checkpoint is not None else None
        if position is not None and (
                binlog_ordinal(position.file, position.pos) >= target or
                (state is not None and all(position.gtid_state.covers(g) for g in state))):
            assert checkpoint is not None
            return checkpoint
        if time.monotonic() > deadline:
            raise StoreError(f"the service has not reached the snapshot position {file}:{pos} "
                             f"within {timeout:.0f}s (is it running?)")
        time.sleep(0.05)
