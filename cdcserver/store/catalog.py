"""What readers may see: each table's versions, their committed sizes, and change wake-ups.

The writer publishes into the catalog only at transaction commit, so a reader never sees part
of a transaction: a new version appears, and a version's ``committed`` size grows, only after
the transaction's blocks are written. Waiting sessions are woken by a future per table that is
resolved on each commit touching the table (no polling); one wake-up serves every session
tailing that table.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache

from cdcserver.core.gtid import Gtid
from cdcserver.core.names import TableName
from cdcserver.store.avrofile import Header, read_header
from cdcserver.store.checkpoint import Quarantined
from cdcserver.store.naming import parse_version_file
from cdcserver.store.schema import TableSchema

SCHEMAS_KEPT = 1024  # sealed versions' schemas kept at once (text and parsed: ~60 KB each)


@dataclass(frozen=True, slots=True)
class VersionDdl:
    """What readers walking every version of a table need from each one's schema: when it
    was made and by which statement (kept, small, where the schema itself is not)."""

    gtid: str
    kind: str | None
    renamed_from: TableName | None
    renamed_to: TableName | None
    renamed_columns: dict[str, str]

    @classmethod
    def of(cls, schema: TableSchema) -> VersionDdl:
        ddl = schema.avsc.get("ddl") or {}
        return cls(schema.gtid, ddl.get("kind"), _named(ddl.get("renamed_from")),
                   _named(ddl.get("renamed_to")), ddl.get("renamed_columns") or {})


def _named(ref: str | None) -> TableName | None:
    return TableName.from_ref(ref) if ref else None


@dataclass
class VersionInfo:
    """A stored version. Its schema (text and parsed) is kept while it is the latest version
    of a table that exists; a sealed version, or one a ``DROP`` or a rename away made, reads
    it again from the file's header when asked for, a thousand at a time: a store of 20,000
    versions (a migration tool's ALTERs) kept 2 GB of them, and a soak's 2,600 tables
    renamed away one each."""

    table: TableName
    version: int
    parsed: TableSchema | None  # None: read from the header when first asked for (schema)
    path: str
    header: Header  # without the schema's text (schema_json)
    committed: int
    sealed: bool = False  # a newer version exists: this file will not grow again
    # Blocks holding a repair's records (offset -> why): records the binlog did not carry.
    notes: dict[int, str] = field(default_factory=dict)
    text: str | None = field(default=None, repr=False)  # the schema's, while it is kept
    _ddl: VersionDdl | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.header.schema_json:
            if self.text is None and self.parsed is not None:  # a version just made
                self.text = self.header.schema_json
            self.header = replace(self.header, schema_json="")
        if self.parsed is not None and self._ddl is None:
            self._ddl = VersionDdl.of(self.parsed)
        if not self._kept:
            self.parsed = self.text = None

    def seal(self) -> None:
        """A newer version exists: this one's file will not grow, and its schema is read
        again when asked for."""
        self.sealed = True  # (its ddl is known: read with the schema it kept)
        self.parsed = self.text = None

    @property
    def _kept(self) -> bool:
        """Whether the schema stays in memory once read: the latest version of a table that
        exists (as far as this version knows: its ``ddl`` once read)."""
        return not self.sealed and (self._ddl is None or self._ddl.kind != "drop")

    @property
    def schema(self) -> TableSchema:
        """The version's schema. A store opened with thousands of versions (a migration
        tool's ALTERs) parses each when first used, not all at the start: the soak's
        14,000 took 45 s, on every restart."""
        if self.parsed is not None:
            return self.parsed
        if not self._kept:
            return _stored_schema(self.path, self.header.sync)
        schema = TableSchema.from_avsc(_json(self.schema_json))
        if self._ddl is None:
            self._ddl = VersionDdl.of(schema)
        if self._kept:
            self.parsed = schema
        else:
            self.text = None
        return schema

    @property
    def schema_json(self) -> str:
        """The schema's text, as the file's header holds it."""
        if self.text is not None:
            return self.text
        text = _stored_text(self.path, self.header.sync)
        if self._kept:
            self.text = text
        return text

    @property
    def ddl(self) -> VersionDdl:
        if self._ddl is None:
            self._ddl = VersionDdl.of(self.schema)
        return self._ddl


@lru_cache(maxsize=SCHEMAS_KEPT)
def _stored_text(path: str, sync: bytes) -> str:
    """A version's schema text from its file (``sync``, random per file, tells it from a
    file a rolled-back version left at the same path)."""
    return read_header(path).schema_json


@lru_cache(maxsize=SCHEMAS_KEPT)
def _stored_schema(path: str, sync: bytes) -> TableSchema:
    return TableSchema.from_avsc(_json(_stored_text(path, sync)))


@dataclass
class TableEntry:
    name: TableName
    versions: dict[int, VersionInfo] = field(default_factory=dict)
    _waiter: asyncio.Future[None] | None = None

    def latest(self) -> VersionInfo | None:
        return self.versions[max(self.versions)] if self.versions else None

    def first(self) -> VersionInfo | None:
        return self.versions[min(self.versions)] if self.versions else None

    def after(self, version: int) -> VersionInfo | None:
        later = [v for v in self.versions if v > version]
        return self.versions[min(later)] if later else None

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next commit that touches this table."""
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def notify(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Catalog:
    def __init__(self, avro_dir: str) -> None:
        self.avro_dir = avro_dir
        self.tables: dict[TableName, TableEntry] = {}
        self._appeared: asyncio.Future[None] | None = None
        # Tables whose newest version or its committed size changed since the store's last
        # checkpoint: the checkpoint writes these, not every table's mark.
        self.changed: set[TableName] = set()
        # Tables whose stream stopped (the store's checkpoint keeps them); readers end there
        self.quarantined: dict[TableName, Quarantined] = {}
        self._quarantine_changed: asyncio.Future[None] | None = None

    def quarantine(self, name: TableName, why: Quarantined | None) -> None:
        """Stop (``why``) or resume (None) a table's stream, and wake its readers."""
        if why is None:
            self.quarantined.pop(name, None)
        else:
            self.quarantined[name] = why
        entry = self.tables.get(name)
        if entry is not None:
            entry.notify()
        waiter, self._quarantine_changed = self._quarantine_changed, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def quarantine_changed(self) -> asyncio.Future[None]:
        """A future resolved when a table is quarantined or released (shared: shield it)."""
        if self._quarantine_changed is None or self._quarantine_changed.done():
            self._quarantine_changed = asyncio.get_running_loop().create_future()
        return self._quarantine_changed

    def get(self, name: TableName) -> TableEntry | None:
        return self.tables.get(name)

    def entry(self, name: TableName) -> TableEntry:
        entry = self.tables.get(name)
        if entry is None:
            entry = self.tables[name] = TableEntry(name)
        return entry

    def publish(self, info: VersionInfo) -> None:
        """Make a new version visible and seal the one before it."""
        entry = self.entry(info.table)
        previous = entry.latest()
        if previous is not None:
            previous.seal()
        entry.versions[info.version] = info
        self.changed.add(info.table)
        if previous is None and self._appeared is not None:
            appeared, self._appeared = self._appeared, None
            if not appeared.done():
                appeared.set_result(None)

    def table_appeared(self) -> asyncio.Future[None]:
        """A future resolved when a table gets its first version (shared: shield it)."""
        if self._appeared is None or self._appeared.done():
            self._appeared = asyncio.get_running_loop().create_future()
        return self._appeared

    def version_created_by(self, database: str, table: str, gtid: str) -> int | None:
        """The version of a table current right after the transaction ``gtid``: the newest
        whose schema was created at or before it (versions are kept across restarts, so a
        replay finds the same)."""
        entry = self.get(TableName(database, table))
        if entry is None or not entry.versions:
            return None
        target = Gtid.parse(gtid)

        def at_or_before(created: str) -> bool:
            try:
                g = Gtid.parse(created)
            except ValueError:
                return True  # a version without a GTID (from a dump): the oldest kind
            return g.key != target.key or g.sequence <= target.sequence

        versions = [v for v, info in entry.versions.items() if at_or_before(info.ddl.gtid)]
        return max(versions) if versions else None

    def remove_version(self, name: TableName, version: int) -> None:
        entry = self.tables.get(name)
        if entry is not None:
            entry.versions.pop(version, None)
            self.changed.add(name)
            if not entry.versions:
                del self.tables[name]

    def notify(self, names: set[TableName] | list[TableName]) -> None:
        for name in names:
            entry = self.tables.get(name)
            if entry is not None:
                entry.notify()

    def load(self, headers: dict[str, Header] | None = None) -> None:
        """Build the catalog from the files on disk (after the store's recovery, which
        passes the ``headers`` it read already, by path)."""
        known = headers or {}
        self.tables.clear()
        for file_name in sorted(os.listdir(self.avro_dir)):
            parsed = parse_version_file(file_name)
            if parsed is None or parsed[2] != "avro":
                continue
            named, version, _ = parsed
            path = os.path.join(self.avro_dir, file_name)
            header = known.get(path) or read_header(path)
            schema: TableSchema | None = None
            if named is None:  # the schema names the table a shortened file name does not
                schema = TableSchema.from_avsc(_json(header.schema_json))
                named = schema.table
            self.publish(VersionInfo(named, version, schema, path, header,
                                     os.path.getsize(path)))
        self.changed.clear()  # as the checkpoint the store recovered to says


def _json(text: str) -> dict[str, object]:
    import json

    data: dict[str, object] = json.loads(text)
    return data
