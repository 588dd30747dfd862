"""Reading a dump as a consumer does: saving one to disk as it arrives, reading a dump file
from disk, and applying its operations to a table held in memory. The format itself (header,
operations, values) is :mod:`mariadb_cdc_client.format.dump`, which the service shares."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from mariadb_cdc_client.format.dump import (
    DumpDecoder,
    DumpError,
    DumpHeader,
    DumpRows,
    decode_value,
)

__all__ = ["DumpDecoder", "DumpError", "DumpHeader", "DumpRows", "SavedDump", "apply",
           "decode_value", "read_dump"]


class SavedDump:
    """A dump being saved to ``path`` as its pieces arrive, checked as it goes: written to
    ``path.part`` and renamed to ``path`` only once whole with its checksum matching, so
    ``path`` never holds part of a dump or a corrupt one; on any failure ``path.part`` is
    removed. A ``path`` that exists and is not a regular file (``/dev/null``, a pipe) is
    written to as it is. Use it as a context manager: leaving it by an exception abandons
    the dump."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._in_place = os.path.exists(path) and not os.path.isfile(path)
        self._written = path if self._in_place else f"{path}.part"
        self._decoder = DumpDecoder()
        self._out = open(self._written, "wb")  # noqa: SIM115 - closed by finish() or abandon()

    @property
    def received(self) -> int:
        """The dump's bytes received so far."""
        return self._decoder.received

    def write(self, data: bytes) -> None:
        """Save the dump's next piece (and check it)."""
        self._out.write(data)
        for _ in self._decoder.feed(data):
            pass

    def finish(self) -> DumpHeader:
        """The dump's header, once it is whole and its checksum matches; ``path`` is the
        dump then. A dump cut short or corrupt raises :class:`DumpError` and is abandoned."""
        try:
            header = self._decoder.finish()
            self._out.close()  # (a write the disk refuses may come only now)
        except BaseException:
            self.abandon()
            raise
        if not self._in_place:
            os.replace(self._written, self.path)
        return header

    def abandon(self) -> None:
        """Stop saving: ``path.part`` is removed, ``path`` left as it was."""
        self._out.close()
        if not self._in_place:
            with contextlib.suppress(OSError):
                os.unlink(self._written)

    def __enter__(self) -> SavedDump:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None:
            self.abandon()


def read_dump(path: str) -> Iterator[DumpHeader | DumpRows]:
    """A dump file's header, then its operations; checks the checksum at the end."""
    decoder = DumpDecoder()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            yield from decoder.feed(data)
    decoder.finish()


def apply(rows: dict[tuple[Any, ...], dict[str, Any]], key: list[str], op: DumpRows) -> None:
    """Apply an operation to a table held as {primary key: row} (upsert semantics). A table
    without a primary key (``key`` empty) is keyed by whole rows, so identical rows count
    once: keep such a table's dump rows as a list instead."""
    def pk(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in key) if key else tuple(row.values())

    if op.action == "insert":
        for row in op.rows:
            rows[pk(row)] = row
    elif op.action == "delete":
        for row in op.rows:
            rows.pop(pk(row), None)
    elif op.action == "update":
        for before, after in zip(op.rows[0::2], op.rows[1::2], strict=True):
            rows.pop(pk(before), None)
            rows[pk(after)] = after
    else:
        raise ValueError(f"unknown dump action {op.action!r}")
