"""Memory per phase for bench_peers.py (issue 53): each tool's resident set sampled while it
runs, the peak taken within each phase's window.

``VmHWM`` is a process's peak over its whole life: it cannot tell a start-up peak from a
streaming one. So a thread reads ``VmRSS`` of the tool's process and of every process below it
(``/proc/<pid>/task/*/children``, recursively: the service's helpers, if it starts any; the
JVM's whole process for Debezium's Connect worker) every :data:`PERIOD` seconds, and a
phase's peak is the largest sum seen within its window (``time.monotonic()``). A peak shorter
than the period can be missed: the figures are a lower bound of the true peak, the same for
both tools. The phases: ``start-up`` (the process's start to the first change in Kafka),
``streaming`` (to the last change), and where those run ``latency`` (the whole time a tool
runs for bench/peers_latency.py, warm-up included) and ``snapshot``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator

PERIOD = 0.05  # seconds between samples (issue 53: 50-100 ms)
MEMORY_GOAL = 0.25  # issue 53: the service's memory at most a quarter of Debezium's


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children..., as /proc tells them now (none for a process
    that is gone)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


def rss_kb(pid: int) -> int:
    """``VmRSS`` of ``pid`` in kB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for row in f:
                if row.startswith("VmRSS:"):
                    return int(row.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(pid: int) -> int:
    """The resident set of ``pid`` and all its descendants, in kB."""
    return sum(rss_kb(p) for p in (pid, *descendants(pid)))


class Sampler:
    """``tree_rss_kb(pid)`` every :data:`PERIOD` seconds in a thread, from :meth:`start` to
    :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), kB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), tree_rss_kb(self.pid)))
            if self._stop.wait(PERIOD):
                return

    def peak_mb(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        """The largest sample within [start, end], in MB (a window shorter than the period
        with no sample in it: the sample nearest to it; nan without any)."""
        samples = list(self.samples)
        inside = [kb for t, kb in samples if start <= t <= end]
        if inside:
            return max(inside) / 1024
        if not samples:
            return float("nan")
        middle = (start + end) / 2 if end != float("inf") else start
        return min(samples, key=lambda s: abs(s[0] - middle))[1] / 1024


@contextlib.contextmanager
def sampling(pid: int) -> Iterator[Sampler]:
    sampler = Sampler(pid).start()
    try:
        yield sampler
    finally:
        sampler.stop()


@dataclasses.dataclass
class Peaks:
    """Each (tool, phase)'s peak RSS in MB, in the order recorded."""

    mb: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def record(self, tool: str, phase: str, mb: float) -> None:
        self.mb[(tool, phase)] = max(mb, self.mb.get((tool, phase), float("-inf")))

    @contextlib.contextmanager
    def phase(self, tool: str, phase: str, pid: int) -> Iterator[Sampler]:
        """The peak of ``pid``'s tree while inside, recorded as ``tool``'s ``phase``."""
        with sampling(pid) as sampler:
            try:
                yield sampler
            finally:
                self.record(tool, phase, sampler.peak_mb())

    def phases(self) -> list[str]:
        return list(dict.fromkeys(p for _, p in self.mb))


def report(peaks: Peaks, ours: str, theirs: str, title: str = "") -> dict[str, bool]:
    """Per phase: each tool's peak RSS and the ratio, beside the goal; returns the goal met or
    not per phase (phases only one tool has are printed, without a ratio)."""
    from bench.common import line
    from bench.peers_tools import ratio

    label = f"peak RSS per phase{f' ({title})' if title else ''}"
    line(label, f"VmRSS of the process tree every {PERIOD * 1000:.0f} ms, max per phase")
    print(f"{'phase':<12} {ours + ' MB':>14} {theirs + ' MB':>14} {'ratio':>7}  goal <= "
          f"{MEMORY_GOAL:g}", flush=True)
    goals = {}
    for phase in peaks.phases():
        a = peaks.mb.get((ours, phase), float("nan"))
        b = peaks.mb.get((theirs, phase), float("nan"))
        r = ratio(a, b)
        met = r <= MEMORY_GOAL  # False for nan
        goals[phase] = met
        print(f"{phase:<12} {a:>14.0f} {b:>14.0f} {r:>7.2f}  {'met' if met else 'not met'}",
              flush=True)
    return goals


def record_streaming(peaks: Peaks | None, tool: str, sampler: Sampler, started: float,
                     startup: float, streaming: float) -> None:
    """The throughput part's phases from ``sampler``: ``start-up`` from ``started`` (the
    process's start) for ``startup`` seconds, then ``streaming`` for ``streaming`` seconds."""
    if peaks is None:
        return
    first = started + startup
    peaks.record(tool, "start-up", sampler.peak_mb(started, first))
    peaks.record(tool, "streaming", sampler.peak_mb(first, first + streaming))
