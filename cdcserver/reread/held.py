"""A table's changes held back while its repair reads beside the stream.

While a whole table is repaired beside the stream (:mod:`.beside`), the stream's changes to
that table after the change being repaired wait here, in a file, instead of going to the
sinks: the table's consumers must get the repair first, so that the before-image of every
later change is the row they hold (a change made after a rewriting ALTER carries the rewritten
row as its before-image; a consumer that has not had the repair holds the old one). Every
other table streams meanwhile; this one waits alone.

Once the repair's records are out, the changes the source's read already holds (those at or
before its watermark) are dropped, since the records brought the table to the source's rows
there, and the others go on in their order, a share at a time, while the table's new changes
join the end of the line, until none waits. A repair called off (a schema statement on the
table, its failure, the table quarantined) drops what it held: no consumer got those changes,
and the table's next read (the repair again, after the statement; the pipeline's own; a
resync) is at a later watermark, so its records bring them.

Only the file's name and counts are in memory: a share at a time is read back. The file
goes with the repair's (``state/`` scratch files: a start removes a killed service's).
"""

from __future__ import annotations

import contextlib
import os
import pickle
from dataclasses import replace

from cdcserver.core.changes import Rows


class HeldChanges:
    """Row changes waiting, in order, in a file of their own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows = 0  # rows waiting
        self.held = 0  # rows held in all (for the log)
        self._entries = 0  # Rows waiting
        self._writer = open(path, "wb")  # noqa: SIM115 - open while the repair lasts
        self._read_at = 0
        # the open transaction's: where its changes start in the file, and how many
        self._begun_at = self._begun_entries = self._begun_rows = 0

    def __bool__(self) -> bool:
        return self._entries > 0

    def begin(self) -> None:
        """A source transaction begins: the changes held from here on are its own, until
        the next one (:meth:`roll_back`)."""
        self._begun_at = self._writer.tell()
        self._begun_entries = self._begun_rows = 0

    def roll_back(self) -> None:
        """The open transaction was discarded (``Abort``: the stream reads it again, from a
        reconnect or because the binlog rolled part of it back): the changes it held go,
        or they would be given twice, or given though rolled back. (Held changes are read
        back only at a commit, so none of them was.)"""
        if not self._begun_entries:
            return
        self._writer.flush()
        self._writer.truncate(self._begun_at)
        self._writer.seek(self._begun_at)
        self._entries -= self._begun_entries
        self.rows -= self._begun_rows
        self.held -= self._begun_rows
        self._begun_entries = self._begun_rows = 0

    def add(self, rows: Rows) -> None:
        """Hold ``rows`` (decoded: the images they may point into are not kept)."""
        plain = replace(rows, rows=list(rows.rows), images=None)
        pickle.dump(plain, self._writer, protocol=pickle.HIGHEST_PROTOCOL)
        self._begun_entries += 1
        self._begun_rows += len(plain.rows)
        self._entries += 1
        self.rows += len(plain.rows)
        self.held += len(plain.rows)

    def take(self, limit: int) -> list[Rows]:
        """The oldest changes waiting, about ``limit`` rows of them (at a commit: the
        open transaction's can no longer be rolled back)."""
        self._writer.flush()
        self._begun_at, self._begun_entries, self._begun_rows = self._writer.tell(), 0, 0
        taken: list[Rows] = []
        count = 0
        with open(self.path, "rb") as reader:
            reader.seek(self._read_at)
            while self._entries and count < limit:
                rows: Rows = pickle.load(reader)
                self._read_at = reader.tell()
                self._entries -= 1
                self.rows -= len(rows.rows)
                count += len(rows.rows)
                taken.append(rows)
        return taken

    def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
