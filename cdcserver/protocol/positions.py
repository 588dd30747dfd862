"""Where a stream stands, told as an operator reads it (the admin API): the GTID of the last
transaction sent, and the records a version file holds.

A stream sends whole blocks, so its offset is a block boundary; the transaction sent last is
the last record of the block that ends there. The store's GTID index is sparse (an entry per
``spacing`` bytes), so the block is found by scanning forward from the nearest indexed block
before it: at most ``spacing`` bytes of block headers, then one block's metadata. Answers are
cached by file and offset: the clients tailing a table stand at the same offset, and a
console asks every two seconds.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from cdcserver.core.errors import StoreError
from cdcserver.protocol.render import metadata_slices
from cdcserver.store.avrofile import scan_blocks
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.index import StoreIndex

CACHED = 4096  # (file, offset) answers kept


@dataclass
class _Counted:
    """The records of a version file's blocks up to ``end`` (it only grows, until a resync
    or retention replaces the file: a new file has a new sync marker)."""

    sync: bytes
    end: int
    records: int


class Positions:
    def __init__(self) -> None:
        self._gtids: OrderedDict[tuple[str, bytes, int], str | None] = OrderedDict()
        self._counts: dict[str, _Counted] = {}
        self._lock = threading.Lock()  # asked from worker threads

    def gtid_at(self, index: StoreIndex | None, info: VersionInfo, offset: int) -> str | None:
        """The GTID of the last record before ``offset`` in the version (None before the
        first record, or when the file cannot be read now)."""
        if offset <= info.header.size:
            return None
        key = (info.path, info.header.sync, offset)
        with self._lock:
            if key in self._gtids:
                self._gtids.move_to_end(key)
                return self._gtids[key]
        found = _last_gtid(index, info, offset)
        with self._lock:
            self._gtids[key] = found
            while len(self._gtids) > CACHED:
                self._gtids.popitem(last=False)
        return found

    def records(self, info: VersionInfo) -> int | None:
        """The records the version holds up to its committed end (None: it cannot be read
        now, e.g. retention deleted it meanwhile)."""
        end = info.committed
        with self._lock:
            counted = self._counts.get(info.path)
        if counted is None or counted.sync != info.header.sync or counted.end > end:
            counted = _Counted(info.header.sync, info.header.size, 0)
        try:
            for block in scan_blocks(info.path, info.header, counted.end, end):
                counted.records += block.count
                counted.end = block.end
        except (OSError, StoreError):
            return None
        with self._lock:
            self._counts[info.path] = counted
        return counted.records

    def forget(self, paths: set[str]) -> None:
        """Drop what is kept of files that are no longer versions."""
        with self._lock:
            for path in [p for p in self._counts if p not in paths]:
                del self._counts[path]


def _last_gtid(index: StoreIndex | None, info: VersionInfo, offset: int) -> str | None:
    start = info.header.size
    if index is not None:
        start = index.block_before(info.table, info.version, offset) or start
    last = None
    try:
        for block in scan_blocks(info.path, info.header, start, offset):
            last = block
        if last is None:
            return None
        records = metadata_slices(info, last)
    except (OSError, StoreError, ValueError):
        return None
    if not records:
        return None
    record = records[-1][0]
    return f"{record['domain']}-{record['server_id']}-{record['sequence']}"
