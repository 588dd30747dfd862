"""Dump files in ``<data_dir>/dump``: names, listing, and the in-use lock.

A dump is written as ``<stem>.partial`` (with ``<stem>.progress`` beside it) and renamed to
``<db>.<table>.<YYYYmmddTHHMMSS-ffffffZ>.dump`` only when complete, so a listed dump is always
whole. A transfer marks the file in use (:mod:`cdcserver.store.inuse`) for its whole duration.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from dataclasses import dataclass

from cdcserver.core.names import TableName
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import dump_stem, table_of_stem
from mariadb_cdc_client.format.dump import DumpHeader

log = logging.getLogger(__name__)

SUFFIX = ".dump"
_NAME = re.compile(r"^([^.]+)\.([^.]+)\.(\d{8}T\d{6}-\d{6}Z)\.dump$")


def dump_dir(data_dir: str) -> str:
    return DataDir(data_dir).dumps


def new_name(table: TableName, when: dt.datetime) -> str:
    return f"{dump_stem(table)}.{when.astimezone(dt.UTC).strftime('%Y%m%dT%H%M%S-%fZ')}{SUFFIX}"


@dataclass(frozen=True)
class DumpInfo:
    name: str
    path: str
    table: TableName
    header: DumpHeader
    size: int
    modified: float

    def summary(self) -> dict[str, object]:
        h = self.header
        return {"name": self.name, "database": h.database, "table": h.table, "gtid": h.gtid,
                "binlog": {"file": h.binlog_file, "pos": h.binlog_pos}, "rows": h.rows,
                "bytes": self.size, "created": h.created, "stream_version": h.stream_version,
                "schema": h.schema}


def read_header(path: str) -> DumpHeader:
    with open(path, "rb") as f:
        return DumpHeader.from_json(json.loads(f.readline()))


def read_info(path: str) -> DumpInfo:
    name = os.path.basename(path)
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"{name} is not a dump file name")
    stat = os.stat(path)
    header = read_header(path)
    return DumpInfo(name, path, table_of_stem(m[1], m[2]) or _named_by(header), header,
                    stat.st_size, stat.st_mtime)


def _named_by(header: DumpHeader) -> TableName:
    """The table a dump holds, from its header (its file name may be shortened)."""
    return TableName(header.database, header.table)


def list_dumps(data_dir: str, table: TableName | None = None) -> list[DumpInfo]:
    """Complete dumps, oldest first."""
    directory = dump_dir(data_dir)
    found = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = _NAME.match(name)
        if m is None:
            continue
        named = table_of_stem(m[1], m[2])
        if table is not None and named is not None and named != table:
            continue
        path = os.path.join(directory, name)
        try:
            header = read_header(path)
            stat = os.stat(path)
        except FileNotFoundError:
            continue  # deleted meanwhile
        except (ValueError, KeyError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            continue
        named = named or _named_by(header)
        if table is not None and named != table:
            continue
        found.append(DumpInfo(name, path, named, header, stat.st_size, stat.st_mtime))
    return sorted(found, key=lambda d: (d.header.created, d.name))
