"""The schema history's file, ``state/schema_history.jsonl``: one line per change of a table's
definition, with the GTID of its transaction, appended and fsynced before the change is used.

On start the file is read up to the replication start position (entries it does not cover
are replayed from the binlog) and compacted to one line per table known then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from cdcserver.core.durable import write_all, write_atomically
from cdcserver.core.errors import disk_refusal
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.schema.definition import TableDefinition

log = logging.getLogger('cdcserver.schema.history')


def read_history(path: str, start: GtidState) -> dict[TableName, TableDefinition]:
    """Each table's definition up to ``start``, as the file at ``path`` records it."""
    tables: dict[TableName, TableDefinition] = {}
    for entry in _entries(path):
        if entry["gtid"] and not start.covers(Gtid.parse(entry["gtid"])):
            continue
        table = TableName(*entry["table"])
        if entry["definition"] is None:
            tables.pop(table, None)
        else:
            tables[table] = TableDefinition.from_json(entry["definition"])
    return tables


def _entries(path: str) -> Iterator[dict[str, Any]]:
    """The file's entries, without a torn last line: one without its newline (a crash or a
    full disk while appending), or the last line whose text is not JSON (a power loss can
    leave the file's new size with zeros where the line was). An append is fsynced before
    its change is used, so a torn entry's transaction was not applied: it is replayed from
    the binlog. Any other line that is not JSON raises."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    torn = lines.pop()  # what follows the last newline
    while lines and not lines[-1].strip():
        lines.pop()
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except ValueError:  # not JSON, or not UTF-8
            if number < len(lines):
                raise
            torn = raw
            break
        yield entry
    if torn.strip():
        log.warning("schema history: ignoring an incomplete last line")


def compact_history(path: str, tables: dict[TableName, TableDefinition]) -> None:
    """The file at ``path`` replaced, atomically, by one line per table of ``tables``."""
    lines = [json.dumps({"gtid": "", "table": [t.database, t.table],
                         "definition": d.to_json()}) for t, d in sorted(tables.items())]
    write_atomically(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def append_change(path: str, table: TableName, definition: TableDefinition | None,
                  gtid: Gtid | None) -> None:
    """A line for the table's new definition (None: no table any more), fsynced; nothing of
    it left when the write fails (a full disk: the caller stops)."""
    line = json.dumps({"gtid": str(gtid) if gtid else "", "table": [table.database,
                                                                    table.table],
                       "definition": definition.to_json() if definition else None})
    try:
        _append(path, line + "\n")
    except OSError as exc:  # the disk's refusal, as the store says it: one line, no crash
        refused = disk_refusal(f"the schema history {path}", exc)
        if refused is None:
            raise
        raise refused from exc


def _append(path: str, line: str) -> None:
    """``line`` appended whole and fsynced, or the file as it was. (A disk that fills in the
    middle of a write takes the part that fits without an error, and only the next write
    fails: a single ``os.write`` left half a line, the next line was appended to it, and the
    service could not read the history at its next start.)"""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, line.encode("utf-8"))
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # (the write's error is the one to tell)
                os.ftruncate(fd, size)  # no torn line: the caller stops, the entry is replayed
            raise
    finally:
        os.close(fd)
