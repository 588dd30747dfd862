"""How ``cdcserver ctl`` prints the admin API's answers for a person: aligned tables, sizes
(1.8 MiB), counts with separators, times and ages (``--json`` prints the API's JSON instead),
a line at a time on stdout, a failure on stderr."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any

from mariadb_cdc_client.format.names import table_ref


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 right: Sequence[str] = ()) -> str:
    """Columns aligned, two spaces apart; the ``right`` ones (numbers) aligned right."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.rjust(width) if header in right else cell.ljust(width)
                 for cell, width, header in zip(row, widths, headers, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def human_bytes(n: float | None) -> str:
    """1.8 MiB, 512 B; '-' for unknown."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if abs(round(value, 1)) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def thousands(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    minutes, seconds = divmod(int(s), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def when(iso: str | None, now: dt.datetime | None = None) -> str:
    """An ISO 8601 time in local time: the time of day if today, else the date too."""
    if not iso:
        return "-"
    try:
        moment = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    local = moment.astimezone()
    today = (now or dt.datetime.now()).astimezone().date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M")


def render_replication(doc: dict[str, Any], now: dt.datetime | None = None) -> str:
    source = doc.get("source") or {}
    where = source.get("current") or "-"
    more = []
    if source.get("sources", 1) > 1:
        more.append(f"{source['sources']} sources")
    if source.get("switches"):
        more.append(f"{source['switches']} switches")
    if source.get("refused"):
        more.append(f"refused: {', '.join(map(str, source['refused']))}")
    if more:
        where += f" ({'; '.join(more)})"
    seconds, transactions = doc.get("lag_seconds"), doc.get("lag_transactions")
    lags = [] if seconds is None else [_seconds(seconds)]
    if transactions is not None:
        lags.append(f"{transactions:,} {'transaction' if transactions == 1 else 'transactions'}")
    lag = ", ".join(lags) or "not measured yet"
    if lags and doc.get("lag_measured_at"):
        lag += f" (measured {when(doc['lag_measured_at'], now)})"
    queue = doc.get("queue") or {}
    rows = [("State", str(doc.get("state", "?"))),
            ("Source", where),
            ("Position", doc.get("position") or "(nothing applied yet)"),
            ("Last commit", when(doc.get("last_commit"), now)),
            ("Lag", lag),
            ("Transactions", thousands(doc.get("transactions"))),
            ("Queue", f"{human_bytes(queue.get('bytes'))} of "
                      f"{human_bytes(queue.get('capacity'))}")]
    problems = doc.get("problems") or []
    rows += [("Problems", p) for p in problems] or [("Problems", "none")]
    quarantined = doc.get("quarantined") or []
    rows += [("Quarantined", f"{q['table']} since {q.get('since') or '-'}"
                             f"{' (resyncing)' if q.get('resyncing') else ''}: {q.get('cause')}")
             for q in quarantined] or [("Quarantined", "none")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def render_clients(clients: list[dict[str, Any]], now: dt.datetime | None = None) -> str:
    rows = []
    for c in clients:
        reading = c.get("reading")
        if reading is None:
            reading = f"({c.get('phase', '-')})"
        elif c.get("kind") == "dump":
            reading += " (dump)"
        position, behind = c.get("position"), c.get("behind")
        if position:
            at = position.get("gtid") or f"offset {position.get('offset', 0):,}"
            where = f"{at} (v{position.get('version')})"
        else:
            where = "-"
        if behind:
            late = f"{human_bytes(behind.get('bytes'))}, {_seconds(behind.get('seconds'))}" \
                if behind.get("bytes") else "0"
        else:
            late = "-"
        fmt = c.get("format") or "-"
        if fmt == "JSON" and c.get("dialect"):
            fmt += f" ({c['dialect']})"
        rate = c.get("bytes_per_second")
        rows.append([str(c["id"]), str(c.get("address") or "-"), str(c.get("user") or "-"), fmt,
                     reading, where, late, "-" if rate is None else f"{human_bytes(rate)}/s",
                     when(c.get("connected_at"), now)])
    return render_table(["ID", "ADDRESS", "USER", "FORMAT", "READING", "POSITION", "BEHIND",
                         "RATE", "SINCE"], rows, right=["ID", "RATE"])


def render_tables(tables: list[dict[str, Any]]) -> str:
    rows = []
    for t in tables:
        q = t.get("quarantined")
        state = "ok" if not q else \
            f"quarantined{' (resyncing)' if q.get('resyncing') else ''}: {q.get('cause')}"
        rows.append([t["table"], str(len(t.get("versions") or [])), thousands(t.get("records")),
                     human_bytes(t.get("bytes")), t.get("last_gtid") or "-", state])
    return render_table(["TABLE", "VERSIONS", "RECORDS", "SIZE", "LAST GTID", "STATE"], rows,
                        right=["VERSIONS", "RECORDS", "SIZE"])


def render_dumps(doc: dict[str, Any], now: dt.datetime | None = None) -> str:
    rows = [[d["name"], d["table"], human_bytes(d.get("bytes")), thousands(d.get("rows")),
             d.get("gtid") or "-", ", ".join(map(str, d.get("readers") or [])) or "-"]
            for d in doc.get("dumps", [])]
    text = render_table(["NAME", "TABLE", "SIZE", "ROWS", "GTID", "READERS"], rows,
                        right=["SIZE", "ROWS"])
    taking = doc.get("taking") or []
    if taking:
        rows = []
        for t in taking:
            rows.append([t.get("ref") or table_ref(t["database"], t["table"]),
                         str(t.get("state", "?")), _progress(t), when(t.get("started"), now),
                         str(t.get("error") or "")])
        text += "\n\nBeing taken:\n" + render_table(
            ["TABLE", "STATE", "PROGRESS", "STARTED", "ERROR"], rows, right=["PROGRESS"])
    return text


def _progress(entry: dict[str, Any]) -> str:
    """rows / estimated rows (percent)."""
    rows, estimate = entry.get("rows") or 0, entry.get("estimated_rows") or 0
    if entry.get("state") == "queued":
        return "-"
    if not estimate:
        return f"{rows:,} rows"
    return f"{rows:,} / {estimate:,} rows ({min(100.0, 100.0 * rows / estimate):.0f}%)"


def out(text: str) -> None:
    sys.stdout.write(text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text + "\n")


def print_json(document: Any) -> None:
    out(json.dumps(document, indent=1, ensure_ascii=False))
