"""A table's view (cdcserver/reread/tableview.py) against a dict model: random inserts, deletes
and updates (some changing keys, some not) applied as row events of several rows, as a bulk
statement logs them. The view takes whole events in one statement where it can."""

from __future__ import annotations

import random

import pytest

from cdcserver.core.changes import ColumnDef, Rows, RowsKind, TableLayout
from cdcserver.core.names import TableName
from cdcserver.reread.view import Views

LAYOUT = TableLayout("db", "t", (ColumnDef("id", 3), ColumnDef("v", 15)), primary_key=(0,))


def _event(kind: RowsKind, rows: list[tuple[object, ...]]) -> Rows:
    return Rows(LAYOUT, kind, 0, rows)


@pytest.mark.parametrize("seed", range(20))
def test_a_keyed_view_follows_random_events(tmp_path: object, seed: int) -> None:
    rng = random.Random(seed)
    views = Views(f"{tmp_path}/views.sqlite")
    view = views.new(TableName("db", "t"), ("id",))
    model: dict[int, str] = {}
    for step in range(200):
        kind = rng.choice(list(RowsKind))
        if kind == RowsKind.INSERT:
            fresh = [k for k in rng.sample(range(100), 5) if k not in model]
            rows = [(k, f"v{step}") for k in fresh]
            model.update(dict(rows))  # type: ignore[arg-type]
        elif kind == RowsKind.DELETE:
            gone = rng.sample(sorted(model), min(3, len(model)))
            rows = [(k, model.pop(k)) for k in gone]
        else:
            chosen = rng.sample(sorted(model), min(4, len(model)))
            rows = []
            if rng.random() < 0.5:  # new values, same keys
                for k in chosen:
                    rows += [(k, model[k]), (k, f"u{step}")]
                    model[k] = f"u{step}"
            else:  # new keys, in an order MariaDB could apply them (no collision)
                for k in chosen:
                    new = max([*model, 100]) + 1
                    rows += [(k, model[k]), (new, model[k])]
                    model[new] = model.pop(k)
        view.apply(_event(kind, rows))
        assert {r["id"]: r["v"] for r, _ in view.rows()} == model, f"seed {seed}, step {step}"
    views.close()
