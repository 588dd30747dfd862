"""``cdcserver status`` renders /health for a person (cdcserver/ops/status.py): a repair that
holds the checkpoint back says which tables, at what stage and for which transaction, as
/health's ``repairs_waiting`` does (the field that showed why the 100-kill loop of issue 52
never caught up)."""

from __future__ import annotations

from cdcserver.ops.status import render_health


def _health(**replication: object) -> dict[str, object]:
    return {"status": "ok", "problems": [],
            "replication": {"connected": True, "applied": "0-1-13506", "lag_seconds": 0.0,
                            "lag_transactions": 0, "lag_measured_at": None,
                            "repair_pending": bool(replication.get("repairs_waiting")),
                            **replication}}


def test_a_repair_holding_the_checkpoint_back_is_named():
    text = render_health("http://127.0.0.1:4002", _health(repairs_waiting=[
        {"stage": "read beside the stream", "tables": ["eos.orders"], "cause": "0-1-7769"},
        {"stage": "being read", "tables": [], "cause": "", "count": 2}]))
    assert "  repairing    eos.orders: read beside the stream, transaction 0-1-7769; " \
        "no checkpoint until it is out" in text.splitlines()
    assert "  repairing    (tables being read): being read; no checkpoint until it is out" \
        in text.splitlines()


def test_no_repair_no_line():
    assert "repairing" not in render_health("http://127.0.0.1:4002", _health())
