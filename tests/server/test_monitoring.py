"""/metrics, /health and `cdcserver status` on a real service replicating the real MariaDB."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcserver.app.cli import main as cdcserver_main
from mariadb_cdc_client.format.wire import auth_message
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import USER, RawClient

pytestmark = pytest.mark.mariadb


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


async def _metrics(cdc: RunningService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    host, port = cdc.service.monitoring.address  # type: ignore[misc]
    status, body = await asyncio.to_thread(_get, f"http://{host}:{port}/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


async def _health(cdc: RunningService) -> tuple[int, dict]:
    host, port = cdc.service.monitoring.address  # type: ignore[misc]
    status, body = await asyncio.to_thread(_get, f"http://{host}:{port}/health")
    return status, json.loads(body)


async def test_metrics_count_what_went_in_and_out(cdc: RunningService, source: Source):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))",
                   f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                   f"UPDATE {table} SET v = 'z' WHERE id = 1")
    await cdc.caught_up(source)
    await cdc.service.housekeeping.lag.measure()  # type: ignore[union-attr]
    before = await _metrics(cdc)
    assert before["cdc_rows_in_total", ()] == 5  # three inserts, an update's two images
    assert before["cdc_table_version", (("database", source.database), ("table", "t"))] == 1
    assert before["cdc_replication_connected", ()] == 1
    assert before["cdc_replication_lag_transactions", ()] == 0
    assert before["cdc_replication_lag_seconds", ()] == 0
    assert before["cdc_transactions_total", ()] >= 3
    # where replication's time went: the store's apply, and the repair stage every part
    # passes through (its own, even without a repair)
    assert before["cdc_pipeline_seconds_total", (("stage", "avro"),)] > 0
    assert before["cdc_pipeline_seconds_total", (("stage", "repairs"),)] > 0

    client = await RawClient.connect(cdc.port)
    await client.send(auth_message(USER, "wrong password"))
    assert (await client.line()).startswith(b"ERR AUTH-FAILED")
    await client.close()
    client = await RawClient.connect(cdc.port)
    await client.login()
    await client.send(f"REQUEST-DATA {source.database}.t\n".encode())
    lines = [await client.line() for _ in range(1 + 5)]
    during = await _metrics(cdc)
    await client.close()
    assert during["cdc_clients_connected", ()] == 1
    assert during["cdc_rows_out_total", ()] - before["cdc_rows_out_total", ()] == 5
    assert during["cdc_sent_bytes_total", ()] - before["cdc_sent_bytes_total", ()] == \
        sum(len(line) for line in lines)
    assert during["cdc_login_failures_total", ()] == before["cdc_login_failures_total", ()] + 1


def _bucket(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
            le: str) -> float:
    return metrics[f"{name}_bucket", (("le", le),)]


async def test_commit_latency_is_measured_from_the_source_commit(cdc: RunningService,
                                                                  source: Source):
    """A transaction committed 100 s ago by the source's clock (SET TIMESTAMP) counts once
    in each histogram, between the 60 and 120 s bounds: once when the store shows it, once
    when the client following the table is sent it."""
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                   f"INSERT INTO {table} VALUES (1)")
    await cdc.caught_up(source)
    client = await RawClient.connect(cdc.port)
    try:
        await client.login()
        await client.send(f"REQUEST-DATA {source.database}.t\n".encode())
        assert b"namespace" in await client.line()  # the schema
        assert b'"id": 1' in await client.line()
        before = await _metrics(cdc)
        started = time.monotonic()
        source.execute("SET TIMESTAMP = UNIX_TIMESTAMP() - 100",
                       f"INSERT INTO {table} VALUES (2)")
        assert b'"id": 2' in await client.line()
        await cdc.caught_up(source)
        after = await _metrics(cdc)
        took = time.monotonic() - started  # what the latency adds to the 100 s, at most
    finally:
        await client.close()
    for name in ("cdc_commit_to_store_seconds", "cdc_commit_to_client_seconds"):
        def grew(le: str, name: str = name) -> float:
            return _bucket(after, name, le) - _bucket(before, name, le)

        assert (grew("60.0"), grew("120.0"), grew("+Inf")) == (0, 1, 1), name
        assert after[f"{name}_count", ()] - before[f"{name}_count", ()] == 1
        # (the commit's timestamp has whole seconds: up to one more)
        assert 99 <= after[f"{name}_sum", ()] - before[f"{name}_sum", ()] < 101 + took


async def test_the_process_and_build_are_described(cdc: RunningService):
    import platform

    import cdcserver
    from cdcserver.store import transcoder

    metrics = await _metrics(cdc)
    labels = (("compiled", "yes" if transcoder.available() else "no"),
              ("python", platform.python_version()), ("version", cdcserver.__version__))
    assert metrics["cdc_build_info", labels] == 1
    assert metrics["process_resident_memory_bytes", ()] > 10 << 20
    assert metrics["process_open_fds", ()] > 0 and metrics["process_cpu_seconds_total", ()] > 0
    assert metrics["cdc_data_filesystem_size_bytes", ()] >= \
        metrics["cdc_data_filesystem_free_bytes", ()] > 0
    assert any(name == "python_info" for name, _ in metrics)


async def test_health_and_status_of_a_healthy_service(cdc: RunningService, source: Source,
                                                      capsys):
    await cdc.caught_up(source)
    await cdc.service.housekeeping.lag.measure()  # type: ignore[union-attr]
    status, doc = await _health(cdc)
    assert status == 200 and doc["status"] == "ok" and doc["problems"] == []
    assert doc["replication"]["connected"] and doc["replication"]["lag_transactions"] == 0
    host, port = cdc.service.monitoring.address  # type: ignore[misc]
    code = await asyncio.to_thread(cdcserver_main,
                                   ["status", "--metrics-url", f"http://{host}:{port}"])
    out = capsys.readouterr().out
    assert code == 0 and ": OK" in out and "0 transactions, 0.0 s" in out


async def test_health_is_503_while_the_source_is_unreachable(tmp_path, users_file: str,
                                                              capsys):
    config = make_config(str(tmp_path / "data"), "mysql://root@127.0.0.1:1", users_file)
    running = await start_service(config)
    try:
        status, doc = await _health(running)
        assert status == 503 and doc["status"] == "degraded"
        assert any("not started" in p for p in doc["problems"])
        host, port = running.service.monitoring.address  # type: ignore[misc]
        code = await asyncio.to_thread(cdcserver_main,
                                       ["status", "--metrics-url", f"http://{host}:{port}"])
        assert code == 1 and "DEGRADED" in capsys.readouterr().out
    finally:
        await running.stop()


async def test_the_endpoint_refuses_what_is_not_a_monitoring_request(cdc: RunningService):
    host, port = cdc.service.monitoring.address  # type: ignore[misc]
    assert await asyncio.to_thread(_get, f"http://{host}:{port}/nothing") == \
        (404, b"try /metrics, /health, /live, /ready\n")
    request = urllib.request.Request(f"http://{host}:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(urllib.request.urlopen, request, timeout=10)
    refused.value.close()
    assert refused.value.code == 405
    for garbage in (b"hello\r\n\r\n", b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 9000
                    + b"\r\n\r\n"):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(garbage)
        reply = await asyncio.wait_for(reader.read(), 10)
        assert reply.startswith(b"HTTP/1.1 400 ")
        writer.close()
    assert (await _health(cdc))[0] in (200, 503)  # still serving


async def test_status_says_when_nothing_answers(capsys):
    code = await asyncio.to_thread(cdcserver_main,
                                   ["status", "--metrics-url", "http://127.0.0.1:1"])
    assert code == 1 and "UNREACHABLE" in capsys.readouterr().out


async def test_a_service_that_dies_at_start_fails_its_waiters(tmp_path, source: Source,
                                                              users_file: str) -> None:
    """The metrics port is taken: the service stops at start with the reason, and a caller
    waiting for it to catch up gets an error instead of waiting forever."""
    import socket

    from cdcserver.app.service import Service
    from cdcserver.core.errors import CdcError, ConfigError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        config = make_config(str(tmp_path / "data"), source.url, users_file,
                             metrics={"listen": f"127.0.0.1:{taken}"})
        service = Service(config)
        waiter = asyncio.create_task(service.wait_caught_up(source.gtid_state()))
        await asyncio.sleep(0)
        with pytest.raises(ConfigError, match=r"metrics\.listen"):
            await asyncio.wait_for(service.run(asyncio.Event()), 30)
        with pytest.raises(CdcError, match="the service stopped"):
            await asyncio.wait_for(waiter, 5)
