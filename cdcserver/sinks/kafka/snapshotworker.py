"""A big table's initial snapshot formatted in a process of its own, beside the event loop.

The service publishes on one Python thread, and a snapshot's rows cost that thread most in
reading the dump and making each row's messages (a profile of 1,000,000 rows in the Debezium
format: about two fifths of the process's time, the rest sending). A table of at least
``snapshot.WORKER_ROWS`` rows is read and made into messages
(:func:`.rowmessages.row_messages`, the router's own) by
``python -m cdcserver.sinks.kafka.snapshotworker``, which writes them to its
standard output a part at a time (``FormatJob.rows`` rows, fewer where their keys and values
pass ``PART_BYTES``); the event loop only hands them to the sender, in order, so each
partition receives what it would have. The pipe between the two holds a few parts at most:
the process waits while the sender has no room.

A format that needs the event loop for its messages (Avro with a schema registry, the
databus format's message per row event) is formatted there, as every smaller table is. The
process ending without its last part (killed, out of memory) fails the snapshot's attempt,
which the sink tries again with the same dump, as after any other failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import struct
import sys
import zoneinfo
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import IO, Any

from cdcserver.core.errors import CdcError
from cdcserver.core.names import TableName
from cdcserver.messages.formats import FORMATS
from cdcserver.sinks.kafka.dumpevents import DumpEvents, DumpReading, header
from cdcserver.sinks.kafka.rowmessages import Routed, row_messages

PART_BYTES = 4 << 20  # a part holds at most about this many bytes of keys and values
_SIZE = struct.Struct(">Q")
_EXIT_WAIT = 10.0  # seconds the process is given to exit after its last part


@dataclass(frozen=True)
class FormatJob:
    """What the formatting process needs: the dump, and the router's format and topic."""

    path: str
    database: str
    table: str
    first_table: bool
    last_table: bool
    format: str
    options: dict[str, Any]  # the format's keyword arguments, the zone by its name
    flavor: str
    partitions: int
    schema: str  # the schema's id on ``schema_topic`` ("": none)
    rows: int = 2000  # rows per part


class FormattingProcess:
    """The formatting process of one dump, as an async context: :meth:`next_part` gives the
    parts in order; leaving the context ends the process (killed if it has not)."""

    def __init__(self, job: FormatJob) -> None:
        self.job = job
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> FormattingProcess:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cdcserver.sinks.kafka.snapshotworker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(asdict(self.job)).encode())
        self.process.stdin.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()

    async def next_part(self) -> tuple[int, list[Routed]] | None:
        """The next part's messages, with the rows read so far; None after the last."""
        assert self.process is not None and self.process.stdout is not None
        try:
            size = _SIZE.unpack(await self.process.stdout.readexactly(_SIZE.size))[0]
            item = pickle.loads(await self.process.stdout.readexactly(size))
        except asyncio.IncompleteReadError:
            code = await self._exit_code()
            raise CdcError(f"the process formatting the snapshot of {self.job.database}."
                           f"{self.job.table} ended before its last rows (exit code "
                           f"{code})") from None
        if isinstance(item, str):
            raise CdcError(f"formatting the snapshot of {self.job.database}.{self.job.table} "
                           f"failed: {item}")
        return item

    async def _exit_code(self) -> int | None:
        assert self.process is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_EXIT_WAIT):
                return await self.process.wait()
        return None


def parts(job: FormatJob) -> Iterator[tuple[int, list[Routed]]]:
    """The dump's messages, ``job.rows`` rows at a time, with the rows read so far."""
    options = {**job.options, "zone": zoneinfo.ZoneInfo(job.options["zone"])}
    fmt = FORMATS[job.format](**options)
    fmt.flavor = job.flavor
    table = TableName(job.database, job.table)
    dump = DumpEvents.of(table, header(job.path), job.first_table, job.last_table)
    schema = job.schema.encode()
    reading = DumpReading(job.path)
    try:
        while (block := reading.next_rows(job.rows)) is not None:
            routed: list[Routed] = []
            size = 0
            for e in dump.events(block):
                for message in row_messages(fmt, e, job.partitions, schema, False):
                    routed.append(message)
                    size += len(message[1]) + len(message[2] or b"")
                if size >= PART_BYTES:  # (wide rows: a part's bytes bounded, not its rows)
                    yield e.event_number, routed
                    routed, size = [], 0
            if routed:
                yield dump.number, routed
    finally:
        reading.close()


def _send(out: IO[bytes], item: object) -> None:
    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_SIZE.pack(len(data)))
    out.write(data)


def main() -> int:
    """The process: the job on standard input, the parts (then None) on standard output, or
    the error's text; anything printed goes to standard error."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    job = FormatJob(**json.load(sys.stdin))
    try:
        for part in parts(job):
            _send(out, part)
        _send(out, None)
    except Exception as exc:  # noqa: BLE001 (told to the service, which tries the dump again)
        _send(out, f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        with contextlib.suppress(OSError):  # (a killed service closed the pipe)
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
