"""A record batch built in the worker thread, its producer state written in afterwards, is
byte for byte the batch aiokafka builds itself with that state (prebuilt.py)."""

from __future__ import annotations

import pytest
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from cdcserver.sinks.kafka import compression
from cdcserver.sinks.kafka.prebuilt import PrebuiltBatch

NONE, GZIP, LZ4, ZSTD = 0, 1, 3, 4


def _filled(codec: int, transactional: int = 0) -> BatchBuilder:
    builder = BatchBuilder(1 << 20, codec, is_transactional=transactional)
    for i in range(500):
        builder.append(timestamp=1_700_000_000_000 + i, key=b"%d" % i,
                       value=b'{"id":%d,"note":"%s"}' % (i, b"x" * (i % 30)),
                       headers=[("gtid", b"0-1-%d" % i)])
    return builder


@pytest.mark.parametrize("codec", [NONE, GZIP, LZ4, ZSTD])
@pytest.mark.parametrize("state", [None, (4711, 3, 0), (4711, 3, 123456),
                                   (2**62, 32767, 2**31 - 1)])
async def test_a_prebuilt_batch_is_the_batch_aiokafka_builds(codec, state):
    compression.install()
    prebuilt = PrebuiltBatch(_filled(codec, transactional=1 if state else 0))
    prebuilt.start()
    await prebuilt.built()
    reference = _filled(codec, transactional=1 if state else 0)
    if state is not None:
        prebuilt._set_producer_state(*state)
        reference._set_producer_state(*state)
    built = prebuilt._build()
    assert bytes(built) == bytes(reference._build())
    assert prebuilt._build() is built  # taken again (a retry): the same
    batch = DefaultRecordBatch(bytes(built))
    assert batch.validate_crc()
    assert [r.value for r in batch][-1] == b'{"id":499,"note":"%s"}' % (b"x" * (499 % 30))
    if state is not None:
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == state
    assert prebuilt.record_count() == 500 and prebuilt.size() == len(built)


async def test_a_batch_the_producer_takes_before_it_was_started_is_built_there():
    prebuilt = PrebuiltBatch(_filled(LZ4))
    prebuilt._set_producer_state(1, 0, 5)
    assert DefaultRecordBatch(bytes(prebuilt._build())).base_sequence == 5
