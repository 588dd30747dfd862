"""Where a chunked dump's key ranges meet (:mod:`cdcserver.dump.chunked`, step 1): an integer
key cut arithmetically, from its span and the table's estimated rows, into ranges sized for one
reader's contiguous scan; any other key cut at sampled keys, one range per reader.
"""

from __future__ import annotations

import base64
from typing import Any

from cdcserver.core.names import TableName
from cdcserver.dump import rawrows
from cdcserver.dump.chunks import KeyRange
from cdcserver.dump.scan import ScanPlan
from cdcserver.dump.snapshot import qualified
from cdcserver.replication import source as source_sql

_INTEGER_KEYS = ("tinyint", "smallint", "mediumint", "int", "bigint", "serial")
_MOST_RANGES = 100_000
_TAIL_SPLIT = 4
_RANGE_BYTES = 32 << 20  # at most about this much of a range's dump in one range


def key_ranges(cuts: list[list[bytes]], last: list[bytes]) -> list[KeyRange]:
    """The ranges between the cuts (each the last key of the range before), the last one
    ending at ``last``, the table's last key; a cut repeated (sampled twice) made one."""
    hexed = [[v.hex() for v in cut] for cut in cuts]  # in key order, at most the last
    hexed = [h for i, h in enumerate(hexed) if i == 0 or h != hexed[i - 1]]
    edges: list[list[str] | None] = [None, *hexed, [v.hex() for v in last]]
    if len(edges) > 2 and edges[-2] == edges[-1]:
        edges.pop(-2)
    return [KeyRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def key_cuts(conn: Any, plan: ScanPlan, table: TableName, readers: int, chunk_rows: int
          ) -> tuple[list[list[bytes]], list[bytes] | None]:
    """Where the ranges meet (each the last key of the range before), and the table's last
    key (None: no row)."""
    key = plan.key
    cuts: list[list[bytes]] = []
    if len(key) == 1 and key[0].sql_type in _INTEGER_KEYS:
        column = f"`{key[0].name.replace('`', '``')}`"
        low, high, estimate = source_sql.query(  # and the estimate, in one round trip
            conn, f"SELECT MIN({column}), MAX({column}), (SELECT TABLE_ROWS FROM "
                  f"information_schema.TABLES WHERE TABLE_SCHEMA = "
                  f"{conn.escape(table.database)} AND TABLE_NAME = {conn.escape(table.table)})"
                  f" FROM {qualified(table)}")[0]
        estimate = int(estimate or 0)
        if low is None:
            return [], None
        low, high = int(low), int(high)
        count = min(max(readers, -(-estimate // _range_rows(
            conn, table, estimate, readers, chunk_rows))), _MOST_RANGES,
            max(high - low, 1))
        step = max((high - low) // count, 1)
        points = [low + step * i for i in range(1, count)]
        # the last quarter in ranges a quarter as long: the readers run out of ranges
        # at about the same time (one reader left alone with a whole range would leave
        # the source's other core idle)
        tail = count // 4 if readers > 1 and step >= _TAIL_SPLIT else 0
        for i in range(count - tail, count):
            start = low + step * i
            points += [start + step * j // _TAIL_SPLIT for j in range(1, _TAIL_SPLIT)]
        cuts = [[str(point).encode()] for point in sorted(points) if point < high]
        return cuts, [str(high).encode()]
    last = _key_row(conn, plan.last_key_sql())
    if last is None:
        return [], None
    if readers > 1 and (estimate := source_sql.estimated_rows(
            conn, table.database, table.table)) >= readers * 2:
        for i in range(1, readers):
            found = _key_row(conn, plan.key_sql(estimate * i // readers))
            if found is not None:
                cuts.append(found)
    return cuts, last


def _key_row(conn: Any, sql: str) -> list[bytes] | None:
    """The key values of the one row ``sql`` reads (its raw form, as the ranges hold them;
    None: no row)."""
    found = [row for batch in rawrows.query_rows(conn, sql) for row in batch]
    if not found:
        return None
    return [base64.b64decode(v) for v in found[0][2:-2].split(b'","')]


def _range_rows(conn: Any, table: TableName, estimate: int, readers: int, chunk_rows: int
                ) -> int:
    """Rows per range of an integer key: about half a chunk, so that one query usually
    reads a range; in a big table more, at least a ``readers * 8``th of it, up to four
    chunks or ``_RANGE_BYTES`` of dump (what a reader may hold of a range before its turn).
    A range is one reader's contiguous scan, and InnoDB reads the next extent ahead only
    within one: where the table is not in the buffer pool, every range's start costs the
    source synchronous page reads (ranges of 25,000 rows of the bench's big table: 5-15 %
    more CPU for mariadbd than ranges of 100,000)."""
    rows = max(chunk_rows // 2, 1)
    wanted = estimate // (readers * 8)
    if wanted <= rows:
        return rows
    found = source_sql.query(conn, "SELECT AVG_ROW_LENGTH FROM information_schema.TABLES "
                                   "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                             (table.database, table.table))
    length = int(found[0][0] or 0) if found else 0
    row_bytes = max(length, 1) * 4 // 3 + 8  # base64 and JSON
    return max(rows, min(wanted, 4 * chunk_rows, _RANGE_BYTES // row_bytes))
