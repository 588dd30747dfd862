"""The changes a resumed dump must carry: a table's row changes between two snapshots.

A dump interrupted after reading keys up to K at snapshot S1 continues in a new snapshot S2.
Rows up to K are as of S1; the changes committed between S1 and S2 come from the store (every
record of a transaction that S2 covers and S1 does not), written as ``insert`` / ``update`` /
``delete`` operations before the rest of the rows. Applied in order as upserts, the rows up to K
reach S2; rows after K are then read at S2 and overwrite whatever the changes did to them. The
result is the table at S2.

This needs the store to hold every such change with the dump's columns: the service must have
been replicating since before S1 (the checkpoint's ``origin``), must have reached S2, and no
version of the table may have begun between the two (a DDL, a TRUNCATE: changes no row event
carries). Otherwise :class:`Unavailable` says why and the dump starts over.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from typing import Any

from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.store import checkpoint as ckpt
from cdcserver.store.indexschema import stored_sequence
from cdcserver.store.layout import DataDir
from cdcserver.store.reader import (
    committed_records,
    table_life,
    version_ddl,
    wait_for_checkpoint,
)
from mariadb_cdc_client.format.dump import encode_row, operation_line
from mariadb_cdc_client.format.schema import from_avro_value

BATCH = 500
_ACTIONS = {"insert": "insert", "delete": "delete", "update_before": "update",
            "update_after": "update"}


class Unavailable(Exception):
    """The store cannot supply the changes between the two snapshots."""


def changes_between(data_dir: str, table: TableName, fields: list[dict[str, Any]],
                    since: GtidState, until: GtidState, until_at: tuple[str, int],
                    timeout: float) -> Iterator[bytes]:
    """Operation lines for the table's changes after ``since`` up to ``until``."""
    versions = _versions_between(data_dir, table, since, until, until_at, timeout,
                                 "resuming a dump", "between the snapshots")
    return _operations(versions, fields, since, until)


def _versions_between(data_dir: str, table: TableName, since: GtidState, until: GtidState,
                      until_at: tuple[str, int], timeout: float, what: str, when: str,
                      until_known: bool = False) -> list[Any]:
    """The table's versions, once the store has reached ``until_at`` (or, ``until_known``,
    holds ``until``); Unavailable if the store cannot hold every change after ``since``:
    MySQL GTIDs, a store begun after ``since``, a schema change between the two."""
    if any(g.source_uuid for g in (*since, *until)):
        raise Unavailable(f"{what} needs MariaDB GTIDs (records do not carry MySQL source "
                          "UUIDs)")
    try:
        checkpoint = wait_for_checkpoint(data_dir, *until_at, timeout,
                                         until if until_known else None)
    except StoreError as exc:
        raise Unavailable(str(exc)) from exc
    _check_origin(checkpoint, since, DataDir(data_dir).checkpoint)
    versions = [info for info, _ in table_life(data_dir, table)]
    for info in versions:
        created = info.schema.gtid
        if version_ddl(info) and created and not since.covers(Gtid.parse(created)) \
                and until.covers(Gtid.parse(created)):
            raise Unavailable(f"{table} version {info.version} began with a schema change "
                              f"{when} (at {created})")
    return versions


ChangeRecord = tuple[Gtid, str, bytes]  # (its transaction, insert/delete, the row's bytes)


def records_between(data_dir: str, table: TableName, fields: list[dict[str, Any]],
                    since: GtidState, until: GtidState, until_at: tuple[str, int],
                    timeout: float) -> Iterator[ChangeRecord]:
    """The table's row changes after ``since`` up to ``until``, in commit order, each row
    image on its own: an insert or an update's after image as ``insert``, a delete or an
    update's before image as ``delete`` (what a chunked dump merges into the rows it read,
    each row by the transaction that last changed it). Unavailable as for
    :func:`changes_between`."""
    versions = _versions_between(data_dir, table, since, until, until_at, timeout,
                                 "merging changes into a dump", "during the dump",
                                 until_known=True)
    return _records(data_dir, versions, fields, since, until)


def check_versions(data_dir: str, table: TableName, since: GtidState, until: GtidState,
                   until_at: tuple[str, int], timeout: float) -> None:
    """Unavailable if no chunked dump of the table can hold between the two: as for
    :func:`records_between`, when the caller knows no row of the table changed."""
    _versions_between(data_dir, table, since, until, until_at, timeout,
                      "merging changes into a dump", "during the dump", until_known=True)


def _records(data_dir: str, versions: list[Any], fields: list[dict[str, Any]],
             since: GtidState, until: GtidState) -> Iterator[ChangeRecord]:
    for info in versions:
        columns = info.schema.columns
        same = info.schema.avsc["fields"][6:] == fields
        for record in committed_records(info, _start(data_dir, info, since)):
            if not _between(record, since, until):
                continue
            if not same:
                raise Unavailable(f"{info.table} version {info.version} has other columns "
                                  "than the dump")
            kind = record["event_type"]
            values = {f.column: from_avro_value(f.kind, record.get(f.name)) for f in columns}
            yield (Gtid(record["domain"], record["server_id"], record["sequence"]),
                   "insert" if kind in ("insert", "update_after") else "delete",
                   encode_row(columns, values))


def _start(data_dir: str, info: Any, since: GtidState) -> int | None:
    """Where in a version the first record after ``since`` can be: the GTID index's block
    before it in every domain the version holds (None: from the start), so that merging a
    dump's window does not read the table's whole history."""
    path = DataDir(data_dir).index
    if not os.path.exists(path):
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        key = (info.table.database, info.table.table, info.version)
        offsets = []
        for (domain,) in db.execute("SELECT DISTINCT domain FROM blocks WHERE db=? AND tbl=? "
                                    "AND version=?", key).fetchall():
            seen = since.get(domain)
            unordered = db.execute("SELECT 1 FROM unordered WHERE domain=?",
                                   (domain,)).fetchone()
            if seen is None or unordered:
                return None
            (offset,) = db.execute("SELECT MAX(offset) FROM blocks WHERE db=? AND tbl=? AND "
                                   "version=? AND domain=? AND seq<=?",
                                   (*key, domain, stored_sequence(seen.sequence) + 1)
                                   ).fetchone()
            if offset is None:
                return None
            offsets.append(int(offset))
        return min(offsets) if offsets else None
    except sqlite3.Error:
        return None
    finally:
        db.close()


def _check_origin(checkpoint: ckpt.Checkpoint, since: GtidState, path: str) -> None:
    origin = checkpoint.origin
    if origin is None:
        raise Unavailable(f"{path} does not record where the store began replicating")
    if not all(since.covers(g) for g in origin.gtid_state):
        raise Unavailable(f"the store began replicating at {origin.gtid_state}, after the "
                          f"interrupted dump's snapshot {since}")


def _operations(versions: list[Any], fields: list[dict[str, Any]], since: GtidState,
                until: GtidState) -> Iterator[bytes]:
    action: str | None = None
    rows: list[bytes] = []
    for info in versions:
        columns = info.schema.columns
        if info.schema.avsc["fields"][6:] != fields:
            relevant = any(_between(r, since, until) for r in committed_records(info))
            if relevant:
                raise Unavailable(f"{info.table} version {info.version} has other columns "
                                  "than the dump")
            continue
        for record in committed_records(info):
            if not _between(record, since, until):
                continue
            kind = _ACTIONS[record["event_type"]]
            if kind != action or (len(rows) >= BATCH and record["event_type"] !=
                                  "update_after"):
                if rows:
                    assert action is not None
                    yield operation_line(action, rows)
                action, rows = kind, []
            values = {f.column: from_avro_value(f.kind, record.get(f.name)) for f in columns}
            rows.append(encode_row(columns, values))
    if rows:
        assert action is not None
        yield operation_line(action, rows)


def _between(record: dict[str, Any], since: GtidState, until: GtidState) -> bool:
    gtid = Gtid(record["domain"], record["server_id"], record["sequence"])
    return not since.covers(gtid) and until.covers(gtid)
