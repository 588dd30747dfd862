"""The Kafka sink's checkpoint file (``state/kafka.json``) is written by one harvest at a time,
even when a harvest is cancelled while its write runs in a thread (a service stopping cancels
its flush loop, then flushes once more): the cancelled write keeps the lock until it ends.
(No broker is needed: the harvest only moves past end-of-transaction markers here.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.sinks.kafka import sink as sink_module
from cdcserver.sinks.kafka.sink import KafkaSink, _load_state, _Marker


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


async def test_a_cancelled_checkpoint_write_is_not_overlapped_by_the_next(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    sink = KafkaSink(KafkaConfig(bootstrap="127.0.0.1:1"), str(tmp_path), "x")
    monkeypatch.setattr(sink, "_record_state_in_kafka", lambda position: None)
    real = sink_module._save_state
    writing, overlapped, lock = [0], [False], threading.Lock()

    def slow_save(path: str, position: BinlogPosition) -> None:
        with lock:
            writing[0] += 1
            overlapped[0] |= writing[0] > 1
        time.sleep(0.3)  # a slow disk: the write outlives the harvest's cancellation
        real(path, position)
        with lock:
            writing[0] -= 1

    monkeypatch.setattr(sink_module, "_save_state", slow_save)
    sink._pending.append(_Marker(_position(1)))
    first = asyncio.create_task(sink._harvest())
    await asyncio.sleep(0.05)
    first.cancel()  # the flush loop, cancelled by a stopping service
    sink._pending.append(_Marker(_position(2)))
    await sink._harvest()  # the final flush
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not overlapped[0], "two writes of state/kafka.json ran at once"
    assert _load_state(sink.state_path) == _position(2)
