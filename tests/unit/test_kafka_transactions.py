"""Exactly-once delivery's decisions (cdcserver/sinks/kafka/transactional.py), each at the one
instant that decides it: a batch refused inside a Kafka transaction, a producer fenced while
its transaction is young (another instance) or old (the brokers aborted it for its age).

A real broker cannot be made to refuse or fence at a chosen instant, so futures stand for its
answers here; tests/integration/test_kafka_exactly_once.py runs the same paths against Apache
Kafka (kill -9 loops, an unreachable broker past the transaction timeout, a second instance).
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import (
    IllegalOperation,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFenced,
)

from cdcserver.app.runner import ReplicationRunner, State
from cdcserver.core.changes import (
    Abort,
    Begin,
    Change,
    ColumnDef,
    Commit,
    Rowless,
    Rows,
    RowsKind,
    TableLayout,
)
from cdcserver.core.config import SourceConfig
from cdcserver.core.errors import DiskFull, PublisherFenced, SinkRewound
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.mariadb.constants import ColumnType
from cdcserver.sinks.kafka import sender as sender_module
from cdcserver.sinks.kafka.accumulator import Message
from cdcserver.sinks.kafka.checkpoint import StateRecord
from cdcserver.sinks.kafka.sink import KafkaSink
from cdcserver.store.catalog import Catalog
from cdcserver.store.layout import DataDir

LAYOUT = TableLayout("db", "t", (ColumnDef("id", ColumnType.LONG, nullable=False),), (0,))


def _position(n: int) -> BinlogPosition:
    return BinlogPosition(GtidState([Gtid(0, 1, n)]), "bin.000001", 100 * n)


class _Builder:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def append(self, timestamp: None, key: bytes, value: bytes, headers: list[Any]) -> object:
        self.values.append(value)
        return self

    def close(self) -> None:
        pass


class _Producer:
    """A transactional producer whose answers the test gives."""

    made: list[_Producer] = []

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.batches: list[asyncio.Future[None]] = []
        self.commit_error: BaseException | None = None
        self.state: list[bytes] = []  # position records sent to the state topic
        _Producer.made.append(self)

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")

    async def begin_transaction(self) -> None:
        self.calls.append("begin")
        if hasattr(self, "_sender"):
            raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> "
                                 "TransactionState.IN_TRANSACTION")

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        if self.commit_error is not None:
            raise self.commit_error

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def flush(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes, partition: int
                   ) -> asyncio.Future[None]:
        self.state.append(value)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def create_batch(self) -> _Builder:
        return _Builder()

    def die(self, error: BaseException) -> None:
        """As aiokafka's producer when its sender task ends with ``error`` (a produce or
        AddPartitionsToTxn answered ``ProducerFenced``, an unknown server error): its
        transaction manager holds a fatal error, a send is refused as "not in
        transaction" and a begin by an assertion; the error is on the sender task only."""
        task: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task.set_exception(error)
        self._sender = SimpleNamespace(sender_task=task)

    async def send_batch(self, builder: _Builder, topic: str, partition: int
                         ) -> asyncio.Future[None]:
        if hasattr(self, "_sender"):
            raise IllegalOperation("Can't send messages while not in transaction")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.batches.append(future)
        return future


@pytest.fixture
def sink(tmp_path, monkeypatch: pytest.MonkeyPatch) -> KafkaSink:
    return _sink(tmp_path, monkeypatch)


def _sink(tmp_path, monkeypatch: pytest.MonkeyPatch, **config: Any) -> KafkaSink:
    _Producer.made.clear()
    monkeypatch.setattr(sender_module.connect, "producer",
                        lambda config, transactional_id=None: _Producer())
    config = {"transaction_timeout": 0.4, **config}
    sink = KafkaSink(KafkaConfig(bootstrap="127.0.0.1:1", delivery="exactly-once", **config),
                     str(tmp_path), "stream")

    async def committed(committed: bool = False) -> None:  # what the state topic holds
        sink.checkpoint.durable = _position(0)

    monkeypatch.setattr(sink.checkpoint, "read_back", committed)
    return sink


async def _one_transaction(sink: KafkaSink, n: int) -> _Producer:
    sender = sink.transactions
    assert sender is not None
    await sender.hold(Message("t", 0, b"k", b"row %d" % n, []))
    sender.end_transaction(_position(n))
    await sender.ship_all()
    producer = _Producer.made[-1]
    return producer


async def test_a_commit_carries_the_position_after_every_batch_is_acknowledged(sink):
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    flushing = asyncio.create_task(sink.flush())
    await asyncio.sleep(0.05)
    assert "commit" not in producer.calls  # not before the broker acknowledged the batch
    producer.batches[0].set_result(None)
    assert await asyncio.wait_for(flushing, 5) == _position(1)
    assert producer.calls == ["start", "begin", "commit"]
    assert [json.loads(v) for v in producer.state] == [
        {**_position(1).to_json(), "published": _position(1).to_json(), "unrepaired": []}]


async def test_a_refused_batch_is_never_committed_the_sink_rewinds(sink):
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_exception(MessageSizeTooLargeError())
    with pytest.raises(SinkRewound):
        await sink.flush()
    assert "commit" not in producer.calls and "stop" in producer.calls
    assert len(_Producer.made) == 2 and _Producer.made[1].calls == ["start"]
    assert sink.durable == _position(0)  # read back from the state topic
    with pytest.raises(SinkRewound):  # the old pipeline's batches are refused...
        await sink.transactions.hold(Message("t", 0, b"k", b"late", []))
    sink.starting_at(_position(0))  # ...until replication starts over
    await _one_transaction(sink, 1)
    assert _Producer.made[1].calls == ["start", "begin"]


async def test_fenced_while_young_another_instance_publishes_this_one_stops(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    # young: well under half the transaction timeout, however long the machine stalls
    sink = _sink(tmp_path, monkeypatch, transaction_timeout=600.0)
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.commit_error = ProducerFenced()
    with pytest.raises(PublisherFenced, match="transactional id 'stream'"):
        await sink.flush()
    assert len(_Producer.made) == 1  # no new producer: it would fence the other back
    with pytest.raises(PublisherFenced):
        await sink.transactions.hold(Message("t", 0, b"k", b"late", []))
    # routing a new table asks for its partitions: that says so too, and is not retried
    # as if a producer were being started again (CI run ci11: the pipeline waited there,
    # holding the sink's lock, and the fenced instance went on for minutes)
    with pytest.raises(PublisherFenced):
        await asyncio.wait_for(sink.transactions.partitions_for("t2"), 5)


async def test_fenced_when_old_the_brokers_aborted_it_for_its_age_the_sink_rewinds(sink):
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.commit_error = ProducerFenced()
    await asyncio.sleep(0.25)  # more than half of transaction_timeout (0.4 s)
    with pytest.raises(SinkRewound):
        await sink.flush()
    assert len(_Producer.made) == 2 and sink.durable == _position(0)


async def test_fenced_after_a_begin_that_waited_long_the_brokers_aborted_it_the_sink_rewinds(
        sink):
    """aiokafka's begin waits for the producer's id, which a producer whose link went silent
    asks for again (the brokers unreachable meanwhile): the transaction is as old as that
    wait when it is fenced for its age. Its age counted from the begin's end, it was taken
    for young, and a soak run (seed 109, a broker's answers lost for 60 s) stopped
    replication as fenced out by another instance."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = _Producer.made[-1]
    began = producer.begin_transaction

    async def waits_for_the_id() -> None:
        await asyncio.sleep(0.25)  # more than half of transaction_timeout (0.4 s)
        await began()

    producer.begin_transaction = waits_for_the_id  # type: ignore[method-assign]
    await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.commit_error = ProducerFenced()
    with pytest.raises(SinkRewound):
        await sink.flush()
    assert len(_Producer.made) == 2


async def test_fenced_as_a_begin_that_waited_long_ends_the_sink_rewinds(sink):
    """The same wait, ended by the fencing itself (the begin refused): a rewind too."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    assert await sink.flush() == _position(1)

    async def waits_then_fenced() -> None:
        await asyncio.sleep(0.25)
        raise ProducerFenced()

    producer.begin_transaction = waits_then_fenced  # type: ignore[method-assign]
    with pytest.raises(SinkRewound):
        await sink.transactions.hold(Message("t", 0, b"k", b"row 2", []))
    assert len(_Producer.made) == 2


async def test_closing_with_a_transaction_open_on_a_producer_aiokafka_holds_fenced(sink):
    """aiokafka asserts against aborting a transaction its manager holds fenced
    (``FATAL_ERROR -> ABORTING_TRANSACTION``): the close still stops the producer (a CI run's
    stop raised that assert and left the producer's sockets open)."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)

    async def refused() -> None:
        producer.calls.append("abort")
        raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> "
                             "TransactionState.ABORTING_TRANSACTION")

    producer.abort_transaction = refused  # type: ignore[method-assign]
    await asyncio.wait_for(sink.transactions.close(), 5)
    assert producer.calls[-2:] == ["abort", "stop"]


async def test_a_commit_slow_enough_to_have_been_sent_twice_is_followed_by_a_new_epoch(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A commit that took request_timeout (0.2 s here) may have had its request time out
    and be sent again, and the first copy may reach the brokers later, once the next
    transaction is open: the producer is started again (a new epoch, which fences that
    copy) before the next transaction begins. With Apache Kafka:
    tests/integration/test_kafka_exactly_once.py, a proxy delivering the copy late."""
    sink = _sink(tmp_path, monkeypatch, request_timeout=0.2)
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)

    async def slow_commit() -> None:
        producer.calls.append("commit")
        await asyncio.sleep(0.25)

    producer.commit_transaction = slow_commit  # type: ignore[method-assign]
    assert await asyncio.wait_for(sink.flush(), 5) == _position(1)  # committed
    assert producer.calls == ["start", "begin", "commit", "stop"]
    assert len(_Producer.made) == 2 and _Producer.made[1].calls == ["start"]
    assert sink.stats.new_epochs == 1
    await _one_transaction(sink, 2)
    assert _Producer.made[1].calls == ["start", "begin"]


async def test_a_commit_cancelled_under_way_is_read_back_before_anything_more(sink):
    """The pipeline torn down (a full disk paused replication) cancels a commit under way:
    the brokers may have committed it or not. The sink's next flush or message first
    reads the committed position back and has replication start over from it, instead of
    taking the transaction for open (before: "Can't send messages while not in
    transaction" at the next commit, and the service stopped)."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    committing = asyncio.Event()
    release = asyncio.Event()

    async def slow_commit() -> None:
        producer.calls.append("commit")
        committing.set()
        await release.wait()

    producer.commit_transaction = slow_commit  # type: ignore[method-assign]
    flushing = asyncio.create_task(sink.flush())
    await asyncio.wait_for(committing.wait(), 5)
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    with pytest.raises(SinkRewound, match="cancelled under way"):
        await sink.flush()
    assert len(_Producer.made) == 2 and sink.durable == _position(0)  # read back
    sink.starting_at(_position(0))
    await _one_transaction(sink, 1)
    assert _Producer.made[1].calls == ["start", "begin"]


async def _paused_for_a_full_disk(sink: KafkaSink, tmp: str,
                                  pipeline: Any = None) -> ReplicationRunner:
    """The runner's pause for a full disk, over: every sink handed an Abort, checkpoints
    taken, replication about to start over (``pipeline``: the one the pause tore down)."""
    data_dir = DataDir(os.path.join(tmp, "data"))
    os.makedirs(data_dir.state)
    runner = ReplicationRunner(SourceConfig(url="mysql://cdc@127.0.0.1:1"), data_dir,
                               Catalog(data_dir.avro), [sink], flush_interval=1,
                               disk_full_retry=0.01)
    runner.pipeline = pipeline
    await asyncio.wait_for(runner._pause_until_room(DiskFull("no room")), 5)
    return runner


async def test_a_pause_for_a_full_disk_after_a_cancelled_commit_resumes(sink, tmp_path):
    """The soak's disk-full fault: the pause tears the pipeline down mid-commit, and the
    runner's checkpoints before resuming meet the sink's rewind (it reads the committed
    position back). The sink stands at its last commit then; before, the rewind escaped the
    pause and stopped the service."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    committing = asyncio.Event()

    async def never_ending_commit() -> None:
        committing.set()
        await asyncio.Event().wait()

    producer.commit_transaction = never_ending_commit  # type: ignore[method-assign]
    flushing = asyncio.create_task(sink.flush())
    await asyncio.wait_for(committing.wait(), 5)
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    runner = await _paused_for_a_full_disk(sink, str(tmp_path))
    assert runner.state is State.REPLICATING and not runner.paused
    assert sink.durable == _position(0) and len(_Producer.made) == 2  # read back


async def test_fenced_as_its_sender_learned_a_send_refused_stops_this_instance(sink):
    """CI run ci19, two instances under load: one's sender was answered ProducerFenced, and
    aiokafka then refuses every send with IllegalOperation, which the sink did not expect:
    replication failed with it, and neither instance said it was fenced."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.die(ProducerFenced())
    await sink.transactions.hold(Message("t", 1, b"k", b"row 2", []))
    sink.transactions.end_transaction(_position(2))
    with pytest.raises(PublisherFenced, match="transactional id 'stream'"):
        await asyncio.wait_for(sink.flush(), 5)
    assert "commit" not in producer.calls
    assert len(_Producer.made) == 1  # no new producer: it would fence the other back


async def test_fenced_as_a_transaction_begins_stops_this_instance(sink):
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    assert await sink.flush() == _position(1)
    producer.die(ProducerFenced())
    with pytest.raises(PublisherFenced):
        await sink.transactions.hold(Message("t", 0, b"k", b"row 2", []))
    assert len(_Producer.made) == 1


async def test_a_sender_dead_of_another_error_rewinds(sink):
    """The same refusals after the sender died of something else (the broker's unknown
    error on EndTxn, as in that run): the sink rewinds with a new producer."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.die(KafkaError("Unexpected error during batch delivery"))
    producer.commit_error = AssertionError("Invalid state transition FATAL_ERROR -> "
                                           "COMMITTING_TRANSACTION")
    await sink.transactions.hold(Message("t", 1, b"k", b"row 2", []))
    sink.transactions.end_transaction(_position(2))
    with pytest.raises(SinkRewound):
        await asyncio.wait_for(sink.flush(), 5)
    assert len(_Producer.made) == 2 and sink.durable == _position(0)


async def test_a_rewind_cancelled_while_it_connects_is_done_again_at_the_next_use(sink):
    """Soak run 56: a commit timed out, and while its rewind waited for a new producer a full
    disk tore the pipeline down. Replication resumed with no producer, and the next
    transaction's begin ended the process with an AttributeError."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    producer.commit_error = KafkaError("KafkaTimeoutError")
    connecting = asyncio.Event()
    real_start = _Producer.start

    async def never_started(self: _Producer) -> None:
        connecting.set()
        await asyncio.Event().wait()

    _Producer.start = never_started  # type: ignore[method-assign]
    try:
        flushing = asyncio.create_task(sink.flush())
        await asyncio.wait_for(connecting.wait(), 5)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
    finally:
        _Producer.start = real_start  # type: ignore[method-assign]
    assert sink.transactions.producer is None
    sink.starting_at(_position(0))  # replication resumed after the pause
    with pytest.raises(SinkRewound):  # the rewind done again: a producer, the position
        await sink.transactions.hold(Message("t", 0, b"k", b"row 1", []))
    assert sink.transactions.producer is _Producer.made[-1]
    assert sink.durable == _position(0)
    sink.starting_at(_position(0))
    await _one_transaction(sink, 1)
    assert _Producer.made[-1].calls == ["start", "begin"]


async def test_a_broker_that_names_no_broker_is_waited_for_not_a_defect(sink, monkeypatch):
    """Soak seed 86: during a Kafka partition a metadata answer named no broker, and the new
    producer's start failed on aiokafka's own assertion (``Did we not perform bootstrap?``,
    raised here by aiokafka's client, never bootstrapped, as it was there). The service
    ended. It is a broker not answering yet: the sender tries again. An assertion of
    anything else's is a defect still, and is not retried."""
    from aiokafka.client import AIOKafkaClient, CoordinationType

    monkeypatch.setattr(sender_module, "_backoff", lambda: sender_module.Backoff(0.01, 0.01))
    tries: list[str] = []

    async def unbootstrapped(self: _Producer) -> None:
        tries.append("start")
        if len(tries) == 1:
            client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
            try:
                await client.coordinator_lookup(CoordinationType.TRANSACTION, "cdcserver:1")
            finally:
                await client.close()

    monkeypatch.setattr(_Producer, "start", unbootstrapped)
    assert sink.transactions is not None
    await asyncio.wait_for(sink.transactions.connect(), 10)
    assert tries == ["start", "start"]
    assert sink.transactions.producer is _Producer.made[-1]

    async def broken(self: _Producer) -> None:
        raise AssertionError("a defect of ours")

    monkeypatch.setattr(_Producer, "start", broken)
    with pytest.raises(AssertionError, match="a defect of ours"):
        await asyncio.wait_for(sink.transactions.connect(), 10)


async def _partial(sink: KafkaSink, text: bytes) -> _Producer:
    """Part of a source transaction routed (its end not yet)."""
    sender = sink.transactions
    assert sender is not None
    await sender.hold(Message("t", 0, b"k", text, []))
    await sender.ship_all()
    return _Producer.made[-1]


async def _starts_over_and_publishes(sink: KafkaSink) -> None:
    """Replication started over from the position read back: the next transaction goes in
    a new producer's Kafka transaction, committed."""
    sink.starting_at(_position(0))
    again = await _one_transaction(sink, 1)
    again.batches[0].set_result(None)
    assert await asyncio.wait_for(sink.flush(), 5) == _position(1)
    assert again.calls == ["start", "begin", "commit"]


async def test_a_source_transaction_abandoned_midway_is_never_committed(sink):
    """The source's connection lost in the middle of a transaction: the stream abandons it
    (Abort) and reads it again whole. Part of it was in the open Kafka transaction; before,
    the router ignored the Abort, and the next commit published that part beside the
    transaction read again (the soak's duplicates under load). Now the Kafka transaction
    is aborted and replication starts over from the position committed."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    await _partial(sink, b"half of 2")
    with pytest.raises(SinkRewound, match="abandoned"):
        await sink.apply([Abort("the source's connection was lost")])
    assert "commit" not in producer.calls and "stop" in producer.calls
    assert len(_Producer.made) == 2 and sink.durable == _position(0)  # read back
    await _starts_over_and_publishes(sink)


async def test_an_abort_between_source_transactions_keeps_the_kafka_transaction(sink):
    """Nothing of the abandoned transaction was routed (its Abort came before its rows):
    the open Kafka transaction holds whole source transactions only, and goes on."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    await sink.apply([Abort("rolled back on the primary")])
    producer.batches[0].set_result(None)
    assert await asyncio.wait_for(sink.flush(), 5) == _position(1)
    assert producer.calls == ["start", "begin", "commit"] and len(_Producer.made) == 1


async def test_a_pause_with_half_a_source_transaction_routed_publishes_it_once(sink, tmp_path):
    """The soak's disk-full fault in the middle of a source transaction: the pause hands
    every sink an Abort, takes their checkpoints and starts replication over from them.
    Before, the Kafka sink kept the half in its open transaction and committed it with the
    whole transaction read again."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    await _partial(sink, b"half of 1")
    runner = await _paused_for_a_full_disk(sink, str(tmp_path))
    assert runner.state is State.REPLICATING
    assert "commit" not in _Producer.made[0].calls and len(_Producer.made) == 2
    await _starts_over_and_publishes(sink)


async def test_replication_started_over_with_a_kafka_transaction_open_aborts_it(sink):
    """A pipeline ended between two commits (whole source transactions routed, not yet
    committed) and the next starts from the position committed: it routes them again, so the
    open Kafka transaction is aborted first, never committed with them twice."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    sink.starting_at(_position(0))
    with pytest.raises(SinkRewound, match="started over"):
        await sink.transactions.hold(Message("t", 0, b"k", b"row 1", []))
    assert "commit" not in producer.calls and len(_Producer.made) == 2
    await _starts_over_and_publishes(sink)


async def _committed_once(sink: KafkaSink) -> _Producer:
    """Connected, and transaction 1 committed: the checkpoint stands at 1."""
    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)
    assert await asyncio.wait_for(sink.flush(), 5) == _position(1)
    return producer


async def test_a_repair_pending_past_the_transaction_timeout_commits_beside_the_checkpoint(sink):
    """Soak: a catch-up under continuous migrations kept a repair pending for minutes; no
    commit was allowed meanwhile, the brokers aborted the Kafka transaction for its age
    (transaction_timeout), and the sink started over into the same catch-up, forever. Now
    the pipeline's keep-up commits anyway: the checkpoint stays (a restart reads the cause
    again), and the position published and the repairs not yet placed go beside it."""
    first = await _committed_once(sink)
    await _one_transaction(sink, 2)
    first.batches[1].set_result(None)
    await asyncio.wait_for(sink.keep_up(lambda: frozenset({"0-1-2"})), 5)
    assert first.calls == ["start", "begin", "commit", "begin", "commit"]
    assert json.loads(first.state[-1]) == {**_position(1).to_json(),
                                           "published": _position(2).to_json(),
                                           "unrepaired": ["0-1-2"]}
    assert sink.durable == _position(1)  # a restart replays the cause...
    assert sink.applied == _position(2) and sink.unrepaired == frozenset({"0-1-2"})
    # ...and the next commit with none pending moves the checkpoint again
    await _one_transaction(sink, 3)
    first.batches[2].set_result(None)
    assert await asyncio.wait_for(sink.flush(), 5) == _position(3)
    assert sink.applied == _position(3) and sink.unrepaired == frozenset()


async def test_keep_up_commits_neither_half_a_transaction_nor_while_a_repair_is_read(sink):
    first = await _committed_once(sink)
    await _one_transaction(sink, 2)
    await _partial(sink, b"half of 3")
    for batch in first.batches[1:]:
        batch.set_result(None)
    await asyncio.wait_for(sink.keep_up(lambda: frozenset()), 5)  # half of 3 routed
    sink.transactions.end_transaction(_position(3))
    await asyncio.wait_for(sink.keep_up(lambda: None), 5)  # a repair being read
    assert first.calls.count("commit") == 1 and sink.durable == _position(1)


def test_a_state_record_written_before_published_reads_as_a_position():
    old = json.dumps(_position(7).to_json()).encode()
    assert StateRecord.parse(old) == StateRecord(_position(7), _position(7), frozenset())
    record = StateRecord(_position(7), _position(9), frozenset({"0-1-8"}))
    assert StateRecord.parse(record.to_json()) == record


async def test_once_no_repair_is_pending_the_checkpoint_reaches_what_was_published(sink):
    """The keep-up commit published through 2 with the checkpoint left at 1; the repair is
    then placed and nothing more comes (the source is quiet): the next flush commits the
    position alone. Before, the checkpoint stayed behind until the next change."""
    producer = await _committed_once(sink)
    await _one_transaction(sink, 2)
    producer.batches[1].set_result(None)
    await asyncio.wait_for(sink.keep_up(lambda: frozenset({"0-1-2"})), 5)
    assert sink.durable == _position(1)
    assert await asyncio.wait_for(sink.flush(), 5) == _position(2)
    assert producer.calls.count("commit") == 3 and len(producer.batches) == 2
    assert json.loads(producer.state[-1])["unrepaired"] == []
    assert await asyncio.wait_for(sink.flush(), 5) == _position(2)
    assert producer.calls.count("commit") == 3  # nothing more to commit


@pytest.mark.parametrize("repair", [False, True])
async def test_a_flush_in_mid_transaction_commits_at_its_end_unless_a_repair_begins(sink,
                                                                                     repair):
    """A flush that finds half a source transaction routed commits at its end; but if the
    rest of it holds a change without row events, that commit would pass the change before
    its repair is placed, and a kill then would never read it again."""
    producer = await _committed_once(sink)
    await _partial(sink, b"half of 2")
    producer.batches[1].set_result(None)
    await asyncio.wait_for(sink.flush(), 5)  # half routed: the commit waits for its end
    rest: list[Change] = [Rowless("db", "c", "ON DELETE CASCADE of db.p")] if repair else []
    await sink.apply([*rest, Commit(_position(2), 0)])
    assert producer.calls.count("commit") == (1 if repair else 2)
    assert sink.durable == (_position(1) if repair else _position(2))


async def test_a_flush_after_a_repair_began_in_an_earlier_slice_does_not_commit_past_it(sink):
    """The stream hands a big transaction on in slices: the slice with the change without
    row events went out before the flush came, the commit put off to the transaction's end
    would pass it (review of 07a2370)."""
    producer = await _committed_once(sink)
    await sink.apply([Begin(Gtid(0, 1, 2), 0), Rowless("db", "c", "ON DELETE CASCADE")])
    await _partial(sink, b"half of 2")
    producer.batches[1].set_result(None)
    await asyncio.wait_for(sink.flush(), 5)
    await sink.apply([Commit(_position(2), 0)])
    assert producer.calls.count("commit") == 1 and sink.durable == _position(1)


async def test_a_rollback_the_binlog_holds_rewinds_once_not_on_every_replay(sink):
    """A transaction rolled back after writing rows of non-transactional tables: the stream
    drops what it handed on (Abort, again) and opens the transaction again, on every replay.
    The sink rewinds the first time (that part was in the Kafka transaction); replayed, the
    part before the rollback is dropped, so the sink does not rewind for ever."""
    producer = await _committed_once(sink)
    await sink.apply([Begin(Gtid(0, 1, 2), 0)])
    await _partial(sink, b"row 2, rolled back")
    producer.batches[1].set_result(None)
    rollback = Abort("rolled back on the primary", again=True)
    with pytest.raises(SinkRewound, match="abandoned"):
        await sink.apply([rollback])
    sink.starting_at(_position(1))
    assert sink.transactions is not None
    replay: list[Change] = [Begin(Gtid(0, 1, 2), 0), Rows(LAYOUT, RowsKind.INSERT, 0, [(2,)]),
                            rollback, Begin(Gtid(0, 1, 2), 0),
                            Rowless("db", "t", "rolled back on the primary"),
                            Commit(_position(2), 0)]
    assert sink.transactions.without_rolled_back(replay) == replay[3:]
    later = [Begin(Gtid(0, 1, 2), 0), Rows(LAYOUT, RowsKind.INSERT, 0, [(2,)])]
    assert sink.transactions.without_rolled_back(later) == later  # once only


async def test_a_pause_while_a_repair_is_pending_keeps_the_checkpoint_before_its_change(
        sink, tmp_path):
    """The soak (seed 64) lost a repair: a full disk's pause took every sink's checkpoint,
    past a change whose repair was pending (carried over to the next pipeline, in memory);
    a failing disk then restarted the service from that checkpoint, and the repair was
    never done. At a pause with a repair pending, the sinks now keep up instead: the Kafka
    sink commits beside its checkpoint, which stays before the change."""
    await _committed_once(sink)
    producer = await _one_transaction(sink, 2)
    producer.batches[1].set_result(None)
    pending = SimpleNamespace(repair_pending=True, may_checkpoint=lambda sink: False,
                              unrepaired_for=lambda name: frozenset({"0-1-2"}))
    runner = await _paused_for_a_full_disk(sink, str(tmp_path), pending)
    assert runner.state is State.REPLICATING
    assert sink.durable == _position(1) and sink.applied == _position(2)
    assert sink.unrepaired == frozenset({"0-1-2"})


async def test_a_publisher_taking_over_keeps_what_was_published_beside_the_checkpoint(sink):
    """Review of fad90ef: the publisher lease takes the positions read back by GTID alone;
    it set the checkpoint anew, which cleared what was published beside it, so a replay
    gave the sink everything between the two again."""
    await _committed_once(sink)
    producer = await _one_transaction(sink, 2)
    producer.batches[1].set_result(None)
    await asyncio.wait_for(sink.keep_up(lambda: frozenset({"0-1-2"})), 5)
    sink.by_gtid_only()
    assert sink.durable == BinlogPosition(_position(1).gtid_state, "", 4)
    assert sink.applied == BinlogPosition(_position(2).gtid_state, "", 4)
    assert sink.unrepaired == frozenset({"0-1-2"})


async def test_a_refused_position_record_is_never_committed_the_sink_rewinds(sink):
    """Soak seed 83: the position record's produce request timed out, was sent again and
    refused (``OutOfOrderSequenceNumber``); aiokafka committed the transaction without it,
    and the replay from the position before published three transactions twice. The
    record is acknowledged before the commit now: refused, nothing is committed."""
    from aiokafka.errors import OutOfOrderSequenceNumber

    assert sink.transactions is not None
    await sink.transactions.connect()
    producer = await _one_transaction(sink, 1)
    producer.batches[0].set_result(None)

    async def refused(topic: str, value: bytes, key: bytes, partition: int
                      ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_exception(OutOfOrderSequenceNumber())
        return future

    producer.send = refused  # type: ignore[method-assign]
    with pytest.raises(SinkRewound):
        await sink.flush()
    assert "commit" not in producer.calls and "stop" in producer.calls
    assert sink.durable == _position(0)
