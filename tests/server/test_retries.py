"""Reconnect loops that end: backoff with jitter, and causes no retry heals stop in one line
(against the suite's MariaDB; the Kafka case against a port nobody listens on)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.retry import Backoff
from cdcserver.ops.metrics import health
from cdcserver.replication import preflight
from cdcserver.replication import source as source_sql
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import wait_until


def test_backoff_grows_with_jitter_and_a_short_lived_connection_is_a_failure(monkeypatch):
    backoff = Backoff(first=0.1, maximum=30.0, stable_after=10.0)
    delays = [backoff.failed() for _ in range(12)]
    assert all(0.1 <= d <= 30.0 for d in delays) and delays[-1] == 30.0
    assert delays[5] > delays[2] > delays[0]
    assert len({Backoff().delay(4) for _ in range(20)}) > 1  # jitter
    clock = [1000.0]
    monkeypatch.setattr("cdcserver.core.retry.time.monotonic", lambda: clock[0])
    backoff = Backoff(first=0.1, maximum=30.0, stable_after=10.0)
    for _ in range(4):  # connected, then cut after a second: still backing off
        backoff.connected()
        clock[0] += 1
        backoff.failed()
    assert backoff.flaps == 4 and backoff.attempt == 4
    backoff.connected()
    clock[0] += 60  # a stable connection starts the count again
    assert backoff.failed() <= 0.2 and backoff.flaps == 0 and backoff.attempt == 1


def _replicating(running: RunningService) -> bool:
    replicator = running.service.replication.runner.replicator
    return replicator is not None and replicator.connected.is_set()


@pytest.mark.mariadb
async def test_two_services_with_one_server_id_stop_one_with_the_cause(
        tmp_path, source: Source, users_file: str):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                   f"INSERT INTO {table} VALUES (1)")
    configs = [make_config(os.path.join(tmp_path, name), source.url, users_file,
                           source={"server_id": 4711}) for name in ("a", "b")]
    first = await start_service(configs[0])
    second = None
    try:
        await first.caught_up(source)
        second = await start_service(configs[1])
        both = (first, second)
        await asyncio.to_thread(wait_until, lambda: any(r.service.replication.runner.stopped
                                                        for r in both), 60, "one to stop")
        stopped = [r for r in both if r.service.replication.runner.stopped]
        going = [r for r in both if not r.service.replication.runner.stopped]
        assert len(stopped) == 1 and len(going) == 1
        why = stopped[0].service.replication.runner.stopped
        assert "server_id 4711" in why and "server_id of its own" in why, why
        ok, document = health(stopped[0].service.stats(), 60)
        assert not ok and why in document["problems"]
        replicator = stopped[0].service.replication.runner.replicator
        assert replicator is not None and replicator.reconnects <= 6  # no storm
        source.execute(f"INSERT INTO {table} VALUES (2)")  # the other one goes on
        await going[0].caught_up(source)
        await asyncio.sleep(2)  # a quiet window: it must not be stopped later on (no event)
        assert _replicating(going[0]) and not going[0].service.replication.runner.stopped
    finally:
        for running in (first, second):
            if running is not None:
                await running.stop()


@pytest.mark.mariadb
async def test_check_warns_when_the_server_id_is_taken(cdc: RunningService, source: Source):
    await cdc.caught_up(source)
    conn = source_sql.connect(parse_source_url(source.url))
    try:
        taken = preflight.check_connection(conn, "source", cdc.service.config.source.server_id)
        free = preflight.check_connection(conn, "source", 4999)
    finally:
        conn.close()
    finding = next(f for f in taken.findings if f.check == "server_id")
    assert finding.severity == preflight.Severity.WARNING, finding.text()
    assert "cut each other off" in finding.detail
    assert next(f for f in free.findings if f.check == "server_id").severity == \
        preflight.Severity.OK


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.mariadb
async def test_a_broker_down_at_start_is_in_health_and_logged_once(
        tmp_path, source: Source, users_file: str, caplog: pytest.LogCaptureFixture):
    port = _closed_port()
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file,
                         kafka={"bootstrap": f"127.0.0.1:{port}"})
    caplog.set_level(logging.WARNING, logger="cdcserver.sinks.kafka.sink")
    running = await start_service(config)
    try:
        await asyncio.to_thread(wait_until, lambda: running.service.stats().sinks_waiting, 30,
                                "the sink to wait for the broker")
        await asyncio.sleep(4)  # several attempts
        ok, document = health(running.service.stats(), 60)
        assert not ok
        assert any(f"waiting for the Kafka broker at 127.0.0.1:{port}" in p
                   for p in document["problems"]), document
        warnings = [r for r in caplog.records if "waiting for the Kafka broker" in r.message]
        assert 1 <= len(warnings) <= 2, [r.message for r in warnings]
    finally:
        await running.stop()
