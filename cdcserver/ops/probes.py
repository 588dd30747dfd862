"""``GET /live`` and ``GET /ready``: the probes an orchestrator acts on, as Kubernetes
(https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/) and
Debezium Server (``/q/health/live``, ``/q/health/ready``) have them.

*Live*: the process works. The event loop answered the request, so it is live unless the
service is stopping or its replication failed (the service then exits): restarting a live
service would not help. A service whose source purged the binlog it needs, or whose disk is
full, is live: it serves what it stored, and a restart changes neither.

*Ready*: it replicates (connected to a source) and its lag is within :data:`MAX_LAG`: what
a client reads from it is recent. Not ready, the answer says why in one ``reason`` code and a
``message`` for a person; the first that applies, in this order: ``stopping``, ``stopped``
(the binlog it needs was purged), ``paused`` (the data directory is full, or its disk
failed and the service waits to start over from its checkpoint), ``starting``
(checking the source, or waiting for it), ``no-source`` (no source can continue the stream),
``disconnected`` (reconnecting), ``lag-unknown`` (the lag probe has no answer from the
source), ``catching-up`` (behind, with nothing applied yet: the lag's age is unknown),
``lagging`` (over the budget).

``/health`` (``metrics.py``) is the older, wider document and stays as it is; its limit is
``[metrics] max_lag``.
"""

from __future__ import annotations

from typing import Any

from cdcserver.ops.metrics import ReplicationStats, ServiceStats

# Seconds of replication lag (the age of the newest applied commit while the source has more)
# a ready service may have. A minute: a client reads changes at most a minute old, and a
# service restarted after a few minutes away turns ready once it has caught up to that.
MAX_LAG = 60.0

STOPPING = "the service is stopping"


def live(replication: ReplicationStats) -> tuple[bool, dict[str, Any]]:
    """(live, document) for ``/live``."""
    if replication.failure:
        return False, {"live": False, "reason": "failed",
                       "message": f"replication failed: {replication.failure}"}
    if replication.halted:
        return False, {"live": False, "reason": "stopping", "message": STOPPING}
    return True, {"live": True}


def ready(stats: ServiceStats, max_lag: float = MAX_LAG) -> tuple[bool, dict[str, Any]]:
    """(ready, document) for ``/ready``: the lag figures, and without readiness the first
    reason that applies."""
    lag = stats.lag
    document: dict[str, Any] = {
        "ready": False,
        "lag_seconds": lag.seconds if lag else None,
        "lag_transactions": lag.transactions if lag else None,
        "max_lag_seconds": max_lag,
    }
    reason, message = _not_ready(stats, max_lag)
    if not reason:
        document["ready"] = True
        return True, document
    document["reason"] = reason
    document["message"] = message
    return False, document


def _not_ready(stats: ServiceStats, max_lag: float) -> tuple[str, str]:
    """(reason, message), or ("", "") when ready."""
    replication, lag = stats.replication, stats.lag
    if replication.halted or replication.failure:
        return "stopping", STOPPING
    if replication.stopped:
        return "stopped", replication.stopped
    if replication.paused:
        return "paused", replication.paused
    if not replication.started:
        return "starting", ("replication has not started (checking the source, or waiting "
                            "for it)")
    if not replication.connected:
        if replication.refused and len(replication.refused) >= replication.sources:
            return "no-source", "no source can continue the stream: " + "; ".join(
                replication.refused)
        return "disconnected", "the replication connection is down (reconnecting)"
    if lag is None or lag.transactions is None:
        return "lag-unknown", "the source has not answered the lag probe yet"
    if lag.error:
        return "lag-unknown", f"the source did not answer the lag probe: {lag.error}"
    if lag.seconds is None:
        return "catching-up", (f"catching up: {lag.transactions:,} transactions behind, none "
                               "applied yet, so the lag is not known")
    if lag.seconds > max_lag:
        return "lagging", (f"replication lag {lag.seconds:.0f} s is over the {max_lag:.0f} s "
                           f"budget ({lag.transactions:,} transactions behind)")
    return "", ""
