"""A chunked dump's merge (:mod:`cdcserver.dump.chunked`, step 4): the table's changes
between its chunks, taken from the store, laid over the rows the chunks read."""

from __future__ import annotations

import datetime as dt
import glob
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cdcserver.core.errors import CdcError, SourceError
from cdcserver.core.gtid import GtidState, binlog_ordinal
from cdcserver.dump import fixups, rawrows
from cdcserver.dump.chunkreader import Run
from cdcserver.dump.chunks import Chunk, ChunkedProgress, TableChanged, service_source
from cdcserver.dump.snapshot import (
    SnapshotPoint,
)
from cdcserver.replication import source as source_sql
from cdcserver.store import checkpoint as ckpt
from cdcserver.store import index as store_index
from cdcserver.store.layout import DataDir
from cdcserver.store.reader import wait_for_checkpoint
from mariadb_cdc_client.format.dump import operation_line

log = logging.getLogger(__name__)


# -- merging -----------------------------------------------------------------------------

Position = tuple[int, int]  # binlog_ordinal(file, pos)
Overlay = dict[tuple[bytes, ...], tuple[Position, str, bytes]]


@dataclass(frozen=True)
class EndPoint:
    point: SnapshotPoint  # the dump's point: the store's checkpoint
    checkpoint: ckpt.Checkpoint


def end_point(conn: Any, data_dir: str, timeout: float, server: str) -> EndPoint:
    """The dump's point: the store's checkpoint, once it has reached the source's position
    after the last chunk. The checkpoint never passes a change without binlog rows (a
    value-filling ALTER, a cascade) that was not repaired, so the dump's point is not
    between such a change and its repair, where the stream's before images would not match
    the dump's rows; and its GTID state is exactly the transactions up to its position."""
    file, pos, state = _source_position(conn)
    try:
        checkpoint = wait_for_checkpoint(data_dir, file, pos, timeout, state)
    except CdcError as exc:
        raise TableChanged(f"the store did not reach the dump's point: {exc}"
                           f"{_repair_pending(data_dir)}") from exc
    position = checkpoint.position
    assert position is not None
    reading = service_source(data_dir)
    if reading is None or reading[1] != server:
        raise TableChanged("the service moved to another server during the dump")
    return EndPoint(SnapshotPoint(position.gtid_state, position.file, position.pos,
                                   dt.datetime.now(dt.UTC)), checkpoint)


def _repair_pending(data_dir: str) -> str:
    """Why the checkpoint may be held back, if a repair beside the stream is under way (its
    files are there): on a source that writes nothing more its records wait for the next
    transaction, and no checkpoint passes the change being repaired until then."""
    if not glob.glob(glob.escape(DataDir(data_dir).views) + ".repair-*"):
        return ""
    return ("; a repair beside the stream is under way, and the checkpoint does not pass "
            "the change it repairs before its records are out: on a source that writes "
            "nothing more they wait for its next transaction (docs/repairs.md)")


def _source_position(conn: Any) -> tuple[str, int, GtidState]:
    """The source's binlog position now, and its GTID state (at or after the position:
    enough to wait for)."""
    file, pos = source_sql.query(conn, "SHOW MASTER STATUS")[0][:2]
    state = GtidState.parse(str(source_sql.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
                                or ""))
    return str(file), int(pos), state


def store_overlay(run: Run, end: EndPoint, timeout: float) -> Overlay:
    """Each key's last change between the snapshot the ranges were split in and the dump's
    point, with where its transaction ends in the binlog (from the store's transaction
    log, read back from its end to that snapshot). When no transaction in that window
    touched the table,
    nothing is read from the table's files (its versions are still checked for a schema
    change)."""
    first = _merged_from(run.progress)
    if first is None:
        return {}
    point = end.point
    origin = end.checkpoint.origin
    if origin is None or binlog_ordinal(origin.file, origin.pos) > \
            binlog_ordinal(*first):
        raise TableChanged("the changes made during the dump are not available: the store "
                           "began replicating after the dump's first read")
    window = store_index.window(DataDir(run.data_dir).index, first,
                                (point.file, point.pos), GtidState.parse(run.progress.floor))
    ends = {t.gtid: binlog_ordinal(t.file, t.pos) for t in window.transactions}
    since = _state_before(window, point.gtid, origin.gtid_state)
    overlay: Overlay = {}
    key_text = run.table.plan.key_text
    try:
        if not any(run.table.name in t.tables for t in window.transactions):
            fixups.check_versions(run.data_dir, run.table.name, since, point.gtid,
                                  (point.file, point.pos), timeout)
            return overlay
        for gtid, kind, row in fixups.records_between(
                run.data_dir, run.table.name, run.table.fields, since, point.gtid,
                (point.file, point.pos), timeout):
            if gtid not in ends:
                raise CdcError(f"the store's transaction log does not hold {gtid} between "
                               f"{first[0]}:{first[1]} and {point.file}:{point.pos}")
            overlay[key_text(row)] = (ends[gtid], kind, row)
    except (fixups.Unavailable, CdcError) as exc:
        raise TableChanged(f"the changes made during the dump are not available: {exc}") \
            from exc
    return overlay


def _merged_from(progress: ChunkedProgress) -> tuple[str, int] | None:
    """Where the changes to merge begin: the snapshot the ranges were split in (rows after
    its last key were read by no chunk), else (a dump recorded before) the earliest chunk;
    None: nothing was read and there is nothing to merge into."""
    if progress.split_file:
        return progress.split_file, progress.split_pos
    chunks = [c for r in progress.ranges for c in r.chunks]
    if not chunks:
        return None
    first = min(chunks, key=lambda c: binlog_ordinal(c.file, c.pos))
    return first.file, first.pos


def _state_before(window: store_index.Window, end: GtidState, origin: GtidState
                  ) -> GtidState:
    """The GTID state at the window's start: the end's, with each domain the window holds
    set back to its last transaction before the window (or where the store began)."""
    inside = {(t.gtid.domain, t.gtid.source_uuid or "") for t in window.transactions}
    kept = [g for g in end if (g.domain, g.source_uuid or "") not in inside]
    for key in inside:
        earlier = window.before.get(key)
        if earlier is None:
            earlier = next((g for g in origin if (g.domain, g.source_uuid or "") == key),
                           None)
        if earlier is not None:
            kept.append(earlier)
    return GtidState(kept)


def merged_lines(run: Run, body: str, overlay: Overlay) -> Iterator[tuple[bytes, int]]:
    """The dump's body with the changes merged in: (line, rows in it). ``body``: the file
    the chunks were read into."""
    key_text = run.table.plan.key_text
    final_in_chunk: set[tuple[bytes, ...]] = set()
    with open(body, "rb") as f:
        for rng in run.progress.ranges:
            for chunk in rng.chunks:
                f.seek(chunk.start)
                read_at = binlog_ordinal(chunk.file, chunk.pos)
                for line in _lines(f, chunk):
                    kept = []
                    for row in _rows_of(line):
                        key = key_text(row)
                        change = overlay.get(key)
                        if change is None:
                            kept.append(row)
                        elif change[0] <= read_at:  # read after its last change
                            kept.append(row)
                            final_in_chunk.add(key)
                    if kept:
                        yield operation_line("insert", kept), len(kept)
    batch: list[bytes] = []
    for key, (_, kind, row) in overlay.items():
        if kind == "insert" and key not in final_in_chunk:
            batch.append(row)
            if len(batch) >= run.batch_rows:
                yield operation_line("insert", batch), len(batch)
                batch = []
    if batch:
        yield operation_line("insert", batch), len(batch)


def _lines(spool: Any, chunk: Chunk) -> Iterator[bytes]:
    remaining = chunk.end - chunk.start
    while remaining > 0:
        line = spool.readline()
        if not line:
            raise SourceError(f"{spool.name} is shorter than its chunk record says")
        remaining -= len(line)
        yield line


def _rows_of(line: bytes) -> list[bytes]:
    """The rows of an insert line as rawrows wrote them (arrays of base64 texts and nulls,
    which hold no brackets)."""
    assert line.startswith(rawrows.INSERT_PREFIX) and line.endswith(b"]]}\n"), line[:60]
    body = line[len(rawrows.INSERT_PREFIX) + 1:-4]
    return [b"[" + part + b"]" for part in body.split(b"],[")]
