"""The ``cdc`` source with a stream position, for Spark Declarative Pipelines' Auto CDC flows.

``create_auto_cdc_flow(..., sequence_by=...)`` needs one column that orders every change of a
key, across all the micro-batches a pipeline ever runs. ``(domain, sequence, event_number)``
does not: in a GTID domain without ``gtid_strict_mode`` sequence numbers can go down, and two
domains' numbers are not comparable. This source adds :data:`POSITION`, a DECIMAL(38,0) that
grows in the order the service stored the records (its binlog order):

    position = batch * 10**24 + partition * 10**18 + row

- ``batch``: a counter the stream's offsets carry (0 in the first offset, one more in each
  new one). Spark keeps offsets in the query's checkpoint, so the counter goes on across
  restarts, and a batch Spark runs again after a crash gets the same numbers;
- ``partition``: the partition's index in the batch. The source plans each table's partitions
  one after the other along its stream (a dump before the changes that follow it);
- ``row``: the record's number in its partition, in the order the service sent them.

Within one table every key's changes are so numbered in stream order; positions of two tables
are comparable too, but only within a batch does that order mean anything across tables.

    from mariadb_cdc_client.spark.pipelines import register
    register(spark)  # format("cdc"), with the column _position

Batch reads (``spark.read``) number with ``batch`` = 0.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import DecimalType, StructField, StructType

from mariadb_cdc_client.spark import plan
from mariadb_cdc_client.spark.source import (
    CdcBatchReader,
    CdcDataSource,
    CdcStreamReader,
    read_partition,
)

POSITION = "_position"
POSITION_TYPE = DecimalType(38, 0)
BATCH = "batch"  # the offsets' counter
_BATCH_UNIT, _PARTITION_UNIT = 10**24, 10**18  # 14 digits of batch, 6 of partition, 18 of row


def position(batch: int, partition: int, row: int) -> int:
    return batch * _BATCH_UNIT + partition * _PARTITION_UNIT + row


class PositionedPartition(InputPartition):
    """A partition of the ``cdc`` source, numbered: its rows' positions start at ``first``."""

    def __init__(self, inner: plan.RangePartition, first: int) -> None:
        super().__init__((inner.value, first))
        self.inner = inner
        self.first = first


class PositionedCdcDataSource(CdcDataSource):
    """``format("cdc")``: the ``cdc`` source's columns, then :data:`POSITION`."""

    def schema(self) -> StructType:
        return with_position(super().schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(plan.Options.parse(self.options, streaming=False),
                            without_position(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(plan.Options.parse(self.options, streaming=True),
                             without_position(schema))


def with_position(schema: StructType) -> StructType:
    if POSITION in schema.fieldNames():
        raise ValueError(f"the source's rows have a column {POSITION!r} already")
    return StructType([*schema.fields, StructField(POSITION, POSITION_TYPE, False)])


def without_position(schema: StructType) -> StructType:
    return StructType([f for f in schema.fields if f.name != POSITION])


def _numbered(parts: list[InputPartition], batch: int) -> list[InputPartition]:
    out: list[InputPartition] = []
    for index, part in enumerate(parts):
        assert isinstance(part, plan.RangePartition)
        out.append(PositionedPartition(part, position(batch, index, 0)))
    return out


def _read(options: plan.Options, schema: StructType, partition: InputPartition
          ) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
    assert isinstance(partition, PositionedPartition)
    if not partition.inner.table:
        return
    arrow_type = pa.decimal128(38, 0)
    row = partition.first
    for item in read_partition(options, schema, partition.inner):
        if isinstance(item, pa.RecordBatch):
            numbers = pa.array([decimal.Decimal(n) for n in range(row + 1, row + 1 +
                                                                  item.num_rows)], arrow_type)
            row += item.num_rows
            yield item.append_column(pa.field(POSITION, arrow_type, False), numbers)
        else:
            row += 1
            yield (*item, decimal.Decimal(row))


class _BatchReader(CdcBatchReader):
    def partitions(self) -> list[InputPartition]:
        return _numbered(super().partitions(), 0)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
        yield from _read(self.options, self.schema, partition)


class _StreamReader(CdcStreamReader):
    def initialOffset(self) -> dict[str, Any]:
        return {**super().initialOffset(), BATCH: 0}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        end = super().latestOffset(start, limit)
        if end is start:
            return start  # nothing new: Spark runs no batch
        return {**end, BATCH: int(start.get(BATCH, 0)) + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return _numbered(super().partitions(start, end), int(end.get(BATCH, 0)))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...] | pa.RecordBatch]:
        yield from _read(self.options, self.schema, partition)


def register(spark: Any) -> None:
    """Make ``format("cdc")`` this source (the ``cdc`` source's columns and
    :data:`POSITION`) in ``spark``, a classic or a Spark Connect session. Its Python workers
    must import this package: run the pipeline with ``PYSPARK_PYTHON`` set to this Python.
    Under Spark Connect, also :func:`tolerate_observed_metrics`."""
    spark.dataSource.register(PositionedCdcDataSource)
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        tolerate_observed_metrics()


def tolerate_observed_metrics() -> None:
    """Work around PySpark 4.3's ``spark-pipelines run`` failing with ``[UNKNOWN_RESPONSE]
    Unknown response: Plan observed(__python_accumulator__=...)`` once a flow has run a Python
    data source: the Spark Connect client's ``execute_command_as_iterator``, which the CLI
    reads the pipeline's events with, takes any response but an event for an error, and the
    server also sends the Python workers' accumulator updates (observed metrics). Those are
    applied (as the client does for a query) and skipped. Idempotent."""
    from pyspark.errors import PySparkValueError
    from pyspark.sql.connect.client.core import PlanObservedMetrics, SparkConnectClient

    if getattr(SparkConnectClient.execute_command_as_iterator, "_cdc_tolerant", False):
        return
    def execute_command_as_iterator(self: Any, command: Any, observations: Any = None
                                    ) -> Iterator[dict[str, Any]]:
        req = self._execute_plan_request_with_metadata()
        self._set_command_in_plan(req.plan, command)
        for response in self._execute_and_fetch_as_iterator(req, observations or {}):
            if isinstance(response, PlanObservedMetrics):
                continue  # accumulator updates: applied by _execute_and_fetch_as_iterator
            if isinstance(response, dict):
                yield response
                continue
            raise PySparkValueError(errorClass="UNKNOWN_RESPONSE",
                                    messageParameters={"response": str(response)})

    execute_command_as_iterator._cdc_tolerant = True  # type: ignore[attr-defined]
    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]


__all__ = ["POSITION", "PositionedCdcDataSource", "position", "register"]
