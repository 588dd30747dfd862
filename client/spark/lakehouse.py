"""A table's changes into a lakehouse table: Delta Lake (delta-rs) or Apache Iceberg (pyiceberg).

Each micro-batch of the ``cdc`` source becomes one commit to the table, sized by the batch:

- **Order.** The batch's records are numbered in the order the source reads them
  (:func:`in_stream_order`): Spark numbers a scan's partitions in the order the source planned
  them (a table's ranges, cut one after the other along its stream) and each partition's rows
  in the order the service sent them, its stored (binlog) order. So the number follows the
  service's order even in a GTID domain whose sequence numbers went down
  (``gtid_strict_mode=OFF``), where ``(domain, sequence, event_number)`` would not. Numbers
  are compared within a batch only: batches are applied one after the other.
- **Last change per key** (:func:`last_changes`): for each primary key the batch's last record
  decides. ``insert``/``update_after`` put the row, ``delete``/``update_before`` remove it (a
  primary-key change is an ``update_before`` of the old key and an ``update_after`` of the new).
- **One commit.** Delta: one ``MERGE`` (matched and removed: delete; matched: update every
  column; not matched and present: insert). Iceberg: one transaction that overwrites the rows
  of the batch's keys (a copy-on-write delete of those keys, then an append of the present
  rows), committed as one new table metadata version; pyiceberg records it as up to three
  snapshots (files dropped, files rewritten, rows appended), each named with the batch.
- **Exactly once.** The commit carries the query's id and the batch id: Delta as an
  application transaction (``txn`` action: ``app_id``, ``version``), Iceberg as the table
  properties ``mariadb-cdc.app-id``/``mariadb-cdc.batch-id`` set in the same transaction (and in
  each snapshot's summary). A batch whose id is not above the one committed is skipped, so a
  batch Spark runs again after a crash is not applied twice. The id is the streaming query's
  (kept in its checkpoint): a new checkpoint is a new query and skips nothing.
- **A new table** is written by a plain append of the first batch (``startingPosition=dump``:
  the whole dump, in bulk).
- **Schema.** A column new in the batch is added to the table (Delta ``merge_schema``, Iceberg
  ``union_by_name``). A column the batch lacks (its versions were removed by retention) stays in
  the table and is null in the rows written from then on. A column whose type the source
  widened (INT→BIGINT, FLOAT→DOUBLE, a wider DECIMAL) is widened in the table: Iceberg in its
  metadata where Iceberg allows the promotion (int→long, float→double, a decimal's precision;
  anything else fails the batch), Delta by rewriting the table once with the wider type (delta-rs
  cannot widen in place). A narrowed column keeps the wider type: the source's schema already
  does.
- **Types.** Spark's, through Arrow, except TIME (``interval day to second``, ±838 hours),
  which neither format has: a BIGINT of microseconds. TIMESTAMP is stored as an instant (UTC).
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from mariadb_cdc_client.format.extras import MissingExtra
from mariadb_cdc_client.spark.types import METADATA

POSITION = "_position"  # a record's place in its batch, in stream order
DELETED = "_cdc_deleted"  # in a batch's last changes: the key's row is removed
APP_ID, BATCH_ID = "mariadb-cdc.app-id", "mariadb-cdc.batch-id"
# Copy on write rewrites every data file holding a key the batch changes: files much smaller
# than the table are what keeps a batch's cost to the files its keys are in. 32 MiB is what
# Delta Lake picks for tables that MERGE rewrites often (delta.tuneFileSizesForRewrites).
FILE_SIZE = 32 * 2**20
FORMATS = ("parquet", "delta", "iceberg")
_REMOVED = ("delete", "update_before")


def require_lakehouse(feature: str, module: str) -> None:
    """Raise :class:`MissingExtra` (the ``lakehouse`` extra) unless ``module`` is there."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(feature, "lakehouse", module)


# -- a batch's last changes --------------------------------------------------------------

def in_stream_order(changes: Any) -> Any:
    """The batch's records with :data:`POSITION`, growing in the order the source read them.

    ``monotonically_increasing_id`` is the partition's index in the upper bits and the row's
    number in it in the lower: put straight on the source's scan, before any shuffle, it
    follows the planned ranges and the service's order within each."""
    from pyspark.sql import functions as F

    return changes.withColumn(POSITION, F.monotonically_increasing_id())


def last_changes(batch: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key of the batch (its record with the highest position): the table's
    columns in the lakehouse types (:func:`lake_types`), and :data:`DELETED`."""
    if batch.num_rows:
        newest = batch.select([*key, POSITION]).group_by(list(key), use_threads=False) \
            .aggregate([(POSITION, "max")])
        batch = batch.filter(pc.is_in(batch[POSITION], value_set=newest[POSITION + "_max"]))
    removed = pc.is_in(batch["event_type"], value_set=pa.array(_REMOVED))
    metadata = {*METADATA.fieldNames(), POSITION}
    columns = lake_types(batch.drop_columns([c for c in batch.column_names if c in metadata]))
    return columns.append_column(pa.field(DELETED, pa.bool_(), False), removed)


def lake_types(table: pa.Table) -> pa.Table:
    """Spark's Arrow types as both formats take them: TIME (a duration) as int64
    microseconds, a TIMESTAMP in UTC."""
    for i, f in enumerate(table.schema):
        if pa.types.is_duration(f.type):
            column = pc.cast(table[i], pa.duration("us")).cast(pa.int64())
            table = table.set_column(i, pa.field(f.name, pa.int64(), f.nullable), column)
        elif pa.types.is_timestamp(f.type) and f.type.tz is not None:
            utc = pa.timestamp("us", tz="UTC")
            table = table.set_column(i, pa.field(f.name, utc, f.nullable),
                                     pc.cast(table[i], utc))
    return table


def present(rows: pa.Table) -> pa.Table:
    """The last changes that put a row, as table rows."""
    return rows.filter(pc.invert(rows[DELETED])).drop_columns([DELETED])


def with_columns(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with a null column for each of ``schema``'s it lacks (a dropped column)."""
    for f in schema:
        if f.name not in rows.column_names:
            rows = rows.append_column(pa.field(f.name, f.type, True),
                                      pa.nulls(rows.num_rows, f.type))
    return rows


# -- sinks ---------------------------------------------------------------------------------

class Sink(Protocol):
    def applied(self) -> int | None:
        """The id of the last batch this query committed (None: none)."""

    def write(self, rows: pa.Table, batch_id: int) -> None:
        """Commit a batch's last changes (:func:`last_changes`) with its id."""


def apply_batch(sink: Sink, changes: Any, batch_id: int, key: Sequence[str]) -> bool:
    """``foreachBatch``'s work: one micro-batch into the table. False: it was committed
    before (Spark runs a batch again after a crash), and nothing was done."""
    done = sink.applied()
    if done is not None and batch_id <= done:
        return False
    sink.write(last_changes(in_stream_order(changes).toArrow(), key), batch_id)
    return True


@dataclass
class DeltaSink:
    """A Delta Lake table at ``path`` (a directory or a URI delta-rs takes)."""

    path: str
    key: Sequence[str]
    app_id: str
    storage_options: dict[str, str] | None = None
    file_size: int = FILE_SIZE  # target bytes of a data file

    def __post_init__(self) -> None:
        require_lakehouse("a Delta Lake mirror", "deltalake")

    def _table(self) -> Any:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path, self.storage_options):
            return None
        return DeltaTable(self.path, storage_options=self.storage_options)

    def applied(self) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(self.app_id)

    def _commit(self, batch_id: int) -> Any:
        from deltalake import CommitProperties, Transaction

        return CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)],
                                custom_metadata={APP_ID: self.app_id, BATCH_ID: str(batch_id)})

    def write(self, rows: pa.Table, batch_id: int) -> None:
        from deltalake import write_deltalake

        table = self._table()
        if table is None:  # a new table (the dump, in bulk): nothing to remove or match
            write_deltalake(self.path, present(rows), mode="append",
                            storage_options=self.storage_options,
                            target_file_size=self.file_size,  # this write's, then MERGE's:
                            configuration={"delta.targetFileSize": str(self.file_size)},
                            commit_properties=self._commit(batch_id))
            return
        if not rows.num_rows:
            return  # nothing to apply (the source runs no empty batch; a replay finds none)
        table = self._widen(table, rows.schema)
        rows = with_columns(rows, pa.schema(table.schema().to_arrow()))
        match = " AND ".join(f't."{k}" = s."{k}"' for k in self.key)
        # streamed_exec=False: delta-rs then skips the files whose key range the batch's
        # keys miss (from the source's min/max), instead of scanning every file
        (table.merge(rows, match, source_alias="s", target_alias="t", merge_schema=True,
                     streamed_exec=False, commit_properties=self._commit(batch_id))
         .when_matched_delete(f's."{DELETED}"')
         .when_matched_update_all(except_cols=[DELETED])
         .when_not_matched_insert_all(f'NOT s."{DELETED}"', except_cols=[DELETED])
         .execute())

    def _widen(self, table: Any, schema: pa.Schema) -> Any:
        """The table, rewritten once with the batch's type for each column the source widened
        (delta-rs has no in-place type widening); a separate commit, which a replay after a
        crash finds done."""
        from deltalake import DeltaTable, Schema, write_deltalake

        have = {f.name: str(f.type) for f in table.schema().fields}
        wanted = {f.name: f for f in Schema.from_arrow(schema).fields}
        changed = [n for n in have if n in wanted and str(wanted[n].type) != have[n]]
        if not changed:
            return table
        current = pa.schema(table.schema().to_arrow())
        target = pa.schema([schema.field(f.name) if f.name in changed else f for f in current])
        reader = pa.RecordBatchReader.from_batches(
            target, (b.cast(target) for b in table.to_pyarrow_dataset().to_batches()))
        write_deltalake(table, reader, mode="overwrite", schema_mode="overwrite",
                        storage_options=self.storage_options)
        return DeltaTable(self.path, storage_options=self.storage_options)


def iceberg_catalog(uri: str, warehouse: str, name: str = "mariadb_cdc") -> Any:
    """pyiceberg's SQL catalog (``sqlite:///catalog.db``, or any SQLAlchemy URI) with its
    data under ``warehouse`` (a directory, or a URI pyiceberg's FileIO takes)."""
    require_lakehouse("an Iceberg mirror", "pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    if "://" not in warehouse:
        warehouse = "file://" + os.path.abspath(warehouse)
    return SqlCatalog(name, uri=uri, warehouse=warehouse)


@dataclass
class IcebergSink:
    """An Iceberg table ``identifier`` (namespace, name) of a pyiceberg catalog."""

    catalog: Any
    identifier: tuple[str, str]
    key: Sequence[str]
    app_id: str
    file_size: int = FILE_SIZE  # target bytes of a data file (pyiceberg: of Arrow in memory)

    def _table(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def applied(self) -> int | None:
        table = self._table()
        if table is None or table.properties.get(APP_ID) != self.app_id:
            return None
        return int(table.properties[BATCH_ID])

    def write(self, rows: pa.Table, batch_id: int) -> None:
        stamp = {APP_ID: self.app_id, BATCH_ID: str(batch_id)}
        table = self._table()
        if table is None:  # a new table (the dump, in bulk)
            self.catalog.create_namespace_if_not_exists(self.identifier[0])
            new = present(rows)
            table = self.catalog.create_table(
                self.identifier, schema=new.schema,
                properties={"write.target-file-size-bytes": str(self.file_size)})
            with table.transaction() as tx:
                tx.append(new, snapshot_properties=stamp)
                tx.set_properties(stamp)
            return
        if not rows.num_rows:
            return  # nothing to apply (the source runs no empty batch; a replay finds none)
        schema = rows.drop_columns([DELETED]).schema
        with table.transaction() as tx:
            with tx.update_schema() as update:
                update.union_by_name(schema)  # new columns; int→long, float→double...
            rows = with_columns(rows, tx.table_metadata.schema().as_arrow())
            with warnings.catch_warnings():  # keys only inserted: nothing to delete
                warnings.filterwarnings("ignore", "Delete operation did not match any records")
                tx.overwrite(present(rows), overwrite_filter=self._of_keys(rows),
                             snapshot_properties=stamp)
            tx.set_properties(stamp)

    def _of_keys(self, rows: pa.Table) -> Any:
        """A filter for the rows of the batch's keys (with the key's range too, when it is one
        column: pyiceberg prunes files by range, but not by an IN of over 200 values)."""
        import pyiceberg.expressions
        from pyiceberg.table.upsert_util import create_match_filter

        if len(self.key) > 1:
            return create_match_filter(rows, list(self.key))
        ex: Any = pyiceberg.expressions  # pydantic models: mypy misreads their constructors
        (name,) = self.key
        bounds = pc.min_max(rows[name])
        return ex.And(ex.In(name, rows[name].to_pylist()),
                      ex.GreaterThanOrEqual(name, bounds["min"].as_py()),
                      ex.LessThanOrEqual(name, bounds["max"].as_py()))


# -- the streaming query's side ----------------------------------------------------------------

def query_id(spark: Any, checkpoint: str) -> str:
    """The streaming query's id, which Spark keeps in its checkpoint (``metadata``, written
    when the query is created, before its first batch) and keeps across restarts."""
    path = os.path.join(checkpoint, "metadata")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.readline()
    else:  # a checkpoint on another file system: Spark reads it
        text = spark.read.text(path).first()[0]
    return str(json.loads(text)["id"])


@dataclass
class Batches:
    """``foreachBatch``'s function for a lakehouse table: makes its sink at the first batch,
    once the query's id is in the checkpoint."""

    spark: Any
    format: str
    path: str
    checkpoint: str
    table: tuple[str, str]  # (database, table)
    key: Sequence[str]
    catalog: str | None = None
    file_size: int = FILE_SIZE
    sink: Sink | None = None

    def __call__(self, changes: Any, batch_id: int) -> None:
        if self.sink is None:
            self.sink = self.make_sink("mariadb-cdc " + query_id(self.spark, self.checkpoint))
        apply_batch(self.sink, changes, batch_id, self.key)

    def make_sink(self, app_id: str) -> Sink:
        if self.format == "delta":
            return DeltaSink(self.path, self.key, app_id, file_size=self.file_size)
        if self.format == "iceberg":
            if "://" not in self.path:
                os.makedirs(self.path, exist_ok=True)  # the default catalog's file is there
            uri = self.catalog or "sqlite:///" + os.path.join(os.path.abspath(self.path),
                                                                "catalog.db")
            return IcebergSink(iceberg_catalog(uri, self.path), self.table, self.key, app_id,
                               self.file_size)
        raise ValueError(f"not a lakehouse format: {self.format!r}")
