"""Folding a table's stored versions into its view: the table as a consumer that read the
stream from the table's first version holds it now (:meth:`cdcserver.reread.view.Views.fold`).

A consumer empties the table when a version says it was truncated, dropped or created afresh,
so the fold starts at the last such version; a table a rename made starts with the renamed
table's rows, down the chain of renames; columns a version renamed are renamed in the rows
held. A keyed view collapses each batch of records to each key's last state before writing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from cdcserver.core.names import TableName
from cdcserver.reread.tableview import Row, TableView, ViewsClosed, pack
from cdcserver.reread.values import from_avro
from cdcserver.store.avrofile import Block, scan_blocks
from cdcserver.store.catalog import Catalog, VersionInfo
from cdcserver.store.records import Record, decode_records

_EMPTYING = ("truncate", "drop", "create")  # a version that starts the table afresh


def fold_into(view: TableView, catalog: Catalog, table: TableName,
              closing: threading.Event) -> None:
    """Apply ``table``'s versions from the last one that emptied it (what came before is gone
    from a consumer's table). When that version made the table by a rename, the renamed
    table's rows as they were then come first: its versions up to the rename, and so on down
    the chain (a table swapped back and forth thousands of times: walked, not recursed).
    A version whose ``ddl`` names ``renamed_columns`` renames the columns of the rows held, as
    a consumer does: every row is kept under the view's (the last version's) names."""
    segments = _lineage(catalog, table)
    view.clear()
    for versions, names in reversed(segments):
        for info, (own, _) in zip(versions, names, strict=True):
            _fold_version(view, info, closing, own)


def _lineage(catalog: Catalog, table: TableName
             ) -> list[tuple[list[VersionInfo], list[tuple[dict[str, str], dict[str, str]]]]]:
    """The versions to fold, newest table first: each table's from its last emptying version
    (up to the rename that gave its rows to the table before it in the list), with where
    each version's column names end up."""
    segments = []
    renamed_to: tuple[TableName, str] | None = None
    onward: dict[str, str] = {}
    seen: set[tuple[TableName, tuple[TableName, str] | None]] = set()
    while (table, renamed_to) not in seen:
        seen.add((table, renamed_to))
        entry = catalog.get(table)
        if entry is None:
            break
        versions = []
        for number in sorted(entry.versions):
            info = entry.versions[number]
            ddl = info.ddl
            if renamed_to is not None and ddl.renamed_to == renamed_to[0] and \
                    ddl.gtid == renamed_to[1]:
                break
            versions.append(info)
        start = max((i for i, v in enumerate(versions) if v.ddl.kind in _EMPTYING), default=0)
        folded = versions[start:]
        names = _names_onward(folded, onward)
        segments.append((folded, names))
        first = folded[0].ddl if folded else None
        if first is None or first.kind != "create" or first.renamed_from is None:
            break
        renamed_to = (table, first.gtid)
        onward = names[0][1]  # the names just before the rename's version, onward
        table = first.renamed_from
    return segments


def _names_onward(versions: list[VersionInfo], last: dict[str, str]
                  ) -> list[tuple[dict[str, str], dict[str, str]]]:
    """For each version, where its column names end up (``last`` maps the last version's),
    and where the names just before it end up (its own ``renamed_columns`` undone: a swap
    is ``{a: b, b: a}``). A name missing from a map stays as it is."""
    result = []
    mapping = dict(last)
    for info in reversed(versions):
        own = mapping
        renamed = info.ddl.renamed_columns
        if renamed:
            mapping = {c: own.get(renamed.get(c, c), renamed.get(c, c))
                       for c in {*own, *renamed}}
        result.append((own, mapping))
    return result[::-1]


FOLD_BATCH = 20_000  # records of a keyed fold collapsed to one state per key, then written


def _fold_version(view: TableView, info: VersionInfo, closing: threading.Event,
                  names: dict[str, str]) -> None:
    fields = info.schema.columns
    converters = [(f.name, names.get(f.column, f.column), from_avro(f)) for f in fields]
    if view.keyed_fold and set(view.key) <= {column for _, column, _ in converters}:
        _fold_keyed(view, info, closing, converters)
        return
    for block in _blocks(info, closing):
        for record in decode_records(info, block):
            row = {column: convert(record.get(name)) for name, column, convert in converters}
            if record["event_type"] in ("insert", "update_after"):
                view.put(row)
            else:
                view.remove(row)


def _fold_keyed(view: TableView, info: VersionInfo, closing: threading.Event,
                converters: list[tuple[str, str, Any]]) -> None:
    """A keyed view without indexes: a batch of records collapsed to each key's last
    record, only its key's columns converted, then the survivors converted and written
    (:meth:`TableView.settle`). What ``put`` and ``remove`` per record would leave, in a
    fraction of the statements and conversions (a stream updates the same rows again and
    again)."""
    by_column = {column: (name, convert) for name, column, convert in converters}
    key = [by_column[column] for column in view.key]
    last: dict[bytes, Record | None] = {}  # each key's last record (None: removed)
    for block in _blocks(info, closing):
        for record in decode_records(info, block):
            packed = pack(tuple(convert(record.get(name)) for name, convert in key))
            last[packed] = record if record["event_type"] in ("insert", "update_after") \
                else None
        if len(last) >= FOLD_BATCH:
            view.settle(_rows(last, converters))
            last = {}
    view.settle(_rows(last, converters))


def _rows(last: dict[bytes, Record | None], converters: list[tuple[str, str, Any]]
          ) -> dict[bytes, Row | None]:
    return {key: None if record is None else
            {column: convert(record.get(name)) for name, column, convert in converters}
            for key, record in last.items()}


def _blocks(info: VersionInfo, closing: threading.Event) -> Iterator[Block]:
    for block in scan_blocks(info.path, info.header, info.header.size, info.committed):
        if closing.is_set():
            raise ViewsClosed("the views were closed during a fold")
        yield block

