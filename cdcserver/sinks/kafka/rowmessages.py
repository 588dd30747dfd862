"""A row change's Kafka messages, each with its partition and headers: the work the router
does for each row, in functions of the format and the table shape alone, so that the initial
snapshot's formatting process (:mod:`.snapshotworker`) makes the very same messages.

A row goes to the partition its primary key hashes to (Kafka's own partitioner with
primary-key message keys, :func:`partition`); an update that changes the key to both keys'
partitions. Every message carries the headers ``gtid``, ``event`` and, for a table whose
schema is published, ``schema``.
"""

from __future__ import annotations

import zlib
from typing import Any

from cdcserver.messages.base import MessageFormat, primary_key
from cdcserver.messages.events import RowEvent, TableShape
from cdcserver.sinks.kafka.partitioner import partition_of
from mariadb_cdc_client.format.dump import value_encoder

Headers = list[tuple[str, bytes]]
Routed = tuple[int, bytes, bytes | None, Headers]  # partition, key, value, headers


def message_headers(gtid: bytes, event: int, schema: bytes) -> Headers:
    """``gtid``, ``event`` and, for a table whose schema is published, ``schema``."""
    if schema:
        return [("gtid", gtid), ("event", b"%d" % event), ("schema", schema)]
    return [("gtid", gtid), ("event", b"%d" % event)]


def row_messages(fmt: MessageFormat, e: RowEvent, count: int, schema: bytes,
                 avro_keys: bool) -> list[Routed]:
    """The messages of row change ``e`` in a topic of ``count`` partitions, in order;
    ``avro_keys``: keys in Avro, placed where Kafka's partitioner puts their bytes."""
    shape = e.shape
    partitions = () if avro_keys else partitions_of(fmt, e, count)
    gtid = e.gtid_text.encode()
    out: list[Routed] = []
    for key, value, event, keyed_by, own in fmt.routed_rows(e):
        with_headers = message_headers(gtid, event, schema)
        if own:
            with_headers.extend(own)
        if avro_keys:
            targets: tuple[int, ...] = (partition_of(key, count),)
        else:
            targets = partitions if keyed_by is None else (
                partition(fmt, shape, keyed_by, count),)
        for target in targets:
            out.append((target, key, value, with_headers))
    return out


def partitions_of(fmt: MessageFormat, e: RowEvent, count: int) -> tuple[int, ...]:
    """The row's partition; an update's both keys' partitions, if the key changed."""
    before, after = e.before, e.after
    if before is None or after is None:
        row = after if before is None else before
        assert row is not None
        return (partition(fmt, e.shape, row, count),)
    return tuple(sorted({partition(fmt, e.shape, before, count),
                         partition(fmt, e.shape, after, count)}))


def partition(fmt: MessageFormat, shape: TableShape, row: tuple[Any, ...], count: int) -> int:
    """With primary-key message keys, Kafka's own partitioner (murmur2 of the key), so the
    topic is partitioned as any producer of those keys would; else a CRC-32 of the table and
    the primary key's text."""
    if fmt.key_style == "primary-key":
        return partition_of(primary_key(shape, row), count)
    encoders = shape.cache.get("kafka.key_encoders")
    if encoders is None:
        fields = shape.fields
        key_columns = shape.primary_key or tuple(range(len(fields)))
        encoders = shape.cache["kafka.key_encoders"] = (
            str(shape.table).encode(), [(i, value_encoder(fields[i])) for i in key_columns])
    name, columns = encoders
    key = b"\x00".join([name, *[b"\x01" if row[i] is None else encode(row[i])
                                for i, encode in columns]])
    return zlib.crc32(key) % count
