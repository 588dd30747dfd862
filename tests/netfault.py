"""Hosts of a test's own, on this machine, behind a network the test can break.

Each :class:`Host` is a Linux network namespace linked to the test's namespace by a veth pair
(a /30 of its own in 10.128.0.0/9): what runs in it (``host.command(...)``: a MariaDB
server, a client) reaches the test's namespace, and is reached from it, only over that link.
nftables rules inside the host then drop what crosses the link:

- ``partition()``: every packet, both ways (a cut cable, a switch gone: nobody is told);
- ``half_open(inbound=...)``: one way only (a firewall that forgot a connection, a route
  lost one way): the side whose packets still arrive thinks all is well;
- ``lossy(percent)``: a share of the packets both ways, at random;
- ``slow(delay_ms, jitter_ms=..., reorder=...)``: every packet both ways held, some let
  through at once and so reordered (``tests/netdelay.py``);
- ``heal()``: none.

The kernel of these machines has no ``netem`` (delay, reordering, duplication), and
nftables no ``queue`` expression: dropping is done with nftables, and holding packets with
iptables' ``NFQUEUE`` target and a program of the test's own that lets each through later
(``tests/netdelay.py``, on NetfilterQueue). Making namespaces needs root and iproute2, the
rules nftables and iptables, ``slow`` NetfilterQueue (``tests/run.sh`` installs them all):
elsewhere the tests that use them are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

import pytest

POOL = ipaddress.ip_network("10.128.0.0/9")
LOCK = "/tmp/cdc-test-netfault.lock"  # the choice of a free /30, across pytest workers
PREFIX = "cdct"  # the namespaces' names: cdct<pid>n<number>
QUEUE = 55  # the NFQUEUE number slow() holds packets in (each namespace has its own)


def missing() -> str | None:
    """Why Hosts cannot be made here, if they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (tests/run.sh installs iproute2 and nftables)"
    return None


def slow_missing() -> str | None:
    """Why :meth:`Host.slow` cannot hold packets here, if it cannot."""
    if shutil.which("iptables") is None:
        return "iptables is not installed (tests/run.sh installs it)"
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        return "NetfilterQueue is not installed (tests/run.sh installs it)"
    return None


NETDELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netdelay.py")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@dataclasses.dataclass(frozen=True)
class Slowed:
    """What a :meth:`Host.slow` did, from its start until :meth:`Host.heal`."""

    passed: int  # packets held and let through
    overtaken: int  # ... after a packet that arrived later: reordered


class Host:
    """A network namespace of the test's own, behind a link the test can break."""

    _made = 0

    def __init__(self) -> None:
        why = missing()
        if why is not None:
            pytest.skip(why)
        _remove_leftovers()
        self._delayer: subprocess.Popen[str] | None = None  # while slow()
        self.slowed = Slowed(0, 0)  # what the last slow() held, once healed
        Host._made += 1
        self.name = f"{PREFIX}{os.getpid()}n{Host._made}"
        self._outer = f"ct{os.getpid() % 100000}n{Host._made}"[:15]
        self._inner = "eth0"
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet()
            self.gateway, self.address = (str(a) for a in list(subnet.hosts())[:2])
            _ip("netns", "add", self.name)
            try:
                _ip("link", "add", self._outer, "type", "veth", "peer", "name", self._inner,
                    "netns", self.name)
                _ip("addr", "add", f"{self.gateway}/30", "dev", self._outer)
                _ip("link", "set", self._outer, "up")
            except BaseException:
                self.close()
                raise
        self.run("ip", "addr", "add", f"{self.address}/30", "dev", self._inner)
        self.run("ip", "link", "set", self._inner, "up")
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "route", "add", "default", "via", self.gateway)
        self._nft("add table inet fault; "
                  "add chain inet fault inbound { type filter hook input priority 0; }; "
                  "add chain inet fault outbound { type filter hook output priority 0; }")

    @property
    def launcher(self) -> tuple[str, ...]:
        """The command prefix that runs a program in this host."""
        return ("ip", "netns", "exec", self.name)

    def command(self, args: Sequence[str]) -> list[str]:
        return [*self.launcher, *args]

    def run(self, *args: str) -> str:
        return subprocess.run(self.command(args), check=True, capture_output=True,
                              text=True).stdout

    # -- faults --------------------------------------------------------------------------

    def partition(self) -> None:
        """Every packet over the link dropped, both ways, silently."""
        self._drop(inbound=True, outbound=True)

    def half_open(self, *, inbound: bool) -> None:
        """Only the packets coming into this host (``inbound``) or only those leaving it
        dropped."""
        self._drop(inbound=inbound, outbound=not inbound)

    def lossy(self, percent: int) -> None:
        """``percent`` of the packets over the link dropped at random, both ways."""
        self._drop(inbound=True, outbound=True, match=f"numgen random mod 100 < {percent} ")

    def slow(self, delay_ms: float, *, jitter_ms: float = 0.0, reorder: float = 0.0,
             seed: int = 0) -> None:
        """Every packet over the link, both ways, held ``delay_ms`` give or take
        ``jitter_ms`` (so that packets close together overtake each other), and
        ``reorder`` percent let through at once, overtaking those held."""
        why = slow_missing()
        if why is not None:
            raise RuntimeError(why)
        self.heal()
        delayer = self._delayer = subprocess.Popen(
            self.command([sys.executable, NETDELAY, "--queue", str(QUEUE),
                          "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms),
                          "--reorder", str(reorder), "--seed", str(seed)]),
            stdout=subprocess.PIPE, text=True)
        assert delayer.stdout is not None
        if delayer.stdout.readline() != "ready\n":
            self._delayer = None
            delayer.wait()
            delayer.stdout.close()
            raise RuntimeError(f"tests/netdelay.py did not start (exit {delayer.returncode})")
        for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self.run("iptables", "-A", chain, way, self._inner, "-j", "NFQUEUE",
                     "--queue-num", str(QUEUE), "--queue-bypass")

    def heal(self) -> None:
        self._nft("flush chain inet fault inbound; flush chain inet fault outbound")
        delayer, self._delayer = self._delayer, None
        if delayer is not None:
            for chain in ("INPUT", "OUTPUT"):  # new packets pass; then the held ones
                self.run("iptables", "-F", chain)
            delayer.terminate()
            assert delayer.stdout is not None
            told = delayer.stdout.read().split()  # "passed N overtaken M"
            delayer.wait(10)
            delayer.stdout.close()
            if len(told) == 4:
                self.slowed = Slowed(int(told[1]), int(told[3]))

    def _drop(self, *, inbound: bool, outbound: bool, match: str = "") -> None:
        rules = ["flush chain inet fault inbound", "flush chain inet fault outbound"]
        if inbound:
            rules.append(f'add rule inet fault inbound iifname "{self._inner}" {match}drop')
        if outbound:
            rules.append(f'add rule inet fault outbound oifname "{self._inner}" {match}drop')
        self._nft("; ".join(rules))  # one transaction: never a moment half applied

    def _nft(self, script: str) -> None:
        subprocess.run(self.command(["nft", script]), check=True, capture_output=True,
                       text=True)

    # -- end -----------------------------------------------------------------------------

    def close(self) -> None:
        """The namespace and its link removed (what still runs in it is the caller's to
        stop first)."""
        delayer, self._delayer = self._delayer, None
        if delayer is not None:  # (its pipe closed too: a ResourceWarning in a later test)
            delayer.kill()
            delayer.wait()
            assert delayer.stdout is not None
            delayer.stdout.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self._outer)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.name)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /30 of the pool that no interface of this namespace has (under LOCK)."""
    used = set()
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            used.add(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for subnet in POOL.subnets(new_prefix=30):
        if not any(subnet.overlaps(u) for u in used):
            return subnet  # type: ignore[return-value]
    raise RuntimeError(f"no free /30 left in {POOL}")


def _remove_leftovers() -> None:
    """Namespaces (with their links) of test processes that are gone, killed before they
    could remove them."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX) or "n" not in name[len(PREFIX):]:
            continue
        pid = name[len(PREFIX):].split("n")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", name)
