"""``cdcserver ctl dump``: ask the running service for dumps of tables and, with
``--progress``, follow them to the end with a progress bar each (``GET /api/v1/dumps`` every
:data:`POLL` seconds)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from cdcserver.app.ctlapi import PROG, Api, table_named
from cdcserver.app.ctlformat import err, out, print_json
from cdcserver.app.process import EXIT_FAILED, EXIT_OK
from mariadb_cdc_client.format.names import table_ref

POLL = 0.5  # seconds between looks at a dump being taken
# A dump that left ``taking`` without failing is listed in ``dumps`` by the next look or so;
# after this long without it, something removed it (say, the retention cleaner).
VANISHED_AFTER = 10.0


def take_dumps(api: Api, args: argparse.Namespace) -> int:
    names = [text if text.strip().endswith(".*") else table_named(text) for text in args.tables]
    before: set[str] = set()
    if args.progress:
        before = {d["name"] for d in api.get("/api/v1/dumps")["dumps"]}
    answer = api.call("POST", "/api/v1/dumps", {"tables": names})
    queued: list[str] = list(answer.get("queued", []))
    under_way: list[str] = list(answer.get("under_way", []))
    if not args.progress:
        if args.json:
            print_json(answer)
        else:
            if queued:
                out(f"queued: {', '.join(queued)} (`{PROG} dumps` shows the progress)")
            if under_way:
                out(f"under way already: {', '.join(under_way)}")
        return EXIT_OK
    return _follow(api, [*queued, *under_way], before, args.json)


def _follow(api: Api, tables: list[str], before: set[str], as_json: bool) -> int:
    """Poll ``GET /api/v1/dumps`` until each table's dump is complete (a new one is listed)
    or failed, with a progress bar each on stderr."""
    following = _Following(tables, before)
    try:
        while following.pending:
            following.look(api.get("/api/v1/dumps"))
            if following.pending:
                time.sleep(POLL)
    except KeyboardInterrupt:
        following.close()
        sys.stderr.write("\n")
        err(f"{PROG}: stopped following; the dumps go on in the service (`{PROG} dumps`)")
        return EXIT_FAILED
    finally:
        following.close()
    if as_json:
        print_json({"dumps": list(following.done.values()),
                    "failed": [{"table": t, "error": e} for t, e in following.failed.items()]})
    else:
        for table in tables:
            if table in following.done:
                out(following.done[table]["name"])
    for table, error in following.failed.items():
        err(f"{PROG}: the dump of {table} failed: {error}")
    return EXIT_FAILED if following.failed else EXIT_OK


class _Following:
    """The dumps followed: a progress bar each, and how each ended (a new dump listed, or
    a failure)."""

    def __init__(self, tables: list[str], before: set[str]) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self.tables = tables
        self.before = before  # the dumps listed before these were asked for
        self.bars: dict[str, Any] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self.failed: dict[str, str] = {}
        self.gone_since: dict[str, float] = {}

    @property
    def pending(self) -> bool:
        return len(self.done) + len(self.failed) < len(self.tables)

    def look(self, document: dict[str, Any]) -> None:
        """One answer of ``GET /api/v1/dumps``: each table's bar moved, or its end noted."""
        taking = {entry.get("ref") or table_ref(entry["database"], entry["table"]): entry
                  for entry in document.get("taking", [])}
        fresh = {d["table"]: d for d in document["dumps"] if d["name"] not in self.before}
        for table in self.tables:
            if table not in self.done and table not in self.failed:
                self._look_at(table, taking.get(table), fresh)

    def _look_at(self, table: str, entry: dict[str, Any] | None,
                 fresh: dict[str, dict[str, Any]]) -> None:
        bar = self._bar_of(table, int((entry or {}).get("estimated_rows") or 0))
        if entry is not None and entry.get("state") == "failed":
            self.failed[table] = entry.get("error") or "the dump failed"
            bar.set_postfix_str("failed", refresh=False)
            bar.close()
        elif entry is not None:
            self.gone_since.pop(table, None)
            _progressed(bar, entry)
        elif table in fresh:
            self.done[table] = dump = fresh[table]
            rows = int(dump.get("rows") or 0)
            bar.set_postfix_str("done", refresh=False)
            if rows:
                bar.total = max(rows, bar.n)
                bar.update(rows - bar.n)
            bar.close()
        elif time.monotonic() - self.gone_since.setdefault(table, time.monotonic()) > \
                VANISHED_AFTER:
            self.failed[table] = "no longer being taken, but no new dump of it is listed"
            bar.close()

    def _bar_of(self, table: str, total: int | None = None) -> Any:
        """The table's bar, made at the first look (with the source's estimate, if any)."""
        if table not in self.bars:
            self.bars[table] = self._tqdm(total=total or None, desc=table, unit=" rows",
                                          unit_scale=True, position=self.tables.index(table),
                                          file=sys.stderr, dynamic_ncols=True)
        return self.bars[table]

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _progressed(bar: Any, entry: dict[str, Any]) -> None:
    rows, estimate = int(entry.get("rows") or 0), int(entry.get("estimated_rows") or 0)
    if estimate and bar.total != max(estimate, rows):
        bar.total = max(estimate, rows)  # an estimate that was low grows with the rows
    bar.set_postfix_str(str(entry.get("state", "")), refresh=False)
    bar.update(rows - bar.n)
