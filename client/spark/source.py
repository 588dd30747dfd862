"""The ``cdc`` data source: ``spark.read.format("cdc")`` and ``spark.readStream.format("cdc")``.

The driver (:mod:`mariadb_cdc_client.spark.plan`) lists the tables, fixes the schema and
plans ranges; each Spark partition then reads one range of one table on an executor, over its
own connection, with the bounded read extension (:mod:`mariadb_cdc_client.ranges`), or one
whole dump.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import (
    DataType,
    DateType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from mariadb_cdc_client.arrow import dump_event_types, dump_stamp, invalid_date, read_batches
from mariadb_cdc_client.format.avro import Header
from mariadb_cdc_client.format.dump import DumpHeader, DumpRows
from mariadb_cdc_client.format.names import as_table, table_ref
from mariadb_cdc_client.ranges import Position
from mariadb_cdc_client.spark import plan
from mariadb_cdc_client.spark.arrow import BatchMaker
from mariadb_cdc_client.spark.types import METADATA, SchemaError, fits, table_schema
from mariadb_cdc_client.sync import SyncCdcClient


class CdcDataSource(DataSource):
    """Options: host, port, user, password, tables (``db.t``, a comma-separated list, or
    fnmatch patterns such as ``shop.order_*``; a name with a space, a dot or a comma quoted as
    in MariaDB: ```my db`.t``), startingPosition (earliest, latest, dump, or
    a GTID state), endingPosition (batch reads: latest or a GTID state), maxRowsPerBatch
    (streaming), maxRowsPerPartition, zeroDates (error or null), timeout (seconds), auth
    (auto: SCRAM-SHA-256 when the server offers it; scram: never MaxScale's replayable
    login; legacy: MaxScale's only)."""

    @classmethod
    def name(cls) -> str:
        return "cdc"

    def schema(self) -> StructType:
        options = plan.Options.parse(self.options, streaming=False)
        conn = options.connect()
        try:
            catalog = plan.Catalog.load(conn, options)
        finally:
            conn.close()
        return table_schema(catalog.schemas())

    def reader(self, schema: StructType) -> DataSourceReader:
        return CdcBatchReader(plan.Options.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return CdcStreamReader(plan.Options.parse(self.options, streaming=True), schema)


class CdcBatchReader(DataSourceReader):
    def __init__(self, options: plan.Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        """One partition per dump, and per cut of each table's changes (after its dump)."""
        conn = self.options.connect()
        try:
            catalog = plan.Catalog.load(conn, self.options)
            start = plan.start_positions(conn, catalog, self.options)
            until = self.options.ending
            if until == plan.LATEST:
                until = conn.query("QUERY-STATE")["gtid_state"]
            changes = {t: {"gtid_state": o["gtid_state"]} if "dump" in o else o
                       for t, o in start.items()}
            end = plan.end_positions(conn, changes, self.options, None, until)
        finally:
            conn.close()
        parts: list[InputPartition] = [plan.RangePartition(t, o, changes[t])
                                       for t, o in start.items() if "dump" in o]
        parts += plan.partitions(changes, end)
        return parts or [plan.RangePartition("", {}, {})]  # Spark needs one, even empty

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
        assert isinstance(partition, plan.RangePartition)
        if partition.table:
            yield from read_partition(self.options, self.schema, partition)


class CdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: plan.Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._conn: Any = None
        self._target: str | None = None  # availableNow: what was stored when it started

    def _query(self) -> Any:
        if self._conn is None:
            self._conn = self.options.connect()
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def initialOffset(self) -> dict[str, Any]:
        try:
            conn = self._query()
            catalog = plan.Catalog.load(conn, self.options)
            return {"tables": plan.start_positions(conn, catalog, self.options)}
        except BaseException:
            self._drop()
            raise

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: read up to what is stored now, in batches of maxRowsPerBatch."""
        try:
            self._target = self._query().query("QUERY-STATE")["gtid_state"]
        except BaseException:
            self._drop()
            raise

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        limit = self.options.max_rows_per_batch
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        rows = getattr(limit, "max_rows", None)
        try:
            ends = plan.end_positions(self._query(), start["tables"], self.options, rows,
                                      self._target)
        except BaseException:
            self._drop()
            raise
        if all(plan.same_position(start["tables"][t], ends[t]) for t in ends):
            return start  # nothing new: Spark runs no batch
        return {"tables": ends}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        return list(plan.partitions(start["tables"], end["tables"]))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
        assert isinstance(partition, plan.RangePartition)
        yield from read_partition(self.options, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        return None  # the service keeps the data; retention, not commits, frees it

    def stop(self) -> None:
        self._drop()


# -- executors -------------------------------------------------------------------------------

def read_partition(options: plan.Options, schema: StructType, partition: plan.RangePartition
                   ) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
    """A range's records as Arrow record batches; a dump's rows as tuples."""
    if "dump" in partition.start:
        yield from read_dump(options, schema, partition.start["dump"])
        return
    def maker(avsc: dict[str, Any], header: Header) -> BatchMaker:
        _check_fits(schema, avsc)
        return BatchMaker(schema, avsc, header, options.zero_dates)

    table = as_table(partition.table)
    conn = options.connect("AVRO")
    try:
        yield from read_batches(conn, (table.database, table.table),
                                Position.from_json(partition.start),
                                Position.from_json(partition.end), maker)
    finally:
        conn.close()


def _check_fits(schema: StructType, avsc: dict[str, Any]) -> None:
    problem = fits(schema, avsc)
    if problem is not None:
        raise SchemaError(
            f"{table_ref(avsc['database'], avsc['table'])} changed to version {avsc['version']} "
            f"(GTID {avsc.get('gtid')}): {problem}. Restart the query (from its checkpoint) "
            "to read on with the new schema")


def read_dump(options: plan.Options, schema: StructType, name: str
              ) -> Iterator[tuple[Any, ...]]:
    """A dump's rows: ``insert`` (and, for a resumed dump, ``update_before``/``update_after``
    and ``delete``) records stamped with the dump's GTID, numbered in the dump's order."""
    client = SyncCdcClient(options.host, options.port, options.user, options.password,
                           timeout=options.timeout, max_retries=0, auth=options.auth)
    header: DumpHeader | None = None
    number = 0
    convert: list[tuple[str, Any]] = []
    stamp: tuple[Any, ...] = ()
    for item in client.dump(name, follow=False):
        if isinstance(item, DumpHeader):
            header = item
            _check_fits(schema, header.schema)
            convert = _dump_plan(schema, header, options.zero_dates)
            stamp = _dump_stamp(header)
            continue
        assert header is not None and isinstance(item, DumpRows)
        for row, event_type in zip(item.rows, dump_event_types(item.action, len(item.rows)),
                                   strict=True):
            number += 1
            values = [None if column is None else fix(row.get(column))
                      for column, fix in convert]
            yield (*stamp[:3], number, stamp[3], event_type, *stamp[4:], *values)


def _dump_stamp(header: DumpHeader) -> tuple[Any, ...]:
    """(domain, server_id, sequence, timestamp, table, version) of a dump's rows."""
    return (*dump_stamp(header), table_ref(header.database, header.table),
            int(header.schema.get("version", 0)))


def _dump_plan(schema: StructType, header: DumpHeader, zero_dates: str
               ) -> list[tuple[Any, Any]]:
    by_name = {f.name: f for f in header.columns}
    steps: list[tuple[Any, Any]] = []
    for target in schema.fields[len(METADATA.fields):]:
        field = by_name.get(target.name)
        steps.append((None, None) if field is None else
                     (field.column, _dump_value(target.dataType, zero_dates)))
    return steps


def _dump_value(target: DataType, zero_dates: str) -> Any:
    """Dump values are typed already; make them what Spark's type takes."""
    def fix(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(target, StringType) and not isinstance(value, str):
            return str(value)
        if isinstance(target, (DateType, TimestampType, TimestampNTZType)) \
                and isinstance(value, str):
            invalid_date(value, zero_dates)
            return None
        return value
    return fix
