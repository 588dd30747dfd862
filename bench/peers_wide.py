"""The wide-row workload of bench_peers.py (issue 53): ``peerswide.wide``, 40 columns, text
and JSON mixed with numbers and dates, about 2.5 kB a row.

At full size 60,000 rows inserted in transactions of 1,000, then 15,000 updated (a text, a
JSON, two numbers and a date changed: MariaDB logs full before and after images, so each
update carries both rows); ``bench_peers.py --rows N`` scales it with the standard workload
(``N * 60,000 / 200,000`` inserts, a quarter of them updated). After ``RESET MASTER``: the
binlog both tools read from its start.
"""

from __future__ import annotations

import random

from bench.common import BATCH, INSERTS
from cdcserver.app.embedded import EmbeddedMariaDB

DATABASE, TABLE = "peerswide", "wide"
FULL_INSERTS = 60_000  # at the standard workload's INSERTS; 15,000 updates with them

# (name, type, kind): 1 key, 39 others, in groups that repeat through the table
_GROUP = (("n", "INT", "int"), ("b", "BIGINT", "big"), ("d", "DECIMAL(14,4)", "dec"),
          ("f", "DOUBLE", "float"), ("v", "VARCHAR(96)", "short"), ("t", "TEXT", "text"),
          ("j", "JSON", "json"), ("at", "DATETIME(3)", "time"), ("day", "DATE", "date"))
COLUMNS = [(f"{name}{i}", sql, kind) for i in range(5) for name, sql, kind in _GROUP][:39]
assert len(COLUMNS) == 39

CREATE = (f"CREATE TABLE {DATABASE}.{TABLE} (id INT AUTO_INCREMENT PRIMARY KEY, "
          + ", ".join(f"{name} {sql}" for name, sql, _ in COLUMNS) + ")")
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
          "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore")


def inserts_for(rows: int) -> int:
    """The wide inserts matching ``rows`` standard ones (60,000 at the full 200,000)."""
    return max(1, rows * FULL_INSERTS // INSERTS)


def _value(kind: str, rng: random.Random, i: int) -> object:
    if kind == "int":
        return rng.randint(-2**31, 2**31 - 1)
    if kind == "big":
        return rng.randint(-10**17, 10**17)
    if kind == "dec":
        return f"{rng.randint(-10**13, 10**13) / 10**4:.4f}"
    if kind == "float":
        return rng.random() * 10**6
    if kind == "short":
        return f"name-{i}-" + "-".join(rng.choices(_WORDS, k=6))
    if kind == "text":
        return " ".join(rng.choices(_WORDS, k=rng.randint(40, 90)))
    if kind == "json":
        ok = "true" if i % 2 else "false"
        return (f'{{"id": {i}, "tags": ["{rng.choice(_WORDS)}", "{rng.choice(_WORDS)}"], '
                f'"score": {rng.random():.3f}, "nested": {{"ok": {ok}, '
                f'"note": "{" ".join(rng.choices(_WORDS, k=12))}"}}}}')
    if kind == "time":
        return (f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00.{rng.randint(0, 999):03d}")
    if kind == "date":
        return f"20{rng.randint(10, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    raise ValueError(kind)


def write_wide(server: EmbeddedMariaDB, inserts: int) -> int:
    """``inserts`` rows into ``peerswide.wide`` and a quarter of them updated, in transactions
    of ``BATCH``, after ``RESET MASTER``. Returns the row changes written."""
    updates = inserts // 4
    rng = random.Random(53)
    server.execute(f"DROP DATABASE IF EXISTS {DATABASE}", "RESET MASTER",
                   f"CREATE DATABASE {DATABASE}", CREATE)
    names = ", ".join(name for name, _, _ in COLUMNS)
    insert = (f"INSERT INTO {DATABASE}.{TABLE} ({names}) VALUES "
              f"({', '.join(['%s'] * len(COLUMNS))})")
    conn = server.connect()
    conn.autocommit(False)
    with conn.cursor() as cur:
        for batch in range(-(-inserts // BATCH)):
            first = batch * BATCH
            cur.executemany(insert, [tuple(_value(kind, rng, first + i) for _, _, kind in COLUMNS)
                                     for i in range(min(BATCH, inserts - first))])
            conn.commit()
        for batch in range(-(-updates // BATCH)):
            first = batch * BATCH + 1
            last = first + min(BATCH, updates - batch * BATCH) - 1
            cur.execute(f"UPDATE {DATABASE}.{TABLE} SET n0 = n0 + 1, f1 = f1 * 2, "
                        "t2 = CONCAT(t2, ' updated'), j3 = JSON_SET(j3, '$.updated', true), "
                        "at3 = at3 + INTERVAL 1 SECOND WHERE id BETWEEN %s AND %s",
                        (first, last))
            conn.commit()
    conn.close()
    return inserts + updates
