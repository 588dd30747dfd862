"""Sending a file to a client as it is on disk.

On a plain TCP connection the kernel copies the file to the socket (``sendfile(2)``) in a
worker thread, so no byte passes through Python and the event loop keeps serving others.
uvloop implements neither ``loop.sendfile`` nor access to the socket's writability, so the
thread waits for the socket itself (``poll``), after the transport has flushed everything
written before. On TLS connections (the bytes must be encrypted) or where the socket is not
reachable, the file is read and written in chunks through the stream, with ``drain()``
throttling it to the client's pace.

Cancelling the transfer (the client said CLOSE, the service is stopping) stops the thread
within a poll interval and waits for it, so the socket is never used after the caller goes
on to close it.
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
from typing import BinaryIO

CHUNK = 1 << 20
POLL_MS = 200


async def send_file(writer: asyncio.StreamWriter, f: BinaryIO, count: int) -> int:
    """Send ``count`` bytes of ``f`` from its start; returns the bytes sent."""
    sock = writer.get_extra_info("socket")
    if writer.get_extra_info("sslcontext") is not None or sock is None or \
            not hasattr(os, "sendfile"):
        return await _copy(writer, f, count)
    await _flushed(writer)
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(_sendfile, sock.fileno(), f.fileno(),
                                                   count, stop))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        try:
            await work
        except (ConnectionError, OSError):
            pass
        raise


async def _flushed(writer: asyncio.StreamWriter) -> None:
    """Wait until the transport has sent everything written to it."""
    transport = writer.transport
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0)
    try:
        while transport.get_write_buffer_size():
            await writer.drain()
    finally:
        transport.set_write_buffer_limits(high=high, low=low)


def _sendfile(out_fd: int, in_fd: int, count: int, stop: threading.Event) -> int:
    poller = select.poll()
    poller.register(out_fd, select.POLLOUT)
    sent = 0
    while sent < count:
        if stop.is_set():
            break
        try:
            n = os.sendfile(out_fd, in_fd, sent, min(CHUNK, count - sent))
        except BlockingIOError:
            events = poller.poll(POLL_MS)
            if any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events):
                raise ConnectionResetError("the client went away during the transfer") \
                    from None
            continue
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ConnectionResetError(f"the client went away during the transfer: {exc}"
                                       ) from None
        if n == 0:
            raise OSError(f"the file ended after {sent} of {count} bytes")
        sent += n
    return sent


async def _copy(writer: asyncio.StreamWriter, f: BinaryIO, count: int) -> int:
    sent = 0
    f.seek(0)
    while sent < count:
        data = f.read(min(CHUNK // 4, count - sent))
        if not data:
            raise OSError(f"the file ended after {sent} of {count} bytes")
        writer.write(data)
        sent += len(data)
        await writer.drain()
    return sent
