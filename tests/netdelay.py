"""A slow, reordering link without ``netem``: every packet the kernel queues to NFQUEUE
``--queue`` is let through ``--delay-ms`` later, give or take ``--jitter-ms`` (drawn at
random, so packets close together overtake each other), and ``--reorder`` percent of them
at once, overtaking the ones held (netem's own model of reordering).

The kernel of these machines has no ``netem`` qdisc, and nftables no ``queue`` expression;
iptables' ``NFQUEUE`` target is there, and NetfilterQueue (libnetfilter_queue's Python
binding) receives what it queues: :meth:`tests.netfault.Host.slow` runs this script inside
the host's namespace, then adds the rules. Verdicts may be given in any order and after the
callback returned, which is what holding a packet takes.

Prints ``ready`` once the queue is bound; on SIGTERM lets every held packet through at once
(packets still queued when a listener goes away would be dropped), prints how many passed
and how many of them were overtaken by a later one, and exits."""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import select
import signal
import sys
import time
from typing import Any

from netfilterqueue import COPY_META, NetfilterQueue

QUEUE_LENGTH = 65536  # packets held at once before the kernel drops more


class Delayer:
    def __init__(self, delay: float, jitter: float, reorder: float, seed: int) -> None:
        self.delay, self.jitter, self.reorder = delay, jitter, reorder
        self.random = random.Random(seed)
        self.held: list[tuple[float, int, Any]] = []  # (due, arrival number, packet)
        self.numbers = itertools.count()
        self.passed = 0
        self.overtaken = 0  # packets let through after one that arrived later
        self._latest = -1  # the arrival number of the latest packet let through

    def arrived(self, packet: Any) -> None:
        number = next(self.numbers)
        if self.random.random() < self.reorder:
            self._let_through(number, packet)
            return
        wait = max(0.0, self.delay + self.random.uniform(-self.jitter, self.jitter))
        heapq.heappush(self.held, (time.monotonic() + wait, number, packet))

    def let_due_through(self) -> float | None:
        """Seconds until the next packet is due (None: none is held)."""
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            _, number, packet = heapq.heappop(self.held)
            self._let_through(number, packet)
        return self.held[0][0] - now if self.held else None

    def let_all_through(self) -> None:
        for _, number, packet in sorted(self.held):
            self._let_through(number, packet)
        self.held.clear()

    def _let_through(self, number: int, packet: Any) -> None:
        packet.accept()
        self.passed += 1
        if number < self._latest:
            self.overtaken += 1
        self._latest = max(self._latest, number)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reorder", type=float, default=0.0, help="percent let through at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    delayer = Delayer(args.delay_ms / 1000, args.jitter_ms / 1000, args.reorder / 100,
                      args.seed)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    queue = NetfilterQueue()
    queue.bind(args.queue, delayer.arrived, max_len=QUEUE_LENGTH, mode=COPY_META)
    fd = queue.get_fd()
    print("ready", flush=True)
    try:
        while not stopping:
            due = delayer.let_due_through()
            try:
                readable, _, _ = select.select([fd], [], [], 0.05 if due is None else
                                               min(due, 0.05))
            except InterruptedError:
                continue
            if readable:
                queue.run(block=False)
    finally:
        delayer.let_all_through()
        queue.unbind()
    print(f"passed {delayer.passed} overtaken {delayer.overtaken}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
