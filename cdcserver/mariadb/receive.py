"""Reading a pymysql connection's socket in large pieces, past pymysql's packet reader.

The dump's row reader and the replication connection parse MySQL packets where they lie in
one buffer of their own; this fills it.
"""

from __future__ import annotations

from typing import Any


def receive_into(conn: Any, buffer: bytearray, start: int, first: bool) -> int:
    """Read what the connection has into ``buffer[start:]``; the bytes read (0: closed).
    The ``first`` read takes what pymysql's reader holds (``BufferedReader.read1`` returns
    it without reading the socket, else reads the socket once: either way nothing is left
    in it afterwards); the others go straight from the socket into the buffer.

    Waits at most the connection's ``read_timeout`` (pymysql applies it only in its own
    reader, which this one bypasses): past it, TimeoutError. That is how a source gone
    silent (a partition, a half-open connection, a host that died) is noticed at all."""
    sock, timeout = conn._sock, conn._read_timeout
    if sock.gettimeout() != timeout:  # pymysql's last write left its write_timeout (None)
        sock.settimeout(timeout)
        conn._current_timeout = timeout  # pymysql's note of it
    if first:
        data = conn._rfile.read1(len(buffer) - start)
        buffer[start:start + len(data)] = data
        return len(data)
    with memoryview(buffer) as view, view[start:] as free:
        got: int = conn._sock.recv_into(free)
        return got
