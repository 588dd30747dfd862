"""A dump being written: ``<stem>.partial`` and its progress record ``<stem>.progress``.

The file starts with a reserved header line (spaces, then a newline) long enough for the final
header; the body (the row operations) follows. After each chunk the body is fsynced, then the
progress record is replaced atomically (write, fsync, rename): it names how many body bytes are
good, so a resumed dump truncates whatever a crash left after them. When the body is complete
the real header is written into the reserved space (JSON allows the trailing spaces), the file
is fsynced and renamed to its final name, and the directory is fsynced: a dump is either absent
or whole under its final name.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

from cdcserver.core.durable import fsync_dir
from cdcserver.core.errors import StoreError
from cdcserver.core.names import TableName
from cdcserver.store.naming import dump_stem

HEADER_SLACK = 4096
WRITE_BEHIND = 8 << 20  # bytes written between starts of their writeback to disk


@dataclass
class Progress:
    """What a crash must not lose: which snapshot the rows so far come from, the last key
    written, and how much of the body is good."""

    table: TableName
    snapshot: dict[str, Any]  # SnapshotPoint.to_json() of the snapshot the dump is now at
    fields: str  # fingerprint of the columns (a resumed dump needs the same)
    stream_version: int
    reserved: int  # bytes reserved for the header line
    key: list[str] | None = None  # hex of the last key written; None before the first chunk
    rows: int = 0
    body: int = 0  # good bytes after the header
    resumed: bool = False
    consistent: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"database": self.table.database, "table": self.table.table,
                "snapshot": self.snapshot, "fields": self.fields,
                "stream_version": self.stream_version, "reserved": self.reserved,
                "key": self.key, "rows": self.rows, "body": self.body, "resumed": self.resumed,
                "consistent": self.consistent}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        return cls(TableName(data["database"], data["table"]), data["snapshot"],
                   data["fields"], int(data["stream_version"]), int(data["reserved"]),
                   data["key"], int(data["rows"]), int(data["body"]), bool(data["resumed"]),
                   bool(data.get("consistent", True)))

    def key_values(self) -> tuple[bytes, ...] | None:
        return None if self.key is None else tuple(bytes.fromhex(v) for v in self.key)


class PartialDump:
    def __init__(self, directory: str, table: TableName) -> None:
        self.directory = directory
        self.table = table
        self.path = os.path.join(directory, f"{dump_stem(table)}.partial")
        self.progress_path = os.path.join(directory, f"{dump_stem(table)}.progress")
        self._file: Any = None
        self._hash = hashlib.sha256()
        self.progress: Progress | None = None
        self._written_back = 0  # the file's bytes whose writeback was started

    # -- starting --------------------------------------------------------------------------

    def load_progress(self) -> Progress | None:
        try:
            with open(self.progress_path, encoding="utf-8") as f:
                return Progress.from_json(json.load(f))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError) as exc:
            raise StoreError(f"{self.progress_path} is damaged ({exc}); delete it and the "
                             ".partial file to start the dump over") from exc

    def create(self, progress: Progress) -> None:
        """Start a new body (discarding any earlier attempt)."""
        os.makedirs(self.directory, exist_ok=True)
        self.discard()
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by finish/close
        self._file.write(b" " * (progress.reserved - 1) + b"\n")
        self._hash = hashlib.sha256()
        self._written_back = 0
        self.progress = progress
        self.checkpoint()

    def reopen(self, progress: Progress) -> None:
        """Continue a body after a crash: drop what follows the good bytes, re-hash the rest."""
        self._file = open(self.path, "r+b")  # noqa: SIM115
        self._file.truncate(progress.reserved + progress.body)
        self._file.seek(progress.reserved)
        self._written_back = progress.reserved + progress.body
        self._hash = hashlib.sha256()
        remaining = progress.body
        while remaining:
            data = self._file.read(min(remaining, 1 << 20))
            if not data:
                raise StoreError(f"{self.path} is shorter than its progress record says")
            self._hash.update(data)
            remaining -= len(data)
        self.progress = progress

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.progress is not None
        self._file.write(data)
        self._hash.update(data)
        self.progress.body += len(data)
        if self.size - self._written_back >= WRITE_BEHIND:
            self._write_behind()

    def _write_behind(self) -> None:
        """Start writing the body written since the last call to disk, without waiting
        (Linux starts the writeback of a range's dirty pages on POSIX_FADV_DONTNEED, and
        drops only pages already clean): the fsync that makes the dump durable then has
        little left to wait for, instead of the whole body at the end."""
        end = self.size
        self._file.flush()
        with contextlib.suppress(OSError, AttributeError):  # not Linux: fsync does it all
            os.posix_fadvise(self._file.fileno(), self._written_back,
                             end - self._written_back, os.POSIX_FADV_DONTNEED)
        self._written_back = end

    @property
    def progress_reserved(self) -> int:
        """Where the body starts: the room reserved for the header."""
        assert self.progress is not None
        return self.progress.reserved

    @property
    def size(self) -> int:
        """The file's length so far: the reserved header and the body."""
        assert self.progress is not None
        return self.progress.reserved + self.progress.body

    def sync(self) -> None:
        """Make the body so far durable, without recording it (a caller keeping its own
        record of the body, as a chunked dump does)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def checkpoint(self) -> None:
        """Make the body so far durable, then record it."""
        assert self.progress is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        temporary = self.progress_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(self.progress.to_json(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.progress_path)
        fsync_dir(self.directory)

    def finish(self, header: dict[str, Any], name: str) -> str:
        """Write the header, give the file its final name; returns the final path."""
        assert self.progress is not None
        header = {**header, "checksum": "sha256:" + self._hash.hexdigest()}
        line = json.dumps(header, separators=(",", ":")).encode("utf-8")
        final = os.path.join(self.directory, name)
        self._file.flush()
        if len(line) < self.progress.reserved:
            self._file.seek(0)
            self._file.write(line + b" " * (self.progress.reserved - 1 - len(line)) + b"\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self.path, final)
        else:
            self._rewrite(line, final)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.progress_path)
        fsync_dir(self.directory)
        return final

    def _rewrite(self, line: bytes, final: str) -> None:
        """The header outgrew its reserved space (a resumed dump's GTID state gained many
        domains): copy the body behind a new header."""
        assert self.progress is not None
        temporary = final + ".tmp"
        with open(temporary, "wb") as out:
            out.write(line + b"\n")
            self._file.seek(self.progress.reserved)
            shutil.copyfileobj(self._file, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        self._file = None
        os.replace(temporary, final)
        os.unlink(self.path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Remove this table's unfinished attempt, and what a crash in ``finish`` left."""
        self.close()
        leftovers = glob.glob(os.path.join(glob.escape(self.directory),
                                           f"{glob.escape(dump_stem(self.table))}.*.dump.tmp"))
        for path in (self.path, self.progress_path, self.progress_path + ".tmp", *leftovers):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
