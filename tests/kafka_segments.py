"""The record batches of a Kafka partition as its broker stored them, read from its log
segment files: which producer (id, epoch) wrote each batch, whether it is transactional, and
each transaction marker (COMMIT or ABORT) with its time. For the failure messages of the
exactly-once tests, which must tell a commit the sink made of changes past its position from
a commit it read back too early; a consumer sees neither producers nor markers.

Kafka's own tool for this (DumpLogSegments) is in ``kafka-tools``, which the tests do not
fetch; the batch header (record format v2, the only one Kafka 4 writes) is 61 bytes:
baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc uint32,
attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64,
producerId int64, producerEpoch int16, baseSequence int32, recordCount int32 (big-endian).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mariadb_cdc_client.format.avro import read_varint  # (Kafka's varints are Avro's)

HEADER = struct.Struct(">qiibIhiqqqhii")
TRANSACTIONAL, CONTROL = 0x10, 0x20


@dataclass(frozen=True)
class Batch:
    first: int
    last: int
    producer: int
    epoch: int
    transactional: bool
    marker: str  # "COMMIT" or "ABORT" for a control batch, else ""
    time_ms: int

    def __str__(self) -> str:
        at = dt.datetime.fromtimestamp(self.time_ms / 1000, dt.UTC)
        what = self.marker or ("data" if self.transactional else "data (not transactional)")
        return (f"{self.first}-{self.last} {what} producer {self.producer} epoch "
                f"{self.epoch} at {at:%H:%M:%S.%f}"[:-3] + " UTC")


def batches(partition_dir: Path) -> Iterator[Batch]:
    """The batches of the partition stored in ``partition_dir`` (``<log.dirs>/topic-N``),
    in offset order."""
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        at = 0
        while at + HEADER.size <= len(data):
            (first, length, _, magic, _, attributes, last_delta, _, max_time, producer, epoch,
             _, _) = HEADER.unpack_from(data, at)
            if magic != 2 or length <= 0:
                break
            marker = ""
            if attributes & CONTROL:
                marker = _marker(data, at + HEADER.size)
            yield Batch(first, first + last_delta, producer, epoch,
                        bool(attributes & TRANSACTIONAL), marker, max_time)
            at += 12 + length  # (baseOffset and batchLength are outside the length)


def _marker(data: bytes, at: int) -> str:
    """A control record's type: its key is (version int16, type int16), 0 ABORT, 1 COMMIT."""
    _, at = read_varint(data, at)  # the record's length
    at += 1  # attributes
    _, at = read_varint(data, at)  # timestampDelta
    _, at = read_varint(data, at)  # offsetDelta
    _, at = read_varint(data, at)  # keyLength
    _, kind = struct.unpack_from(">hh", data, at)
    return {0: "ABORT", 1: "COMMIT"}.get(kind, f"control {kind}")


def described(partition_dir: Path, around: tuple[int, ...] | None = None,
              context: int = 3) -> str:
    """One line per batch of the partition: every batch, or those that hold an offset of
    ``around`` with ``context`` batches each side."""
    found = list(batches(partition_dir))
    keep = set(range(len(found))) if around is None else set()
    for i, batch in enumerate(found):
        if around and any(batch.first <= offset <= batch.last for offset in around):
            keep.update(range(max(i - context, 0), min(i + context + 1, len(found))))
    return f"{partition_dir.name}, {len(found)} batches:\n" + "\n".join(
        f"  {found[i]}" for i in sorted(keep))
