"""docker/grafana-dashboard.json and docker/prometheus-alerts.yml against a real service.

Grafana does not run here, so these files are checked for what can be checked without it
(``tests/integration/test_prometheus.py`` runs the alert rules and the dashboard's queries in a real
Prometheus): they have the shape each loads; every metric name their PromQL
expressions use is served by a real service's /metrics (replicating the real MariaDB and
publishing to Apache Kafka through ``publisher_lock``, so every conditional family is
there); ``rate()`` and ``increase()`` are only taken of counters; ``_bucket``, ``_sum`` and
``_count`` only of histograms. Every ``cdc_`` family served is in the table of docs/monitoring.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.apache_kafka import ApacheKafka
from tests.conftest import Source, make_config, start_service
from tests.helpers import until
from tests.integration.test_kafka import kafka_caught_up, kafka_section

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]

ROOT = Path(__file__).parent.parent.parent
DASHBOARD = ROOT / "docker" / "grafana-dashboard.json"
ALERTS = ROOT / "docker" / "prometheus-alerts.yml"
PROMETHEUS_SERIES = {"up"}  # what Prometheus records for every target itself

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_GRAFANA = re.compile(r"\$(?:\{\w+\}|\w+)")  # $__rate_interval, ${datasource}
_LABEL_VALUES = re.compile(r"\blabel_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*\w+\s*\)")
_NAME = re.compile(r"(?<![\w.:])[a-zA-Z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on",
             "ignoring", "group_left", "group_right"}
_COUNTING = re.compile(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or Grafana's ``label_values(metric, label)``)
    reads: not functions, keywords, label names, strings, durations or Grafana variables."""
    text = _LABEL_VALUES.sub(r"\1", _GRAFANA.sub(" ", expr))
    text = _GROUPING.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", text))))
    names = set()
    for found in _NAME.finditer(text):
        following = text[found.end():].lstrip()
        if not following.startswith("(") and found.group() not in _KEYWORDS:
            names.add(found.group())
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    expressions = [t["expr"] for p in panels for t in p.get("targets", [])]
    expressions += [v["definition"] for v in dashboard["templating"]["list"]
                    if v["type"] == "query"]
    return expressions


def alert_rules(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_metric_names_are_read_out_of_promql():
    assert metric_names('histogram_quantile(0.99, sum by (instance, le) (rate('
                        'cdc_x_seconds_bucket{instance=~"$instance", le!="+Inf"}'
                        '[$__rate_interval])))') == {"cdc_x_seconds_bucket"}
    assert metric_names("cdc_a / (cdc_b > 0) and on (instance) cdc_c offset 5m") == \
        {"cdc_a", "cdc_b", "cdc_c"}
    assert metric_names('up{job="cdc"} == 0 unless bool time() - 1e3') == {"up"}
    assert metric_names("predict_linear(free[6h], 86400) < 0") == {"free"}
    assert metric_names("label_values(cdc_build_info, instance)") == {"cdc_build_info"}
    assert metric_names('sum without (cause) (rate(x_total{cause="a b"}[5m:1m]))') == \
        {"x_total"}


def test_the_alert_rules_have_the_shape_prometheus_loads():
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    groups = document["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    rules = alert_rules(document)
    assert len({r["alert"] for r in rules}) == len(rules) >= 10
    for group in groups:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["rules"]
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels",
                             "annotations"}, rule
        assert re.fullmatch(r"Cdc[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
        assert isinstance(rule["expr"], str) and metric_names(rule["expr"]), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        for text in rule["annotations"].values():  # Go templates: only what a rule has
            for variable in re.findall(r"\{\{(.*?)\}\}", text):
                assert re.fullmatch(r" \$(value|labels\.\w+)( \| \w+)? ", variable), variable


def test_the_dashboard_has_the_shape_grafana_imports():
    dashboard = json.loads(DASHBOARD.read_text())
    assert {"title", "uid", "panels", "templating", "schemaVersion"} <= set(dashboard)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "instance"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24 and box["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert metric_names(target["expr"]), (panel["title"], target["expr"])
            assert '{instance=~"$instance"}' in target["expr"], (panel["title"],
                                                                 target["expr"])
            for variable in re.findall(r"\$\{?(\w+)", target["expr"]):
                assert variable in variables or variable.startswith("__"), variable
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("lag", "latency", "kafka", "dump", "login", "disk", "cpu", "memory"):
        assert subject in titles, subject


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def served(text: str) -> dict[str, str]:
    """Each series name in a /metrics text (``x_total``, ``x_bucket``...) -> its family's
    type; a gauge family with labels and no series yet (``cdc_table_quarantined`` while no
    table is) is served under its own name."""
    names = {family.name: family.type for family in text_string_to_metric_families(text)
             if family.type == "gauge"}
    return {**names, **{sample.name: family.type
                        for family in text_string_to_metric_families(text)
                        for sample in family.samples}}


async def test_every_metric_the_dashboard_and_alerts_use_is_served(
        tmp_path, source: Source, users_file: str, kafka_broker: ApacheKafka):
    kafka = kafka_section(kafka_broker, source, publisher_lock=f"cdc-{source.database}")
    running = await start_service(make_config(str(tmp_path / "data"), source.url, users_file,
                                              kafka=kafka))
    try:
        await until(lambda: running.service.replication.sink("kafka") is not None, timeout=30,
                    what="the publisher lock")
        source.execute(f"CREATE TABLE `{source.database}`.t (id INT PRIMARY KEY)",
                       f"INSERT INTO `{source.database}`.t VALUES (1), (2)")
        await kafka_caught_up(running, source)
        host, port = running.service.monitoring.address  # type: ignore[misc]
        text = await asyncio.to_thread(_scrape, f"http://{host}:{port}/metrics")
    finally:
        await running.stop()
    series = served(text)
    expressions = dashboard_expressions(json.loads(DASHBOARD.read_text()))
    expressions += [r["expr"] for r in alert_rules(yaml.safe_load(ALERTS.read_text()))]
    used = set().union(*map(metric_names, expressions))
    assert not used - set(series) - PROMETHEUS_SERIES, "not served"
    for name in used - PROMETHEUS_SERIES:
        suffix = next((s for s in ("_bucket", "_sum", "_count") if name.endswith(s)), None)
        if suffix is not None:
            assert series[name] == "histogram", name
    for expr in expressions:
        for name in _COUNTING.findall(expr):
            assert series[name] in ("counter", "histogram"), f"rate of gauge {name}: {expr}"
    # the Kafka sink's figures are real: everything produced was acknowledged
    assert series["cdc_kafka_publisher"] == "gauge"
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["cdc_kafka_publisher"] == 1
    assert values["cdc_kafka_messages_total"] >= 2
    assert values["cdc_kafka_messages_acknowledged_total"] == values["cdc_kafka_messages_total"]
    assert values["cdc_kafka_unacknowledged_messages"] == 0
    assert values["cdc_kafka_oldest_unacknowledged_seconds"] == 0
    assert values["cdc_kafka_buffered_bytes"] == 0
    assert values["cdc_kafka_transactions_total"] >= 2
    documented = (ROOT / "docs" / "monitoring.md").read_text()
    families = {f.name for f in text_string_to_metric_families(text)
                if f.name.startswith("cdc_")}
    undocumented = {name for name in families if f"`{name}" not in documented}
    assert not undocumented, "not in the metric table of docs/monitoring.md"
