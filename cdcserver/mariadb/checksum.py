"""The binlog's event checksum (CRC-32, zlib's polynomial), as fast as the machine allows.

Every event is checked as it is read: with the standard library's CRC (about 3 GB/s here) that
was 40% of the replication thread's time. zlib-ng's uses the CPU's carry-less multiply (about
48 GB/s here, ``bench/bench_router.py``). Both release the GIL for buffers over 5 KiB and then
wait up to the switch interval to get it back from the event loop, so an event is checked in
pieces below that, the running CRC carried from one to the next (binascii's never releases it,
and is the fallback).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable

PIECE = 4096  # below the 5 KiB past which the CRC functions release the GIL

_crc: Callable[[memoryview, int], int] = binascii.crc32
try:
    from zlib_ng.zlib_ng import crc32 as _crc
except ImportError:  # pragma: no cover - zlib-ng is a dependency; a broken install falls back
    pass


def crc32(data: memoryview) -> int:
    """The CRC-32 of ``data``."""
    value = 0
    for start in range(0, len(data), PIECE):
        value = _crc(data[start:start + PIECE], value)
    return value
