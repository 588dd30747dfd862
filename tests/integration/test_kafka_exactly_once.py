"""Exactly-once delivery (``[kafka] delivery = "exactly-once"``) against Apache Kafka and a
real MariaDB: a ``read_committed`` consumer reads every change once, in GTID order per
partition, across ``kill -9`` of the service under load, a second instance fencing the
first, and a broker killed, unreachable or cut off by the network.
(``bench/bench_kafka_exactly_once.py`` runs the same loop with 100 kills.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Any

import pytest

from cdcserver.core.config import Config
from cdcserver.core.errors import ConfigError
from cdcserver.core.kafkaconfig import KafkaConfig
from tests.apache_kafka import ApacheKafka
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, TcpProxy, pace, until
from tests.integration.test_kafka import kafka_caught_up
from tests.kafka_exactly_once import (
    CascadeWriter,
    RowWriter,
    broker_outage,
    check,
    committed_changes,
    items_exactly_once,
    items_once_on,
    kill_loop,
    rewinds_once_caught_up,
)
from tests.kafka_late_request import LateEndTxnProxy
from tests.netfault import Host, slow_missing
from tests.oracle import assert_stream_equals_table
from tests.server.test_crash import Load

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


async def test_kill_9_under_load_publishes_every_change_once(tmp_path, source: Source,
                                                             users_file: str, kafka_broker):
    figures = await kill_loop(str(tmp_path), source, users_file, kafka_broker.bootstrap,
                              kills=6, seed=52)
    print("\n" + figures.line())
    assert figures.duplicates == 0 and figures.missing == 0 and figures.out_of_order == 0


def _eos(kafka_broker, source: Source, **extra: object) -> dict[str, object]:
    db = source.database
    section: dict[str, object] = {
        "bootstrap": kafka_broker.bootstrap, "delivery": "exactly-once",
        "schema_topic": f"{db}.schemas", "state_topic": f"{db}.state",
        "topic": "{db}.{table}", "partitions": 3, "transactional_id": f"{db}-stream"}
    section.update(extra)
    return section


def _published_past(running: RunningService, state: Any) -> bool:
    """The Kafka sink's last commit published every transaction of ``state`` (a GTID
    state)."""
    sink = running.service.replication.sink("kafka")
    published = sink.checkpoint.published if sink is not None else None  # type: ignore
    return published is not None and all(published.gtid_state.covers(g) for g in state)


async def test_a_second_instance_fences_the_first_and_only_it_publishes(
        tmp_path, source: Source, users_file: str, kafka_broker):
    """Two instances for the same stream (the same transactional id): the second one's
    producer fences the first, whose replication stops saying so; the survivor publishes from
    what the other committed, and a read_committed consumer reads every change once. (Which
    one stops is not fixed: an instance whose open transaction is older than half
    ``transaction_timeout`` when it is fenced takes it for the brokers' abort, rewinds and
    fences the other back, as the setting's help says; on a loaded machine the first's
    transaction was that old, and the second stopped.) Each stops cleanly, fenced or not."""
    load = Load(source, seed=7, big=200, pause=0.005)
    load.create()
    instances = [await start_service(make_config(str(tmp_path / "a"), source.url, users_file,
                                                 kafka=_eos(kafka_broker, source)))]
    try:
        load.start()
        await pace(2.0)
        instances.append(await start_service(make_config(
            str(tmp_path / "b"), source.url, users_file, kafka=_eos(kafka_broker, source))))
        stopped: list[RunningService] = []
        for _ in range(600):
            stopped = [i for i in instances if i.service.replication.runner.stopped]
            if stopped:
                break
            await pace(0.1)
        assert len(stopped) == 1, [i.service.replication.runner.stopped for i in instances]
        said = stopped[0].service.replication.runner.stopped
        assert "fenced" in said and f"{source.database}-stream" in said
        survivor = next(i for i in instances if i is not stopped[0])
        await pace(1.0)
        load.finish()
        await kafka_caught_up(survivor, source, timeout=120)
        assert not survivor.service.replication.runner.stopped
    finally:
        load.stop.set()
        for instance in instances:
            await instance.stop()
    changes = await committed_changes(kafka_broker.bootstrap, source)
    data = str(tmp_path / ("a" if survivor is instances[0] else "b"))
    assert check(changes, data, source) == (0, 0, 0)


def test_exactly_once_needs_idempotence_acks_all_and_a_state_topic():
    for wrong, said in (({"idempotence": False}, "idempotence"), ({"acks": "1"}, "acks"),
                        ({"state_topic": ""}, "state_topic")):
        config = Config(kafka=KafkaConfig(bootstrap="k:9092", delivery="exactly-once",
                                          **wrong))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=said):
            config.check()


async def test_a_broker_killed_and_away_publishes_every_row_once(tmp_path, source: Source,
                                                                 users_file: str):
    """The broker is killed (-9) while rows are written and stays away 8 s, then starts
    again on its log, where the open Kafka transaction waits to be completed. A
    read_committed consumer reads each row once, in order."""
    broker = ApacheKafka(tmp_path / "kafka")  # its own: the session's is not killed
    await asyncio.to_thread(broker.start)
    try:
        outage = await broker_outage(broker, source, users_file, str(tmp_path / "data"),
                                     away=8.0)
    finally:
        await asyncio.to_thread(broker.close)
    print(f"\nexactly-once, broker killed for {outage.away:.0f} s: {outage.written} rows, "
          f"{outage.messages} read once, {outage.rewinds} rewinds")


async def test_a_broker_unreachable_past_the_transaction_timeout_publishes_every_row_once(
        tmp_path, source: Source, users_file: str):
    """The broker runs on but cannot be reached for 15 s (a proxy it advertises refuses and
    cuts every connection), longer than the request timeout (5 s) and the transaction
    timeout (3 s). When a transaction was open at the brokers as the cut came, they abort it
    and fence its producer epoch, and the sink must take that for the transaction's age, not
    for another instance: abort, wait for the broker, read its committed position back and
    publish again from there (whether one was open depends on the instant: the rewinds are
    printed; tests/unit/test_kafka_transactions.py decides each case at its instant). A
    read_committed consumer reads each row once, in order (the bench: a minute away, with
    the default timeout)."""
    proxy = TcpProxy("127.0.0.1", 0)
    await proxy.start()
    broker = ApacheKafka(tmp_path / "kafka", advertised_port=proxy.port)
    proxy.target = ("127.0.0.1", broker.port)
    await asyncio.to_thread(broker.start)
    try:
        outage = await broker_outage(broker, source, users_file, str(tmp_path / "data"),
                                     away=15.0, transaction_timeout=3.0, proxy=proxy)
    finally:
        await proxy.stop()
        await asyncio.to_thread(broker.close)
    print(f"\nexactly-once, broker unreachable {outage.away:.0f} s: {outage.written} rows, "
          f"{outage.messages} read once, {outage.rewinds} rewinds")


@pytest.mark.slow
@pytest.mark.parametrize("link", ["partition", "half-open", "slow"])
async def test_a_broker_cut_off_by_the_network_publishes_every_row_once(
        tmp_path, source: Source, users_file: str, link: str):
    """The broker runs in a network namespace of the test's own (``tests/netfault.py``);
    for 20 s its link drops every packet, both ways, or only the broker's answers (a
    half-open link: the service's requests arrive, nothing comes back), or holds every
    packet 30-130 ms and lets a quarter through at once, out of order. Nobody is told: the
    sink notices a dead link by its request timeout (5 s), waits for the broker, and
    publishes from its committed position; over a slow one it goes on publishing. A
    read_committed consumer reads each row once, in order."""
    if link == "slow" and slow_missing() is not None:
        pytest.skip(slow_missing())
    with Host() as host:
        broker = ApacheKafka(tmp_path / "kafka", host=host)
        await asyncio.to_thread(broker.start)
        try:
            outage = await broker_outage(broker, source, users_file, str(tmp_path / "data"),
                                         away=20.0, host=host, link=link)
        finally:
            await asyncio.to_thread(broker.close)
    if link == "slow":
        assert host.slowed.overtaken > 0, host.slowed  # the link did reorder
    print(f"\nexactly-once, broker link {link} for {outage.away:.0f} s: {outage.written} "
          f"rows, {outage.messages} read once, {outage.rewinds} rewinds")


async def test_a_commit_delivered_late_commits_nothing_of_the_next_transaction(
        tmp_path, source: Source, users_file: str):
    """A commit request (EndTxn) lost on a link that then came back: the producer times out
    (2 s), sends it again on a new connection and the commit is made; the network delivers
    the first copy later, once the sink's next transaction is open. That copy names only the
    producer's id and epoch, so it would commit the open transaction without its position
    (the sink then rewinds to the position before it and publishes it again: rows twice).
    After a commit slow enough for a request of it to have timed out, the sink starts its
    producer again, in a new epoch that fences the late copy (seen twice: 13,150 rows twice
    in a suite run, 2026-12-07). A read_committed consumer reads each row once."""
    proxy = LateEndTxnProxy(delay=4.0)
    await proxy.start()
    broker = ApacheKafka(tmp_path / "kafka", advertised_port=proxy.port)
    proxy.target = ("127.0.0.1", broker.port)
    await asyncio.to_thread(broker.start)
    try:
        # (a commit every 3 s: the late copy arrives with the next transaction half sent)
        config = make_config(str(tmp_path / "data"), source.url, users_file,
                             store={"flush_interval": 3.0},
                             kafka=_eos(broker, source, request_timeout=2.0))
        running = await start_service(config)
        writer = RowWriter(source)
        try:
            writer.start()
            await pace(2.0)
            proxy.armed = True
            await until(lambda: proxy.answers, timeout=120, what="the late commit's answer")
            await pace(2.0)
            writer.stop()
            await kafka_caught_up(running, source, timeout=300)
            sink = running.service.replication.sink("kafka")
            assert sink is not None
            epochs = sink.stats.new_epochs
        finally:
            writer.stop()
            await running.stop()
        messages = await items_once_on(broker, source, writer.written)
    finally:
        await proxy.stop()
        await asyncio.to_thread(broker.close)
    assert proxy.held == 1
    print(f"\nexactly-once, a commit delivered late (the broker answered {proxy.answers}; "
          f"{epochs} new producer epochs): {writer.written} rows, {messages} read once")


async def test_the_partition_leader_killed_in_a_three_broker_cluster(
        tmp_path, source: Source, users_file: str, kafka_cluster):
    """Three brokers, every topic replicated 3 times (min.insync.replicas 2): the leader
    of a partition the rows go to is killed (-9) under load, then started again. A
    read_committed consumer reads each row once, in order."""
    db = source.database
    config = make_config(str(tmp_path / "data"), source.url, users_file, kafka=_eos(
        kafka_cluster, source, replication_factor=3, request_timeout=10.0))
    running = await start_service(config)
    writer = RowWriter(source)
    try:
        writer.start()
        await pace(2.0)
        leader = None
        for _ in range(600):  # the topic is created with the first rows, on three brokers
            leader = await asyncio.to_thread(kafka_cluster.leader_of, f"{db}.items", 0)
            if leader is not None:
                break
            await pace(0.1)
        assert leader is not None, "no leader for the items topic within a minute"
        await asyncio.to_thread(kafka_cluster.kill, leader)
        await pace(4.0)
        await asyncio.to_thread(kafka_cluster.start, leader)
        await pace(1.0)
        writer.stop()
        await kafka_caught_up(running, source, timeout=300)
    finally:
        writer.stop()
        await running.stop()
    messages = await items_exactly_once(kafka_cluster.bootstrap, source, writer.written)
    print(f"\nexactly-once, leader {leader} killed: {writer.written} rows, {messages} read "
          "once")


async def _killed_and_started_again(running: RunningService, config: Config
                                   ) -> RunningService:
    """The service stopped as kill -9 leaves Kafka (nothing more committed), started again
    on the same data directory, and given 8 s."""
    running.task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await running.task
    await pace(2.0)
    running = await start_service(config)
    await pace(8.0)
    return running


@pytest.mark.slow
async def test_repairs_pending_longer_than_the_transaction_timeout_publish_every_row_once(
        tmp_path, source: Source, users_file: str, kafka_broker):
    """The soak's livelock: while a repair waits for its watermark no checkpoint may be
    written, and under continuous cascades one repair is always waiting (each reads the
    source's head, which the stream reaches after the next cascade began). No Kafka
    transaction could be committed, the brokers aborted each for its age (3 s here), and the
    sink started over from the same commit, forever. Now the sink commits beside its
    checkpoint meanwhile, and after a kill -9 in the middle, the replay publishes neither a
    row nor a repair twice: each child row is inserted once and deleted once (by a repair)."""
    data_dir = str(tmp_path / "data")
    config = make_config(data_dir, source.url, users_file, kafka=_eos(
        kafka_broker, source, transaction_timeout=3.0, request_timeout=5.0))
    cascades, rows = CascadeWriter(source), RowWriter(source)
    cascades.start()
    rows.start()
    running = await start_service(config)
    try:
        await pace(8.0)
        sink = running.service.replication.sink("kafka")
        assert sink is not None
        # (the first commit needs the producer, its topics and the cascades replicated:
        # on a loaded machine, more than the 8 s)
        await until(lambda: sink.stats.commits > 0, 120,  # type: ignore[attr-defined]
                    "a Kafka transaction committed while repairs wait")
        committed = sink.stats.commits  # type: ignore[attr-defined]
        running = await _killed_and_started_again(running, config)
    finally:
        cascades.stop()
        rows.stop()
    try:
        await kafka_caught_up(running, source, timeout=180)
        sink = running.service.replication.sink("kafka")
        assert sink is not None
        print(f"\n{cascades.parents} cascades, {rows.written} rows; commits before the kill "
              f"{committed}, after {sink.stats.commits}, "  # type: ignore[attr-defined]
              f"rewinds {sink.stats.rewinds}")  # type: ignore[attr-defined]
        assert committed > 0, "no Kafka transaction was committed while repairs waited"
    finally:
        await running.stop()
    await items_exactly_once(kafka_broker.bootstrap, source, rows.written)
    changes = await committed_changes(kafka_broker.bootstrap, source, ("child",))
    inserted = Counter(c.after["id"] for c in changes if c.after is not None)
    deleted = Counter(c.before["id"] for c in changes if c.after is None and c.before)
    expected = {n * 10 + i for n in range(1, cascades.parents + 1) for i in range(3)}
    assert set(inserted) == expected and max(inserted.values()) == 1, "an insert twice"
    assert set(deleted) == expected and max(deleted.values()) == 1, "a repair twice"
    assert source.query(f"SELECT COUNT(*) FROM `{source.database}`.child") == [(0,)]


async def test_a_rollback_of_a_non_transactional_table_is_published_once_not_for_ever(
        tmp_path, source: Source, users_file: str, kafka_broker):
    """MariaDB logs a rollback to a savepoint, or of a whole transaction, when a MyISAM
    table changed in it, and keeps every row in the group, the undone ones too: the stream
    drops what it handed on (the binlog says so, at the same point on every replay) and
    reads the tables again at the commit. The first time, the exactly-once sink rewinds
    (those rows were in its Kafka transaction); before the fix the replay met the same
    rollback and rewound again, for ever, publishing nothing more. Each row the source
    holds must reach the topics once, the undone one never."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.i (id INT PRIMARY KEY) ENGINE=InnoDB",
                   f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY) ENGINE=MyISAM",
                   f"INSERT INTO `{db}`.i VALUES (1)")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=_eos(kafka_broker, source))
    running = await start_service(config)
    try:
        conn = source.server.connect(db)
        with conn.cursor() as cur:
            for statement in ("BEGIN", "INSERT INTO i VALUES (10)", "SAVEPOINT s",
                              "INSERT INTO i VALUES (11)", "INSERT INTO m VALUES (11)",
                              "ROLLBACK TO SAVEPOINT s", "INSERT INTO i VALUES (12)",
                              "COMMIT", "BEGIN", "INSERT INTO i VALUES (20)",
                              "INSERT INTO m VALUES (20)", "ROLLBACK",
                              "INSERT INTO i VALUES (30)"):
                cur.execute(statement)
        conn.close()
        rewinds = await rewinds_once_caught_up(running, source, timeout=120)
    finally:
        await running.stop()
    assert rewinds <= 2, f"{rewinds} rewinds for two rollbacks"
    for table, rows in (("i", [1, 10, 12, 30]), ("m", [11, 20])):
        changes = await committed_changes(kafka_broker.bootstrap, source, (table,))
        inserted = Counter(c.after["id"] for c in changes if c.after is not None)
        assert sorted(inserted) == rows and max(inserted.values()) == 1, (table, inserted)


class _TableWriter(RowWriter):
    """Changes rows of ``m`` and ``n`` (the tables being repaired) every 20 ms: an update
    of each, and every third step an insert and a delete."""

    interval = 0.02
    steps = 0

    def create(self) -> None:
        pass

    def step(self, cur: Any) -> None:
        self.steps += 1
        n = self.steps
        cur.execute("UPDATE m SET b = b + 1 WHERE id = %s", (n % 300 + 1,))
        cur.execute("UPDATE n SET b = b + 1 WHERE id = %s", (n % 200 + 1,))
        if n % 3 == 0:
            cur.execute("INSERT INTO m VALUES (%s, 'late', %s)", (1000 + n, n))
            cur.execute("DELETE FROM m WHERE id = %s", (n // 3 % 300 + 1,))
            cur.execute("DELETE FROM n WHERE id = %s", (n // 3 % 200 + 1,))


@pytest.mark.slow
@pytest.mark.timeout(900)  # (75 s on a quiet machine; its replay's bound is the first pass's)
async def test_a_repair_beside_the_stream_read_again_loses_none_of_the_tables_later_changes(
        tmp_path, source: Source, users_file: str, kafka_broker,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """A whole-table repair read beside the stream folds the table's changes up to its
    watermark into its records. Restarted while the store's checkpoint is before its change,
    the service reads it again at a later watermark; the Kafka sink published the first one
    and is not given the second. The table's changes it had not published, folded into the
    second, must still reach it: each table rebuilt from its topic equals ``SELECT``, every
    before-image is the row the consumer holds. ``n``'s ALTER retypes values (it is held
    for its repair, and the rows it retypes go out before it): it is published once.

    Under continuous cascades a repair is pending at nearly every flush, and the store's
    checkpoint stays that far behind (the soak's service logs showed 1,700 transactions);
    whether it is behind at the kill depends on timing, so the test holds the store's
    checkpoint back itself (its ``flush`` patched) and keeps the cascades running."""
    from cdcserver.reread import beside

    monkeypatch.setattr(beside, "MIN_BYTES", 0)
    caplog.set_level(logging.INFO, logger="cdcserver")
    db = source.database
    source.execute(f"USE `{db}`",
                   f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY, a VARCHAR(40), b INT)",
                   f"INSERT INTO `{db}`.m SELECT seq, CONCAT('row ', seq), seq "
                   "FROM seq_1_to_300",
                   f"CREATE TABLE `{db}`.n (id INT PRIMARY KEY, d DECIMAL(10,3), b INT)",
                   f"INSERT INTO `{db}`.n SELECT seq, seq + IF(seq % 2, 0.345, 0.5), seq "
                   "FROM seq_1_to_200")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=_eos(kafka_broker, source))
    cascades, writer = CascadeWriter(source), _TableWriter(source)
    cascades.start()
    started = time.monotonic()
    running = await start_service(config)
    writer_started = False
    try:
        await pace(3.0)
        store = running.service.replication.sink("avro")

        async def held_back() -> None:
            return None

        monkeypatch.setattr(store, "flush", held_back)
        # and the store's own, which a stop calls for a final checkpoint when no repair is
        # pending (a kill -9 writes none; under the cascades one usually is, not always)
        monkeypatch.setattr(store.store, "flush", held_back)
        await pace(1.0)
        # truncates 'row 10' .. 'row 300' to five characters without row events: a rewrite;
        # and 1.345 is 1.3 in the new type: the ALTER waits for n's repair
        source.execute("SET SESSION sql_mode = ''", f"ALTER TABLE `{db}`.m MODIFY a VARCHAR(5)",
                       f"ALTER TABLE `{db}`.n MODIFY d DECIMAL(10,1)")
        writer.start()
        writer_started = True
        await until(lambda: caplog.text.count("is read beside the stream") >= 2, 60)
        await until(lambda: caplog.text.count("beside the stream, in ") >= 2, 120,
                    "both repairs out")
        out_by = source.gtid_state()  # (both watermarks are at or before it)
        await until(lambda: _published_past(running, out_by), 120,
                    "a Kafka commit past both repairs")
        first_pass = time.monotonic() - started
        running = await _killed_and_started_again(running, config)
    finally:
        cascades.stop()
        if writer_started:
            writer.stop()
    try:
        # The replay reads every cascade since the start again (the store's checkpoint is
        # held back), as many as the writer made while the first pass ran: its time, on
        # this machine under this load, bounds the replay's (beside two fault soaks and the
        # suite, 9,200 cascades took more than 180 s)
        await kafka_caught_up(running, source, timeout=180 + 2 * first_pass)
        conn = source.server.connect()
        try:  # the store, which was given the repairs again, too
            for table in ("m", "n"):
                await assert_stream_equals_table(running.port, conn, db, table, user=USER,
                                                 password=PASSWORD)
        finally:
            conn.close()
    finally:
        await running.stop()
    assert "read again, is not given to it a second time" in caplog.text, \
        "no sink held a repair read again: not the case this test is for"
    for table, columns in (("m", ("id", "a", "b")), ("n", ("id", "d", "b"))):
        changes = await committed_changes(kafka_broker.bootstrap, source, (table,))
        _check_topic(changes, columns, source.query(
            f"SELECT {', '.join(columns)} FROM `{db}`.{table}"), table)
    alters = [c for c in await committed_changes(kafka_broker.bootstrap, source, ("n",))
              if c.sql is not None and "DECIMAL(10,1)" in c.sql]
    assert len(alters) == 1, f"n's ALTER published {len(alters)} times"


def _check_topic(changes: list[Any], columns: tuple[str, ...], rows: list[Any],
                 table: str) -> None:
    """The table rebuilt from its topic equals ``rows`` (SELECT), and each before-image is
    the row the consumer holds."""
    held: dict[Any, tuple[Any, ...]] = {}
    not_held = []
    for c in sorted(changes, key=lambda c: (c.partition, c.offset)):
        if c.before is not None:
            before = tuple(c.before[k] for k in columns)
            if held.get(before[0]) != before:
                not_held.append(f"{c.gtid} {c.action} {before} held {held.get(before[0])}")
        if c.after is not None:
            held[c.after["id"]] = tuple(c.after[k] for k in columns)
        elif c.before is not None:
            held.pop(c.before["id"], None)
    expected = {r[0]: tuple(r) for r in rows}
    wrong = {k for k in set(held) | set(expected) if held.get(k) != expected.get(k)}
    assert not wrong, f"{table}: {len(wrong)} rows differ from SELECT, e.g. " + ", ".join(
        f"{k}: {held.get(k)} != {expected.get(k)}" for k in sorted(wrong)[:5])
    assert not not_held, f"{table}: {len(not_held)} before-images not as held, e.g. " \
                         f"{not_held[:3]}"
