"""The Kafka sink's checkpoint: the position moves to the end of a transaction only once every
message before it is acknowledged, and the file (``state/kafka.json``) is written by one
harvest at a time, even when a harvest is cancelled while its write runs in a thread (a
service stopping cancels its flush loop, then flushes once more): the cancelled write keeps
the lock until it ends. (No broker is needed: futures stand for its answers.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cdcserver.core.config import KafkaConfig
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.sinks.kafka import checkpoint as checkpoint_module
from cdcserver.sinks.kafka.accumulator import Message
from cdcserver.sinks.kafka.checkpoint import InFlight, _load_state
from cdcserver.sinks.kafka.sink import KafkaSink


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


async def test_a_cancelled_checkpoint_write_is_not_overlapped_by_the_next(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    sink = KafkaSink(KafkaConfig(bootstrap="127.0.0.1:1"), str(tmp_path), "x")
    monkeypatch.setattr(sink.checkpoint, "send", lambda position, producer: None)
    real = checkpoint_module._save_state
    writing, overlapped, lock = [0], [False], threading.Lock()

    def slow_save(path: str, position: BinlogPosition) -> None:
        with lock:
            writing[0] += 1
            overlapped[0] |= writing[0] > 1
        time.sleep(0.3)  # a slow disk: the write outlives the harvest's cancellation
        real(path, position)
        with lock:
            writing[0] -= 1

    monkeypatch.setattr(checkpoint_module, "_save_state", slow_save)
    sink.sender.end_transaction(_position(1))
    first = asyncio.create_task(sink.sender.harvest())
    await asyncio.sleep(0.05)
    first.cancel()  # the flush loop, cancelled by a stopping service
    sink.sender.end_transaction(_position(2))
    await sink.sender.harvest()  # the final flush
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not overlapped[0], "two writes of state/kafka.json ran at once"
    assert _load_state(sink.checkpoint.path) == _position(2)


async def test_the_position_moves_only_past_acknowledged_messages():
    loop = asyncio.get_running_loop()
    in_flight = InFlight()
    first, second = Message("t", 0, b"k", b"v", []), Message("t", 1, b"k", b"v", [])
    in_flight.hold(first)
    in_flight.end_transaction(_position(1))
    in_flight.hold(second)
    in_flight.end_transaction(_position(2))
    assert in_flight.release() == (None, 0, None)  # not handed to the producer yet
    first.future, second.future = loop.create_future(), loop.create_future()
    second.future.set_result(None)
    assert in_flight.release() == (None, 0, None)  # the second waits behind the first
    first.future.set_exception(OSError("the broker is gone"))
    assert in_flight.release() == (None, 0, first.future)  # the sender sends again
    first.future, second.future = loop.create_future(), loop.create_future()
    first.future.set_result(None)
    assert in_flight.release() == (_position(1), 1, None)
    second.future.set_result(None)
    assert in_flight.release() == (_position(2), 1, None)
    assert len(in_flight) == 0 and in_flight.bytes == 0
