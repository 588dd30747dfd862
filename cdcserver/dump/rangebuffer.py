"""What a chunked dump's reader holds of its range before the range's turn to be appended to the
body (:mod:`cdcserver.dump.chunkreader`): rows encoded into reused blocks of memory, and pieces
of bytes, in order, moved to a temporary file past a limit.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from cdcserver.dump.partial import AREA, area, release


class Blocks:
    """The blocks that buffers encode rows into (:func:`partial.area`), reused within a
    dump, given back at its end."""

    SIZE = AREA

    def __init__(self) -> None:
        self.free: list[Any] = []
        self.lock = threading.Lock()

    def get(self) -> Any:
        with self.lock:
            if self.free:
                return self.free.pop()
        return area()

    def put(self, block: Any) -> None:
        with self.lock:
            self.free.append(block)

    def close(self) -> None:
        with self.lock:
            for block in self.free:
                release(block)
            self.free = []


class RangeBuffer:
    """What a reader reads before its range's turn (a :class:`rawrows.Sink`): rows encoded
    into blocks of memory (no copy, no reallocation) and pieces of bytes, in order; moved
    to a temporary file beside the dump past ``limit`` bytes."""

    def __init__(self, limit: int, directory: str, blocks: Blocks | None = None) -> None:
        self.limit, self.directory = limit, directory
        self.blocks = blocks if blocks is not None else Blocks()
        self.pieces: list[Any] = []  # bytes, or (block, start, end)
        self.size = 0
        self.spill: Any = None
        self.block: Any = None  # the block being encoded into: used up to fill, its bytes
        self.fill = self.mark = 0  # up to mark are in pieces
        self.taken: list[Any] = []  # blocks from self.blocks, to give back

    def tell(self) -> int:
        return self.size

    def space(self, need: int = 0) -> tuple[Any, int, int] | None:
        if self.block is None or len(self.block) - self.fill < max(need, 1):
            self._close_piece()
            if need > Blocks.SIZE:
                return None
            self.block = self.blocks.get()
            self.taken.append(self.block)
            self.fill = self.mark = 0
        return self.block, self.fill, len(self.block)

    def wrote(self, end: int) -> None:
        self.size += end - self.fill
        self.fill = end
        if self.spill is not None:  # straight through, the block used again
            with memoryview(self.block) as block, block[self.mark:end] as new:
                self.spill.write(new)
            self.fill = self.mark = 0
        elif self.size > self.limit:
            self._spill()

    def write(self, data: bytes) -> None:
        self._close_piece()
        self.size += len(data)
        if self.spill is not None:
            self.spill.write(data)
            return
        self.pieces.append(data)
        if self.size > self.limit:
            self._spill()

    def _close_piece(self) -> None:
        if self.block is not None and self.fill > self.mark:
            self.pieces.append((self.block, self.mark, self.fill))
            self.mark = self.fill

    def _views(self) -> Iterator[Any]:
        """The pieces in order (a block's piece as a memoryview, released after use)."""
        for piece in self.pieces:
            if isinstance(piece, tuple):
                block, start, end = piece
                with memoryview(block) as whole, whole[start:end] as view:
                    yield view
            else:
                yield piece

    def _spill(self) -> None:
        self._close_piece()
        self.spill = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115
        for piece in self._views():
            self.spill.write(piece)
        self.pieces = []
        self._give_back()

    def _give_back(self) -> None:
        for block in self.taken:
            self.blocks.put(block)
        self.taken = []
        self.block = None
        self.fill = self.mark = 0

    def drain(self, write: Callable[[Any], None]) -> None:
        """Everything held, in order, to ``write`` (bytes-like objects, valid only during
        the call); the buffer is empty after."""
        self._close_piece()
        if self.spill is not None:
            self.spill.seek(0)
            while data := self.spill.read(1 << 20):
                write(data)
            self.spill.close()
            self.spill = None
        for piece in self._views():
            write(piece)
        self.pieces, self.size = [], 0
        self._give_back()

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.pieces = []
        self._give_back()
