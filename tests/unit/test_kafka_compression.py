"""aiokafka's batch builders compress with the Java client's defaults once a producer is made
(cdcserver/sinks/kafka/compression.py), and the batches read back (with aiokafka's reader;
Apache Kafka's broker reads them in tests/integration/test_kafka.py)."""

from __future__ import annotations

import importlib

import pytest

from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka import compression, connect

# (module, its builder's and reader's classes: the compiled ones, and the Python ones that
# aiokafka uses where it has no compiled extension)
BUILDERS = [("aiokafka.record._crecords.default_records", "DefaultRecordBatchBuilder",
             "DefaultRecordBatch"),
            ("aiokafka.record.default_records", "_DefaultRecordBatchBuilderPy",
             "_DefaultRecordBatchPy")]
LZ4, GZIP = 3, 1  # the record batch's compression attribute


@pytest.mark.parametrize("name,builder_class,reader_class", BUILDERS)
@pytest.mark.parametrize("codec", [LZ4, GZIP])
async def test_a_producers_batches_use_the_java_clients_coders_and_read_back(
        name: str, builder_class: str, reader_class: str, codec: int,
        monkeypatch: pytest.MonkeyPatch):
    producer = connect.producer(KafkaConfig(bootstrap="127.0.0.1:1", compression="lz4"))
    await producer.stop()  # (never started: only made)
    module = importlib.import_module(name)
    used: list[int] = []
    encoder = module.lz4_encode if codec == LZ4 else module.gzip_encode
    assert encoder in (compression.lz4_encode, compression.gzip_encode)
    monkeypatch.setattr(module, "lz4_encode" if codec == LZ4 else "gzip_encode",
                        lambda payload, *a: used.append(len(payload)) or encoder(payload))
    builder = getattr(module, builder_class)(
        magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    values = [b'{"id":%d,"note":"%s"}' % (i, b"x" * (i % 50)) for i in range(2000)]
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=None, key=b"%d" % offset, value=value, headers=[])
    batch = builder.build()
    assert used and len(batch) < sum(map(len, values)) // 2
    read = getattr(module, reader_class)(bytes(batch))
    assert read.validate_crc()
    assert [record.value for record in read] == values
