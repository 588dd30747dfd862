"""``cdcserver status``: a running service's /health document, for a person."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Any

from cdcserver.core.config import Config
from cdcserver.core.errors import ConfigError
from mariadb_cdc_client.format.names import table_ref

TIMEOUT = 5.0


def endpoint_url(config: Config) -> str:
    """The monitoring endpoint's URL as seen on this host (a wildcard address is reached on
    the loopback)."""
    where = config.metrics.host_port()
    if where is None:
        raise ConfigError("metrics.listen is off: give the endpoint's URL")
    host = "127.0.0.1" if where[0] in ("0.0.0.0", "::") else where[0]
    return f"http://{host}:{where[1]}"


def fetch_health(url: str, path: str = "/health") -> tuple[bool, dict[str, Any]]:
    """(healthy, document) from ``/health`` (or ``/live``, ``/ready``): 200 is healthy, 503
    comes with its document; an unreachable service is unhealthy with the reason."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=TIMEOUT) as response:
            return True, json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503: degraded, with its document
        with exc:
            try:
                return False, json.loads(exc.read())
            except ValueError:
                return False, {"status": "unreachable", "problems": [f"HTTP {exc.code}"]}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, {"status": "unreachable", "problems": [f"{url}: {reason}"]}


def render_health(url: str, doc: dict[str, Any]) -> str:
    lines = [f"service at {url}: {doc.get('status', '?').upper()}"]
    lines += [f"  ! {problem}" for problem in doc.get("problems", [])]
    replication = doc.get("replication")
    if replication:
        lines.append(f"  replication  {'connected' if replication['connected'] else 'DOWN'}, "
                     f"applied up to {replication['applied'] or '(nothing yet)'}")
        lines.append(f"  lag          {_lag(replication)}")
        lines += [_waiting(entry) for entry in replication.get("repairs_waiting") or []]
    for entry in doc.get("kafka_snapshot") or []:
        done = f"{entry['rows']:,} rows read" if entry["state"] == "dumping" else \
            f"{entry['rows']:,} of {entry['total']:,} rows published ({entry['seconds']}s)"
        lines.append(f"  snapshot     {entry['table']}: {entry['state']}, {done}")
    if "checkpoint_age_seconds" in doc:
        lines.append(f"  checkpoint   {_age(doc['checkpoint_age_seconds'])}")
        quarantined = doc.get("quarantined") or []
        lines.append(f"  tables       {doc['tables']}" + (
            f", {len(quarantined)} quarantined" if quarantined else ""))
        for entry in quarantined:
            since = dt.datetime.fromtimestamp(float(entry["at"])).strftime("%Y-%m-%d %H:%M:%S")
            lines.append(f"  quarantined  {table_ref(entry['database'], entry['table'])} since "
                         f"{since} (transaction {entry['since']}): {entry['cause']}")
        for entry in doc.get("repairs") or []:
            at = dt.datetime.fromtimestamp(float(entry["at"])).strftime("%Y-%m-%d %H:%M:%S")
            lines.append(f"  repaired     {entry['table']} at {at} ({entry['records']} rows, "
                         f"transaction {entry['cause']}): {entry['reason']}")
        lines.append(f"  clients      {doc['clients']} connected; {doc['records_sent']:,} "
                     f"records, {doc['bytes_sent']:,} bytes sent since start")
    return "\n".join(lines)


def _waiting(entry: dict[str, Any]) -> str:
    """A repair that holds the checkpoint back (/health's ``repairs_waiting``)."""
    tables = ", ".join(entry.get("tables") or []) or "(tables being read)"
    cause = f", transaction {entry['cause']}" if entry.get("cause") else ""
    return (f"  repairing    {tables}: {entry['stage']}{cause}; no checkpoint until it is "
            "out")


def _lag(replication: dict[str, Any]) -> str:
    seconds, transactions = replication["lag_seconds"], replication["lag_transactions"]
    if transactions is None:
        return "not measured yet"
    measured = replication.get("lag_measured_at")
    when = (f" (measured {dt.datetime.fromtimestamp(measured).strftime('%H:%M:%S')})"
            if measured else "")
    age = "?" if seconds is None else f"{seconds:.1f} s"
    return f"{transactions:,} transactions, {age}{when}"


def _age(seconds: float) -> str:
    return "covers everything applied" if not seconds else f"{seconds:.1f} s behind the data"
