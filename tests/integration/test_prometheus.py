"""docker/prometheus-alerts.yml and the dashboard's PromQL in a real Prometheus (Debian's
``prometheus`` package, which ``tests/run.sh`` installs; it ships ``promtool``).

- ``promtool check rules`` loads the alert rules;
- ``promtool test rules tests/prometheus/alerts_test.yml``: for every alert, series that must
  fire it and series that must not, with the annotations as they render;
- a Prometheus server scrapes a running service (replicating the real MariaDB, publishing to
  Apache Kafka) and answers the Grafana dashboard's queries through its HTTP API with
  series, the alert rules loaded and healthy.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.apache_kafka import ApacheKafka
from tests.conftest import Source, make_config, start_service
from tests.helpers import eventually, until
from tests.integration.test_dashboards import ALERTS, DASHBOARD, alert_rules, dashboard_expressions
from tests.integration.test_kafka import kafka_caught_up, kafka_section

ROOT = Path(__file__).parent.parent.parent
UNIT_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"
LISTENING = re.compile(r'msg="Listening on" address=([\d.]+:\d+)')


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: tests/run.sh installs Debian's prometheus package"
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("promtool"), *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=UNIT_TESTS.parent)


def test_promtool_loads_the_alert_rules():
    result = _promtool("check", "rules", str(ALERTS))
    rules = len(alert_rules(yaml.safe_load(ALERTS.read_text())))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {rules} rules found" in result.stdout


def test_every_alert_fires_on_its_series_and_only_there():
    tested = {t["name"] for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"]}
    assert tested == {r["alert"] for r in alert_rules(yaml.safe_load(ALERTS.read_text()))}
    result = _promtool("test", "rules", UNIT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


class Prometheus:
    """A Prometheus server on 127.0.0.1 (port 0), scraping one target every second."""

    def __init__(self, directory: Path, target: str) -> None:
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(ALERTS)],
                  "scrape_configs": [{"job_name": "cdc",
                                      "static_configs": [{"targets": [target]}]}]}
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [_tool("prometheus"), f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}",
                 "--web.listen-address=127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
        self.url = ""

    async def started(self) -> None:
        def address() -> str | None:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            found = LISTENING.search(self.log.read_text())
            return found.group(1) if found else None

        self.url = "http://" + await eventually(lambda: asyncio.to_thread(address),
                                                lambda a: a is not None, 60,
                                                "prometheus listening")

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _as_grafana_sends(expr: str) -> str:
    """A dashboard expression with its variables filled in as Grafana would."""
    return expr.replace("$instance", ".+").replace("$__rate_interval", "15s")


# Expressions that filter (a comparison) and are empty while nothing is wrong or running:
# a dump's progress while no dump runs.
FILTERING = ("deriv(cdc_dump_rows", "cdc_dump_rows{")


async def test_prometheus_scrapes_the_service_and_answers_the_dashboard(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka):
    kafka = kafka_section(kafka_broker, source, publisher_lock=f"cdc-{source.database}")
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file,
                                              kafka=kafka))
    prometheus = None
    try:
        await until(lambda: running.service.replication.sink("kafka") is not None, timeout=30,
                    what="the publisher lock")
        host, port = running.service.monitoring.address  # type: ignore[misc]
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(tmp_path / "prometheus", f"{host}:{port}")
        await prometheus.started()
        table = f"`{source.database}`.t"
        source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
        for i in range(5):  # changes across several scrapes, so that rates have samples
            source.execute(f"INSERT INTO {table} VALUES ({i})")
            await kafka_caught_up(running, source)
            await eventually(lambda: asyncio.to_thread(prometheus.series,  # type: ignore
                                                       "cdc_transactions_total"),
                             lambda r, i=i: r and float(r[0]["value"][1]) >= i + 2, 30,
                             "the scrape after the insert")
        up = prometheus.series('up{job="cdc"}')
        assert [float(s["value"][1]) for s in up] == [1.0]
        expressions = dashboard_expressions(json.loads(DASHBOARD.read_text()))
        queries = [e for e in expressions
                   if not e.startswith("label_values(") and not e.startswith(FILTERING)]
        assert len(queries) >= 50
        empty = [e for e in queries
                 if not await asyncio.to_thread(prometheus.series, _as_grafana_sends(e))]
        assert not empty, "dashboard queries Prometheus answers with no series"
        rate = prometheus.series(_as_grafana_sends(
            'rate(cdc_rows_in_total{instance=~"$instance"}[$__rate_interval])'))
        assert float(rate[0]["value"][1]) > 0
        groups = prometheus.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == len(alert_rules(yaml.safe_load(ALERTS.read_text())))
        assert {r["health"] for r in rules} == {"ok"}
        # (pending is allowed: CdcDiskFillsWithinADay extrapolates the free space of a disk
        # the other tests fill and empty, over the few seconds Prometheus has seen)
        firing = [a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]
                  if a["state"] == "firing"]
        assert firing == [], "a healthy service fires no alert"
    finally:
        if prometheus is not None:
            prometheus.stop()
        await running.stop()
