"""Sending a file to a client as it is on disk.

On a plain TCP connection the kernel copies the file to the socket (``sendfile(2)``) in a
worker thread, so no byte passes through Python and the event loop keeps serving others.
uvloop implements neither ``loop.sendfile`` nor access to the socket's writability, so the
thread waits for the socket itself (``poll``), after the transport has flushed everything
written before. On TLS connections (the bytes must be encrypted) or where the socket is not
reachable, the file is read and written in chunks through the stream, with ``drain()``
throttling it to the client's pace.

Transfers run in a pool of their own (``MAX_TRANSFERS`` threads; more wait their turn), so
slow clients can never take the threads the store's checkpoints need. A client that accepts
no byte for ``stall_timeout`` seconds loses the transfer. The thread works on duplicates of
the socket and file descriptors, and cancelling the transfer (CLOSE, the service stopping)
waits until the thread has let go of them, so the thread can never write to a descriptor
number that was closed and reused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import select
import threading
import time
from typing import BinaryIO

CHUNK = 1 << 20
POLL_MS = 200
MAX_TRANSFERS = 32

_pool = concurrent.futures.ThreadPoolExecutor(MAX_TRANSFERS, thread_name_prefix="sendfile")


class TransferStalled(TimeoutError):
    """The client accepted nothing for too long."""


async def send_file(writer: asyncio.StreamWriter, f: BinaryIO, count: int,
                    stall_timeout: float = 600.0) -> int:
    """Send ``count`` bytes of ``f`` from its start; returns the bytes sent."""
    sock = writer.get_extra_info("socket")
    if writer.get_extra_info("sslcontext") is not None or sock is None or \
            not hasattr(os, "sendfile"):
        return await _copy(writer, f, count, stall_timeout)
    await _flushed(writer)
    out_fd, in_fd = os.dup(sock.fileno()), os.dup(f.fileno())
    stop = threading.Event()
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(_pool, _sendfile, out_fd, in_fd, count, stop, stall_timeout)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        while not work.done():  # the thread stops within a poll interval
            try:
                await asyncio.wait({work})
            except asyncio.CancelledError:
                continue
        raise
    finally:
        os.close(out_fd)
        os.close(in_fd)


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


def _sendfile(out_fd: int, in_fd: int, count: int, stop: threading.Event,
              stall_timeout: float) -> int:
    poller = select.poll()
    poller.register(out_fd, select.POLLOUT)
    sent = 0
    progressed = time.monotonic()
    while sent < count:
        if stop.is_set():
            break
        try:
            n = os.sendfile(out_fd, in_fd, sent, min(CHUNK, count - sent))
        except BlockingIOError:
            if time.monotonic() - progressed > stall_timeout:
                raise TransferStalled(f"the client took nothing for {stall_timeout:.0f}s") \
                    from None
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
        progressed = time.monotonic()
    return sent


async def _copy(writer: asyncio.StreamWriter, f: BinaryIO, count: int,
                stall_timeout: float) -> int:
    sent = 0
    f.seek(0)
    while sent < count:
        data = f.read(min(CHUNK // 4, count - sent))
        if not data:
            raise OSError(f"the file ended after {sent} of {count} bytes")
        writer.write(data)
        sent += len(data)
        try:
            async with asyncio.timeout(stall_timeout):
                await writer.drain()
        except TimeoutError:
            raise TransferStalled(f"the client took nothing for {stall_timeout:.0f}s") \
                from None
    return sent
