"""The test oracle (tests/oracle.py) rebuilds a table down a chain of thousands of renames
without Python's recursion (a soak swaps tables that often; the oracle used to raise
RecursionError there)."""

from __future__ import annotations

from typing import Any

from tests.oracle import rebuild

DEPTH = 3000


def _schema(table: str, gtid: str, **ddl: str) -> dict[str, Any]:
    return {"database": "db", "table": table, "gtid": gtid, "ddl": ddl,
            "fields": [{"name": n} for n in ("domain", "server_id", "sequence",
                                              "event_number", "timestamp", "event_type",
                                              "id", "v")],
            "primary_key": ["id"]}


def test_a_table_renamed_thousands_of_times_keeps_its_first_rows():
    names = [f"a{i}" for i in range(DEPTH)] + ["t"]
    streams: dict[str, list[dict[str, Any]]] = {}
    for i, name in enumerate(names):
        lines = [_schema(name, f"0-1-{i}", kind="create",
                         **({"renamed_from": f"db.{names[i - 1]}"} if i else {}))]
        if i == 0:
            lines.append({"event_type": "insert", "id": 1, "v": "first"})
        if i + 1 < len(names):
            lines.append(_schema(name, f"0-1-{i + 1}", kind="drop",
                                 renamed_to=f"db.{names[i + 1]}"))
        streams[f"db.{name}"] = lines
    rebuilt = rebuild(streams["db.t"], ("id",), streams)
    assert rebuilt.rows == {(1,): {"id": 1, "v": "first"}}
