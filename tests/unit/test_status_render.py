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


def test_the_kafka_sinks_initial_snapshot_is_shown_table_by_table():
    health = _health()
    health["kafka_snapshot"] = [
        {"table": "shop.orders", "state": "done", "rows": 1200, "total": 1200, "seconds": 3.2},
        {"table": "shop.items", "state": "publishing", "rows": 5000, "total": 90000,
         "seconds": 0.0},
        {"table": "shop.notes", "state": "dumping", "rows": 700, "total": 0, "seconds": 0.0}]
    lines = render_health("http://127.0.0.1:4002", health).splitlines()
    assert "  snapshot     shop.orders: done, 1,200 of 1,200 rows published (3.2s)" in lines
    assert "  snapshot     shop.items: publishing, 5,000 of 90,000 rows published (0.0s)" \
        in lines
    assert "  snapshot     shop.notes: dumping, 700 rows read" in lines
