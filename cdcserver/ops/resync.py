"""``cdcserver resync``: the way out when the binlog the stream needs next was purged.

The transactions between the stored GTID state and the oldest binlog the source still holds
are lost to the stream: no replica can read them any more. Resync, with the service stopped:

1. checks that the source really cannot continue the stream (it refuses a binlog dump at the
   stored state as purged); otherwise it refuses, since nothing was lost;
2. takes the source's position now, N (a consistent snapshot's exact GTID state and binlog
   position), and in one stored transaction at N starts a new version of every table the
   stream holds, from its definition on the source now, whose schema's ``ddl`` is
   ``{"kind": "resync", "note": ...}``; a table no longer on the source gets a ``drop``
   version. A client following a table sees the new version and why: the rows it holds may
   be stale, and it reloads the table from a dump;
3. makes the schema history re-learn those tables from the source (their definitions may
   have changed in the gap);
4. writes the checkpoint at N: the service continues from the source's position then;
5. dumps every table still on the source, each at a point at or after N (one snapshot each:
   the service is stopped). A dump plus the stream after it is the table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql

from cdcserver.core.capture import CaptureFilter
from cdcserver.core.changes import Begin, Commit, Ddl, TableChange
from cdcserver.core.config import Config, SourceAddress
from cdcserver.core.errors import BinlogPurged, CdcError, SourceError, SourceUnavailable
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import DumpResult, dump_tables
from cdcserver.dump.options import DumpOptions
from cdcserver.dump.snapshot import open_mariadb_point, qualified
from cdcserver.replication import source as source_sql
from cdcserver.replication.connection import BinlogConnection
from cdcserver.schema import ddl
from cdcserver.schema.history import SchemaHistory
from cdcserver.schema.layouts import layout_of
from cdcserver.schema.masking import project_layout
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir
from cdcserver.store.reader import version_ddl
from cdcserver.store.store import AvroStore

log = logging.getLogger(__name__)

_ER_NO_SUCH_TABLE = 1146


@dataclass
class Resynced:
    stored: GtidState  # where the stream was
    point: BinlogPosition  # where it continues
    reason: str  # what the source said
    versions: list[TableName] = field(default_factory=list)  # a resync version each
    dropped: list[TableName] = field(default_factory=list)  # no longer on the source
    dumps: list[DumpResult] = field(default_factory=list)


def resync(config: Config, *, dump: bool = True) -> Resynced:
    """Resync the data directory of ``config`` (see the module's description)."""
    layout = DataDir(config.store.data_dir)
    store = AvroStore(config.store.data_dir, Catalog(layout.avro), codec=config.store.codec,
                      block_size=config.store.block_size)
    checkpoint = store.open()  # the writer lock: refused while the service runs
    try:
        if checkpoint is None or checkpoint.position is None:
            raise CdcError(f"{config.store.data_dir} has stored nothing: start the service")
        stored = checkpoint.position.gtid_state
        address = config.source.address()
        capture = CaptureFilter.of(config.capture)
        reason = _purged_reason(address, config.source.server_id, stored)
        conn = source_sql.connect(address)
        try:
            if source_sql.describe(conn).flavor != "mariadb":
                raise CdcError("resync needs MariaDB (its consistent snapshot gives the exact "
                               "GTID state of a binlog position)")
            now = open_mariadb_point(conn)
            source_sql.query(conn, "COMMIT")
            point = BinlogPosition(now.gtid, now.file, now.pos)
            result = Resynced(stored, point, reason)
            changes = _table_changes(conn, store, stored, point, result, capture)
        finally:
            conn.close()
        _store_resync(store, stored, point, changes)
        history = SchemaHistory(layout.schema_history)
        for table in (*result.versions, *result.dropped):
            history.forget(table)
    finally:
        store.close()
    log.warning("resync: the stream continues at '%s' (%s:%d); %d tables have a resync "
                "version, %d were dropped meanwhile", point.gtid_state, point.file, point.pos,
                len(result.versions), len(result.dropped))
    if dump and result.versions:
        result.dumps = dump_tables(address, config.store.data_dir, result.versions,
                                   DumpOptions(replace(config.dump, readers=0)),
                                   stream_versions=None, capture=capture)
    return result


def _purged_reason(address: SourceAddress, server_id: int, stored: GtidState) -> str:
    """What the source says when asked for the binlog after ``stored``; CdcError if it can
    continue the stream (then nothing was lost)."""
    conn = BinlogConnection(address, server_id, stored, blocking=False)
    try:
        conn.open()
        for _ in conn.packets():
            break
    except BinlogPurged as exc:
        return str(exc)
    except SourceUnavailable:
        raise
    except SourceError as exc:
        raise CdcError(f"the source refuses the stream, but not for a purged binlog: {exc}; "
                       "resync does not apply") from exc
    finally:
        conn.close()
    raise CdcError(f"the source still holds the binlog after '{stored}': nothing was lost, "
                   "start the service (resync would only throw the stream's history away)")


def _table_changes(conn: Any, store: AvroStore, stored: GtidState, point: BinlogPosition,
                   result: Resynced, capture: CaptureFilter) -> list[TableChange]:
    """A resync version of every table the stream holds that is still captured (a drop for
    one that is gone), in the columns the column rules store."""
    note = (f"the source purged the binlog after '{stored}' before the service read it: the "
            f"changes up to '{point.gtid_state}' are not in the stream. Reload the table from "
            "a dump taken after this version began (cdcserver resync took one)")
    changes = []
    held = [entry.name for entry in store.catalog.tables.values()
            if (latest := entry.latest()) is not None and
            version_ddl(latest).get("kind") != "drop"]
    # tables created in the gap (or again after a stored drop) are in no version yet
    on_source = [TableName(str(db), str(name)) for db, name in source_sql.query(
        conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE "
              "TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') AND TABLE_SCHEMA NOT IN "
              "('mysql', 'sys', 'information_schema', 'performance_schema')")]
    for table in sorted({*held, *on_source}, key=str):
        if not capture.captures_table(table):
            continue
        text = _show_create(conn, table)
        if text is None:
            changes.append(TableChange("drop", table.database, table.table, note=note))
            result.dropped.append(table)
            continue
        statement = ddl.parse(text, table.database)
        if not isinstance(statement, ddl.CreateTable) or statement.definition is None:
            raise CdcError(f"cannot parse the definition of {table} on the source")
        layout = layout_of(table, statement.definition)
        projection = project_layout(layout, capture.columns)
        changes.append(TableChange("resync", table.database, table.table,
                                   layout if projection is None else projection.layout,
                                   note=note))
        result.versions.append(table)
    return changes


def _show_create(conn: Any, table: TableName) -> str | None:
    try:
        return str(source_sql.query(conn, f"SHOW CREATE TABLE {qualified(table)}")[0][1])
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] == _ER_NO_SUCH_TABLE:
            return None
        raise


def _store_resync(store: AvroStore, stored: GtidState, point: BinlogPosition,
                  changes: list[TableChange]) -> None:
    """One stored transaction at ``point`` with every table's new version, then the
    checkpoint there. Its GTID is the last of a domain that moved since ``stored`` (one the
    stream never held, so no seek can confuse the two)."""
    moved = [g for g in point.gtid_state
             if (was := stored.get(g.key)) is None or was.sequence < g.sequence]
    gtid = max(moved or list(point.gtid_state), key=lambda g: g.sequence,
               default=Gtid(0, 0, 0))
    stamp = int(time.time())
    store.apply_now([
        Begin(gtid, stamp, standalone=True, file=point.file, pos=point.pos),
        Ddl("", "-- cdcserver resync", stamp, kind="resync", changes=tuple(changes),
            file=point.file, pos=point.pos),
        Commit(point, stamp)])
    asyncio.run(store.flush())
