"""Bringing a data directory back to its checkpoint when the store opens: after a crash, a
table version may hold bytes past the checkpoint (cut back), versions the checkpoint does not
cover may exist (removed), and the index may name transactions after it (dropped). What the
checkpoint covers must be there, whole; otherwise the store refuses to open, saying what is
missing, rather than guess."""

from __future__ import annotations

import contextlib
import json
import logging
import os

from cdcserver.core.errors import StoreError
from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.store.avrofile import Header, last_valid_end, read_header
from cdcserver.store.checkpoint import Checkpoint
from cdcserver.store.index import StoreIndex
from cdcserver.store.layout import DataDir
from cdcserver.store.naming import avro_stem, parse_version_file
from cdcserver.store.schema import TableSchema

log = logging.getLogger("cdcserver.store.store")  # as before: operators grep for it


def recover(layout: DataDir, index: StoreIndex, headers: dict[str, Header],
            checkpoint: Checkpoint | None) -> None:
    """The directory as the checkpoint left it; ``headers`` gets each header read."""
    torn: list[tuple[str, int, str]] = []
    files = version_files(layout, headers, torn)
    if checkpoint is None:
        if files or torn:
            raise StoreError(
                f"{layout.avro} holds Avro files but {layout.checkpoint} is missing; "
                "refusing to guess what they contain. Restore the checkpoint, or move the "
                "files away to start over.")
        return
    _remove_torn(layout, torn, checkpoint)
    for table, versions in files.items():
        mark = checkpoint.tables.get(table)
        for version in sorted(versions):
            if mark is None or version > mark.version:
                log.warning("recovery: removing %s version %d, written after the checkpoint",
                            table, version)
                delete_version(layout, index, table, version)
            elif version == mark.version:
                _cut_back(layout, index, headers, table, version, mark.size)
    for table, mark in checkpoint.tables.items():
        if mark.version not in files.get(table, {}):
            raise StoreError(f"the checkpoint covers {table} version {mark.version}, "
                             "but its file is missing")
    covered = checkpoint.position.gtid_state if checkpoint.position else GtidState()
    index.drop_transactions_after(covered, checkpoint.index_ordinal)


def version_files(layout: DataDir, headers: dict[str, Header],
                  torn: list[tuple[str, int, str]] | None = None
                  ) -> dict[TableName, dict[int, str]]:
    """Each table's version files by version. A file whose name is shortened names its
    table in its header; one whose header cannot be read goes to ``torn`` (stem, version,
    path) if given, else the error is raised."""
    files: dict[TableName, dict[int, str]] = {}
    for file_name in os.listdir(layout.avro):
        parsed = parse_version_file(file_name)
        if parsed is None or parsed[2] != "avro":
            continue
        path = layout.avro_file(file_name)
        try:
            table = parsed[0] or _table_in_header(path, headers)
        except (StoreError, ValueError, KeyError):
            if torn is None:
                raise
            torn.append((file_name.rsplit(".", 2)[0], parsed[1], path))
            continue
        files.setdefault(table, {})[parsed[1]] = path
    return files


def _remove_torn(layout: DataDir, torn: list[tuple[str, int, str]],
                 checkpoint: Checkpoint) -> None:
    """Version files with a shortened name whose header cannot be read: a file is created
    before its header is written, and a crash between the two (or a power loss before the
    header reached the disk) leaves it empty or cut. One the checkpoint does not cover (no
    table of its stem at that version or later) was written after it: removed, its schema
    file too. One it covers is damaged: the store refuses to open."""
    for stem, version, path in torn:
        covering = [t for t, mark in checkpoint.tables.items()
                    if avro_stem(t) == stem and version <= mark.version]
        if covering:
            raise StoreError(f"the checkpoint covers {covering[0]} version {version}, but "
                             f"the header of {path} cannot be read")
        log.warning("recovery: removing %s, whose header a crash cut short after the "
                    "checkpoint", path)
        for suffix in ("avro", "avsc"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layout.avro_file(f"{stem}.{version:06d}.{suffix}"))


def _table_in_header(path: str, headers: dict[str, Header]) -> TableName:
    """The table a version file with a shortened name holds, from its schema."""
    header = headers[path] = read_header(path)
    return TableSchema.from_avsc(json.loads(header.schema_json)).table


def _cut_back(layout: DataDir, index: StoreIndex, headers: dict[str, Header],
              table: TableName, version: int, size: int) -> None:
    path = layout.table_file(table, version, "avro")
    actual = os.path.getsize(path)
    if actual < size:
        raise StoreError(f"{path} is {actual} bytes but the checkpoint says {size}: "
                         "data the checkpoint covers is gone")
    if actual > size:
        log.warning("recovery: cutting %s back from %d to %d bytes", path, actual, size)
        with open(path, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())
    header = headers[path] = read_header(path)
    if last_valid_end(path, header, size) != size:
        raise StoreError(f"{path} is corrupt before its checkpointed size {size}")
    index.truncate(table, version, size)


def delete_version(layout: DataDir, index: StoreIndex, table: TableName, version: int) -> None:
    """A version's files and its index entries (a crash may have left either)."""
    for suffix in ("avro", "avsc"):
        try:
            os.unlink(layout.table_file(table, version, suffix))
        except FileNotFoundError:
            pass
    index.drop_version(table, version)
