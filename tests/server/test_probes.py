"""/live and /ready on a real service replicating the real MariaDB: caught up, behind the
source, cut off from it, never connected, stopping; and the container's probe command. (A
full disk: tests/server/test_disk_full.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from cdcserver.core.changes import Change, Rows
from cdcserver.core.config import Config
from cdcserver.core.gtid import BinlogPosition
from cdcserver.ops import probe
from cdcserver.ops.lag import Lag
from cdcserver.ops.probes import MAX_LAG, live, ready
from cdcserver.sinks.base import SinkStatus, SourceInfo
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import TcpProxy, eventually

pytestmark = pytest.mark.mariadb


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


async def fetch_probe(running: RunningService, path: str) -> tuple[int, dict[str, Any]]:
    host, port = running.service.monitoring.address  # type: ignore[misc]
    return await asyncio.to_thread(_get, f"http://{host}:{port}{path}")


class Gate:
    """A sink after the store that holds the pipeline at the first change of ``table`` until
    released: the service is then behind the source for as long as the test wants."""

    name = "gate"
    after = ("avro",)
    durable: BinlogPosition | None = None
    applied: BinlogPosition | None = None
    unrepaired: frozenset[str] | None = None
    unrepaired_at: BinlogPosition | None = None

    def __init__(self, table: str) -> None:
        self.table = table
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def open(self, source: SourceInfo) -> None:
        pass

    def starting_at(self, position: BinlogPosition) -> None:
        pass

    async def apply(self, changes: list[Change]) -> None:
        if any(isinstance(c, Rows) and c.layout.table == self.table for c in changes):
            self.reached.set()
            await self.release.wait()

    async def flush(self) -> BinlogPosition | None:
        return None

    async def keep_up(self, unrepaired: object) -> None:
        pass

    async def close(self) -> None:
        pass

    active = True

    def status(self) -> SinkStatus:
        return SinkStatus(self.name)


async def _start_gated(config: Config, gate: Gate) -> RunningService:
    """conftest's start_service, with ``gate`` among the service's sinks from the start."""
    return await start_service(config, sinks=(gate,))


async def test_a_caught_up_service_is_live_and_ready(cdc: RunningService, source: Source,
                                                     capsys):
    source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.t VALUES (1)")
    await cdc.caught_up(source)
    await cdc.service.housekeeping.lag.measure()  # type: ignore[union-attr]
    assert await fetch_probe(cdc, "/live") == (200, {"live": True})
    status, doc = await fetch_probe(cdc, "/ready")
    assert (status, doc) == (200, {"ready": True, "lag_seconds": 0.0, "lag_transactions": 0,
                                   "max_lag_seconds": MAX_LAG})
    host, port = cdc.service.monitoring.address  # type: ignore[misc]
    code = await asyncio.to_thread(probe.main, ["ready", "--url", f"http://{host}:{port}"])
    assert code == 0 and json.loads(capsys.readouterr().out)["ready"] is True


async def test_a_service_that_never_reached_its_source_is_live_not_ready(
        tmp_path, users_file: str, capsys):
    config = make_config(str(tmp_path / "data"), "mysql://root@127.0.0.1:1", users_file)
    running = await start_service(config)
    try:
        assert (await fetch_probe(running, "/live"))[0] == 200
        status, doc = await fetch_probe(running, "/ready")
        assert status == 503 and doc["ready"] is False and doc["reason"] == "starting"
        host, port = running.service.monitoring.address  # type: ignore[misc]
        code = await asyncio.to_thread(probe.main,
                                       ["ready", "--url", f"http://{host}:{port}"])
        assert code == 1 and json.loads(capsys.readouterr().out)["reason"] == "starting"
    finally:
        await running.stop()


async def test_ready_follows_the_replication_connection(tmp_path, source: Source,
                                                         users_file: str):
    """The source behind a proxy: cut off, the service is live and not ready; back, ready."""
    proxy = TcpProxy("127.0.0.1", source.server.port or 0)
    await proxy.start()
    url = f"mysql://root@127.0.0.1:{proxy.port}"
    running = await start_service(make_config(str(tmp_path / "data"), url, users_file))
    try:
        await running.caught_up(source)
        await eventually(lambda: fetch_probe(running, "/ready"), lambda r: r[0] == 200,
                         what="ready")
        proxy.refuse = True
        proxy.cut()
        # (the lag probe, over a connection of its own, may be refused first: "lag-unknown"
        # until the replication connection's end is noticed, which then takes precedence)
        await eventually(lambda: fetch_probe(running, "/ready"),
                         lambda r: r[0] == 503 and r[1]["reason"] == "disconnected",
                         what="not ready: disconnected")
        assert (await fetch_probe(running, "/live"))[0] == 200
        proxy.refuse = False
        await eventually(lambda: fetch_probe(running, "/ready"), lambda r: r[0] == 200,
                         what="ready again")
    finally:
        await running.stop()
        await proxy.stop()


async def test_ready_waits_until_the_lag_is_within_the_budget(tmp_path, source: Source,
                                                               users_file: str):
    """Transactions committed an hour ago (SET TIMESTAMP) are applied, the next one is held
    back: the service is a transaction behind with an hour's lag, so not ready, with the
    figures; let go, it catches up and is ready."""
    db = f"`{source.database}`"
    source.execute("SET TIMESTAMP = UNIX_TIMESTAMP() - 3600",
                   f"CREATE TABLE {db}.t (id INT PRIMARY KEY)",
                   f"INSERT INTO {db}.t VALUES (1)",
                   f"CREATE TABLE {db}.held (id INT PRIMARY KEY)")
    gate = Gate("held")
    running = await _start_gated(make_config(str(tmp_path / "data"), source.url, users_file),
                                 gate)
    try:
        source.execute(f"INSERT INTO {db}.held VALUES (1)")
        await asyncio.wait_for(gate.reached.wait(), 60)
        await running.service.housekeeping.lag.measure()  # type: ignore[union-attr]
        status, doc = await fetch_probe(running, "/ready")
        assert status == 503 and doc["reason"] == "lagging", doc
        assert doc["lag_transactions"] == 1 and 3590 < doc["lag_seconds"] < 3700
        assert f"{doc['lag_seconds']:.0f} s" in doc["message"]
        assert (await fetch_probe(running, "/live"))[0] == 200
        gate.release.set()
        await running.caught_up(source)
        await running.service.housekeeping.lag.measure()  # type: ignore[union-attr]
        status, doc = await fetch_probe(running, "/ready")
        assert status == 200 and doc["lag_seconds"] == 0
    finally:
        gate.release.set()
        await running.stop()


async def test_a_stopping_service_is_neither_live_nor_ready(tmp_path, source: Source,
                                                            users_file: str):
    """Stopping waits for the pipeline, which the gate holds: meanwhile both probes say so."""
    db = f"`{source.database}`"
    source.execute(f"CREATE TABLE {db}.held (id INT PRIMARY KEY)")
    gate = Gate("held")
    running = await _start_gated(make_config(str(tmp_path / "data"), source.url, users_file),
                                 gate)
    stopping = None
    try:
        source.execute(f"INSERT INTO {db}.held VALUES (1)")
        await asyncio.wait_for(gate.reached.wait(), 60)
        stopping = asyncio.create_task(running.stop())
        _, doc = await eventually(lambda: fetch_probe(running, "/live"),
                                  lambda r: r[0] == 503, what="not live")
        assert doc == {"live": False, "reason": "stopping",
                       "message": "the service is stopping"}
        assert (await fetch_probe(running, "/ready"))[1]["reason"] == "stopping"
    finally:
        gate.release.set()
        await (stopping if stopping is not None else running.stop())


async def test_each_reason_not_to_be_ready_comes_first_in_its_turn(cdc: RunningService,
                                                                    source: Source):
    """The order of the reasons, and the states a test cannot cheaply bring about (a purged
    binlog, several sources refused, a failed replication thread), on a real service's
    figures."""
    await cdc.caught_up(source)
    await cdc.service.housekeeping.lag.measure()  # type: ignore[union-attr]
    stats = cdc.service.stats()
    assert ready(stats)[0] and live(stats.replication)[0]

    def replication(**changes: Any) -> Any:
        return dataclasses.replace(stats, replication=dataclasses.replace(stats.replication,
                                                                          **changes))

    def reason(s: Any) -> str:
        good, doc = ready(s)
        assert good is ("reason" not in doc)
        return str(doc.get("reason", ""))

    assert reason(replication(stopped="replication stopped: purged")) == "stopped"
    assert reason(replication(paused="replication paused: No space left on device",
                              connected=False)) == "paused"
    assert reason(replication(started=False, connected=False)) == "starting"
    assert reason(replication(connected=False, sources=2, refused=["a: no", "b: no"])) == \
        "no-source"
    assert reason(replication(connected=False, sources=2, refused=["a: no"])) == "disconnected"
    assert reason(dataclasses.replace(stats, lag=Lag())) == "lag-unknown"
    assert reason(dataclasses.replace(stats, lag=Lag(0, 0.0, 1.0, "timed out"))) == \
        "lag-unknown"
    assert reason(dataclasses.replace(stats, lag=Lag(12, None, 1.0))) == "catching-up"
    assert reason(dataclasses.replace(stats, lag=Lag(12, MAX_LAG, 1.0))) == ""  # at budget
    assert reason(dataclasses.replace(stats, lag=Lag(12, MAX_LAG + 1, 1.0))) == "lagging"
    assert reason(replication(halted=True, stopped="purged")) == "stopping"
    failed = dataclasses.replace(stats.replication, failure="SourceError: XA")
    assert live(failed) == (False, {"live": False, "reason": "failed",
                                    "message": "replication failed: SourceError: XA"})
    assert not live(dataclasses.replace(stats.replication, halted=True))[0]
    assert live(dataclasses.replace(stats.replication, stopped="purged", paused="full"))[0]


def test_the_probe_command_reads_the_endpoint_from_the_configuration(tmp_path, capsys):
    config = tmp_path / "cdc.toml"
    config.write_text('[metrics]\nlisten = "0.0.0.0:1"\n')
    assert probe.main(["live", "--config", str(config)]) == 1  # nothing listens on port 1
    assert "http://127.0.0.1:1" in capsys.readouterr().out
    config.write_text('[metrics]\nlisten = ""\n')
    assert probe.main(["live", "--config", str(config)]) == 1
    assert "metrics.listen is off" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probe.main(["alive", "--config", str(config)])
