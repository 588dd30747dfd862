"""The version files the store writes, and which of them a transaction's rows go to.

Rows of one table layout go to the table's current version while its Avro fields stay the same;
other fields, a re-created table or a schema statement start a new version, created by the open
transaction and invisible until it commits (:class:`OpenTransaction` holds what it created and
wrote). A version's writer stays open while the version may be written; once a newer version is
committed and a flush has made the old one durable, its writer is closed
(:meth:`VersionFiles.close_sealed`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdcserver.core.changes import Begin, EventType, Rows, RowsKind, TableChange, TableLayout
from cdcserver.core.durable import write_atomically
from cdcserver.core.names import TableName
from cdcserver.store.avrofile import OpenFiles, VersionFileWriter
from cdcserver.store.catalog import Catalog, VersionInfo
from cdcserver.store.encoder import RecordsEncoder, compile_encoder, record_tail
from cdcserver.store.faults import TableFault
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import MAX_VERSION
from cdcserver.store.schema import TableSchema
from cdcserver.store.transcoder import Transcoder, compile_transcoder, records

log = logging.getLogger("cdcserver.store.store")  # as before: operators grep for it

ROUTES_PER_TABLE = 4  # layouts of one table kept routed at once

_TAILS = {RowsKind.INSERT: (EventType.INSERT, EventType.INSERT),
          RowsKind.DELETE: (EventType.DELETE, EventType.DELETE),
          RowsKind.UPDATE: (EventType.UPDATE_BEFORE, EventType.UPDATE_AFTER)}


@dataclass
class Target:
    """A table version being written by the open transaction."""

    info: VersionInfo
    writer: VersionFileWriter
    start: int  # where this transaction's data for the version begins
    new: bool  # the version was created by this transaction


@dataclass
class Route:
    """Where rows decoded with one table layout go, and how they are encoded."""

    layout: TableLayout
    info: VersionInfo
    encode: RecordsEncoder
    transcode: Transcoder | None  # the compiled path, for rows handed over as images


@dataclass
class OpenTransaction:
    """What the open transaction wrote, created and noted, until its commit publishes it."""

    begin: Begin
    head: bytes
    event_no: int = 1
    targets: dict[tuple[TableName, int], Target] = field(default_factory=dict)
    created: dict[TableName, VersionInfo] = field(default_factory=dict)  # new versions
    fresh: dict[TableName, bool] = field(default_factory=dict)  # re-created: True, served: False
    notes: list[tuple[VersionInfo, int, str]] = field(default_factory=list)  # repair blocks
    # each table's records and the highest event number among them
    counts: dict[TableName, tuple[int, int]] = field(default_factory=dict)


class VersionFiles:
    """The writers of the versions open for writing, and the routes of layouts to them."""

    def __init__(self, layout: DataDir, catalog: Catalog, *, codec: str, block_size: int,
                 max_open_files: int) -> None:
        self.layout = layout
        self.catalog = catalog
        self.codec = codec
        self.block_size = block_size
        self.writers: dict[tuple[TableName, int], VersionFileWriter] = {}
        self.files = OpenFiles(max_open_files)  # of the writers: the rest are parked
        self.routes: dict[int, Route] = {}  # by id() of the layout
        # Each table's routes, newest last: the decoder hands a new layout object for every
        # table after any DDL, so only the last few are kept (a repair's rows may alternate
        # with the stream's, each with a layout object of its own)
        self.table_routes: dict[TableName, list[int]] = {}
        self.fresh: set[TableName] = set()  # re-created tables awaiting their first rows
        self.retired: list[VersionFileWriter] = []  # to close once no flush can use them
        # Writers that may belong to a table's older version, to close after a flush (the
        # flush looks at these, not at every table's writer)
        self.maybe_sealed: set[tuple[TableName, int]] = set()
        self.new_files = False  # created since the last flush: the directory needs an fsync

    def close(self) -> None:
        for writer in [*self.writers.values(), *self.retired]:
            writer.close()
        self.writers.clear()
        self.retired.clear()

    def write_rows(self, txn: OpenTransaction, rows: Rows) -> int:
        """Encode a rows change into its version's block buffer; the records it made."""
        route = self.routes.get(id(rows.layout))
        if route is None or route.layout is not rows.layout or route.info.sealed:
            route = self.route(rows.layout, txn)
        target = self.target(txn, route.info)
        kinds = _TAILS[rows.kind]
        tails = (record_tail(rows.timestamp, kinds[0]), record_tail(rows.timestamp, kinds[1]))
        writer = target.writer
        if rows.repair:  # a block of its own, so the stream can say why it is there
            writer.end_block()
            txn.notes.append((target.info, writer.size, rows.repair))
        avro = None
        if rows.images is not None and route.transcode is not None:
            avro = route.transcode.rows(*rows.images)
        if avro is not None:
            txn.event_no = records(writer.buffer, txn.head, tails, *avro, txn.event_no)
            count = len(avro[1]) // 4
        else:
            txn.event_no = route.encode(writer.buffer, txn.head, tails, rows.rows, txn.event_no)
            count = len(rows.rows)
        writer.count += count
        table = route.info.table
        before, _ = txn.counts.get(table, (0, 0))
        txn.counts[table] = (before + count, txn.event_no - 1)
        if rows.repair or len(writer.buffer) >= self.block_size:
            writer.end_block()
        return count

    def route(self, layout: TableLayout, txn: OpenTransaction) -> Route:
        """Pick the version rows of ``layout`` belong to: the table's current version if its
        Avro fields are the same, otherwise a new version."""
        table = TableName(layout.database, layout.table)
        candidate = TableSchema.from_layout(layout, 1, "")
        current = self.current_version(table, txn)
        fresh = txn.fresh.get(table, table in self.fresh)
        if current is not None and not fresh and _same_columns(current.schema, candidate):
            info = current
        else:
            info = self.new_version(table, txn, base=candidate)
            if fresh:
                txn.fresh[table] = False
        fields = info.schema.columns
        route = Route(layout, info, compile_encoder(fields, layout.columns),
                      compile_transcoder(fields, layout.image_columns, layout.salt))
        self._keep_route(table, route)
        return route

    def _keep_route(self, table: TableName, route: Route) -> None:
        key = id(route.layout)
        kept = self.table_routes.setdefault(table, [])
        if key in kept:  # the layout routed again (its version sealed meanwhile)
            kept.remove(key)
        while len(kept) >= ROUTES_PER_TABLE:
            self.routes.pop(kept.pop(0), None)
        kept.append(key)
        self.routes[key] = route

    def table_change(self, txn: OpenTransaction, change: TableChange,
                     note: dict[str, Any]) -> None:
        """Start the version a schema statement's change of a table calls for, if any;
        ``note`` is its ``ddl`` key."""
        table = TableName(change.database, change.table)
        self.drop_table_routes(table)
        current = self.current_version(table, txn)
        if change.layout is not None:
            if change.kind == "create" or current is None or change.changed:
                self.new_version(table, txn, layout=change.layout, ddl=note)
        elif change.kind in ("truncate", "drop") and current is not None:
            self.new_version(table, txn, base=current.schema, ddl=note)
        elif change.kind == "create":
            txn.fresh[table] = True  # columns unknown: the next rows start a version

    def current_version(self, table: TableName, txn: OpenTransaction) -> VersionInfo | None:
        if table in txn.created:
            return txn.created[table]
        entry = self.catalog.get(table)
        return entry.latest() if entry else None

    def target(self, txn: OpenTransaction, info: VersionInfo) -> Target:
        key = (info.table, info.version)
        target = txn.targets.get(key)
        if target is None:
            writer = self.writer(info)
            new = txn.created.get(info.table) is info
            target = txn.targets[key] = Target(info, writer, writer.size, new)
        return target

    def new_version(self, table: TableName, txn: OpenTransaction, *,
                    layout: TableLayout | None = None, base: TableSchema | None = None,
                    ddl: dict[str, Any] | None = None) -> VersionInfo:
        """Create the next version of ``table``, from a layout or with ``base``'s columns;
        it becomes visible when the transaction commits."""
        current = self.current_version(table, txn)
        version = 1 if current is None else current.version + 1
        if version > MAX_VERSION:
            raise TableFault(f"{table} has reached the last version number {MAX_VERSION}")
        gtid = str(txn.begin.gtid)
        if layout is not None:
            schema = TableSchema.from_layout(layout, version, gtid, ddl)
        else:
            assert base is not None
            schema = base.successor(version, gtid, ddl)
        avsc_path = self.layout.table_file(table, version, "avsc")
        path = self.layout.table_file(table, version, "avro")
        try:
            write_atomically(avsc_path, schema.text().encode("utf-8") + b"\n")
            writer = VersionFileWriter.create(path, schema.text(), self.codec, self.files)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(avsc_path)
            raise
        self.writers[(table, version)] = writer
        self.maybe_sealed.add((table, version))
        if current is not None:
            self.maybe_sealed.add((table, current.version))  # sealed once this commits
        self.new_files = True
        self.drop_table_routes(table)
        log.info("%s: version %d (transaction %s%s)", table, version, gtid,
                 f", {ddl['kind']}" if ddl else "")
        info = VersionInfo(table, version, schema, path, writer.header, writer.size)
        txn.created[table] = info
        txn.targets[(table, version)] = Target(info, writer, writer.size, True)
        return info

    def writer(self, info: VersionInfo) -> VersionFileWriter:
        key = (info.table, info.version)
        writer = self.writers.get(key)
        if writer is None:
            writer = self.writers[key] = VersionFileWriter.known(
                info.path, info.header, info.committed, self.files)
            self.maybe_sealed.add(key)
        return writer

    def retire(self, key: tuple[TableName, int]) -> None:
        """A version the open transaction created and dropped: a flush in progress may be
        fsyncing its writer, so it is closed after the next flush."""
        self.retired.append(self.writers.pop(key))

    def drop_table_routes(self, table: TableName) -> None:
        for key in self.table_routes.pop(table, ()):
            self.routes.pop(key, None)

    def drop_routes(self, matches: Callable[[VersionInfo], bool]) -> None:
        for table, kept in list(self.table_routes.items()):
            for key in [k for k in kept if matches(self.routes[k].info)]:
                kept.remove(key)
                del self.routes[key]
            if not kept:
                del self.table_routes[table]

    def close_sealed(self, txn: OpenTransaction | None) -> None:
        """After a flush: close the writers no transaction will write again."""
        for retired in self.retired:
            retired.close()
        self.retired.clear()
        for key in list(self.maybe_sealed):
            writer = self.writers.get(key)
            entry = self.catalog.get(key[0])
            latest = entry.latest() if entry else None
            if writer is None or (latest is not None and latest.version == key[1]):
                self.maybe_sealed.discard(key)  # gone, or the newest: a new version adds it
            elif latest is not None and not writer.dirty \
                    and (txn is None or key not in txn.targets):
                writer.close()
                del self.writers[key]
                self.maybe_sealed.discard(key)


def _same_columns(current: TableSchema, candidate: TableSchema) -> bool:
    return (current.avsc["fields"] == candidate.avsc["fields"]
            and current.avsc.get("primary_key") == candidate.avsc.get("primary_key"))
