"""Child processes that end with the one that started them.

Linux's parent-death signal: a child that asks for it gets SIGKILL when the thread that
started it ends, however it ends (``kill -9`` included), so a killed service or test leaves
no MariaDB, broker or repair process behind. Elsewhere the request does nothing.
"""

from __future__ import annotations

import contextlib
import signal

_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (in a child: between fork
    and exec as a ``preexec_fn``, or first thing in a spawned process)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
