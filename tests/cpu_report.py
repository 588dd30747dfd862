"""``-p tests.cpu_report``: the CPU time each test costs, beside its wall time.

The suite's wall time on two cores is bounded below by the CPU all its workers spend, so the
tests to make cheaper are the ones that cost CPU, not the ones that wait. A test's CPU is
its worker's own, its children's that exited (subprocesses waited for), and the growth of
every process still running below the worker (the worker's MariaDB, a Spark JVM, a broker),
read from ``/proc``. Written per worker as tab-separated lines to ``$CDC_CPU_REPORT``
(default ``cpu-report.tsv``): seconds of CPU, of wall time, and the test::

    bash tests/run.sh -p tests.cpu_report
    sort -rn cpu-report.tsv | head -30
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu(root: int) -> dict[int, float]:
    """CPU seconds (user + system) of every process below ``root``, by pid."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        spent[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICKS
    below: dict[int, float] = {}
    for pid in spent:
        up = parents.get(pid)
        while up is not None and up > 1:
            if up == root:
                below[pid] = spent[pid]
                break
            up = parents.get(up)
    return below


def _own_cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before, started = _descendants_cpu(os.getpid()), time.monotonic()
    own = _own_cpu()
    yield
    after = _descendants_cpu(os.getpid())
    spent = _own_cpu() - own + sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    path = os.environ.get("CDC_CPU_REPORT", "cpu-report.tsv")
    with open(path, "a") as f:
        f.write(f"{spent:.1f}\t{time.monotonic() - started:.1f}\t{item.nodeid}\n")
