"""Record batches built, and compressed, in a worker thread instead of the event loop's.

aiokafka builds a batch (compresses its records, writes the header and its CRC) when its
sender takes it for a request, on the event loop's thread: with compression, a tenth of that
thread at full speed on wide rows, while the compressors release the interpreter's lock.
:class:`PrebuiltBatch` wraps aiokafka's ``BatchBuilder``: once closed, :meth:`start` builds it
in a worker thread, and the accumulator waits for that before handing the batch to the
producer. What the producer decides only when it sends the batch, its idempotence state
(producer id, epoch, the partition's sequence number), it writes into the header then, and
the header's CRC-32C (over the attributes to the end: the compressed records, a few KB) is
made again.

The record batch header (Kafka's protocol, ``RecordBatch`` v2): base offset (8 bytes), batch
length (4), partition leader epoch (4), magic (1), CRC (4), attributes (2), last offset
delta (4), first timestamp (8), max timestamp (8), producer id (8), producer epoch (2), base
sequence (4), records count (4).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aiokafka.record.util import calc_crc32c

CRC_AT, ATTRIBUTES_AT, PRODUCER_AT = 17, 21, 43
_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, producer epoch, base sequence
_CRC = struct.Struct(">I")

_builders = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-batches")


class PrebuiltBatch:
    """aiokafka's ``BatchBuilder``, built in a worker thread once closed (the producer's
    state written into it when it is sent). Appends go to the builder itself, before."""

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.append: Callable[..., Any] = builder.append  # (no call in between: per message)
        self._built: Future[bytearray] | None = None
        self._state: tuple[int, int, int] | None = None

    def start(self) -> None:
        """Close the batch and build it in the worker thread."""
        self.builder.close()
        self._built = _builders.submit(self.builder._build)

    def is_built(self) -> bool:
        return self._built is not None and self._built.done()

    async def built(self) -> None:
        """Until the worker thread has built it (the producer then takes it at once)."""
        assert self._built is not None
        await asyncio.wrap_future(self._built)

    # what aiokafka's producer uses (MessageBatch, the accumulator's drain)
    def close(self) -> None:
        self.builder.close()

    def closed(self) -> bool:
        return bool(self.builder.closed())

    def size(self) -> int:
        return int(self.builder.size())

    def record_count(self) -> int:
        return int(self.builder.record_count())

    def _set_producer_state(self, producer_id: int, producer_epoch: int,
                            base_sequence: int) -> None:
        self._state = (producer_id, producer_epoch, base_sequence)

    def _build(self) -> bytearray:
        if self._built is None:  # (never started: built here, as aiokafka would)
            self.start()
        assert self._built is not None
        buffer = self._built.result()
        if self._state is not None:
            state = _PRODUCER_STATE.pack(*self._state)
            if buffer[PRODUCER_AT:PRODUCER_AT + len(state)] != state:
                buffer[PRODUCER_AT:PRODUCER_AT + len(state)] = state
                buffer[CRC_AT:ATTRIBUTES_AT] = _CRC.pack(
                    calc_crc32c(memoryview(buffer)[ATTRIBUTES_AT:]))
        return buffer
