"""The HTTP listeners' connection gate (cdcserver/ops/httpgate.py): who is let in when full."""

from __future__ import annotations

from cdcserver.ops.httpgate import ConnectionGate


def _filled(gate: ConnectionGate, closed: list[str], *hosts: str) -> None:
    """``gate.per_address`` connections from each host, each having sent a request."""
    for host in hosts:
        for n in range(gate.per_address):
            name = f"{host}#{n}"
            assert gate.admit(name, host, closed.append)
            gate.requested(name)


def test_busy_connections_from_two_addresses_cannot_keep_a_third_out():
    """Found by attack: 32 keep-alive connections from each of two addresses, each asking
    for /live every few seconds, kept every other address out (only connections that had
    not sent a request were closed for a newcomer)."""
    gate, closed = ConnectionGate("admin", total=64, per_address=32), []
    _filled(gate, closed, "10.0.0.1", "10.0.0.2")
    assert gate.admit("operator", "10.0.0.3", closed.append)
    assert closed == ["10.0.0.1#0"]  # the oldest of an address holding the most
    gate.requested("operator")
    # the attacker's address, now holding fewer, takes nothing back from the other
    assert not gate.admit("again", "10.0.0.1", closed.append)
    # the operator's next connections get in, from the address holding the most each time
    assert gate.admit("operator 2", "10.0.0.3", closed.append)
    assert closed[-1] == "10.0.0.2#0"
    assert "operator" not in closed and len(gate.open) == 64


def test_connections_shared_out_evenly_refuse_a_newcomer():
    gate, closed = ConnectionGate("admin", total=4, per_address=2), []
    _filled(gate, closed, "a", "b")
    assert gate.admit("c1", "c", closed.append)  # one of a, which holds the most, closed
    gate.requested("c1")
    assert gate.admit("d1", "d", closed.append)
    gate.requested("d1")
    assert len(gate.open) == 4 and sorted(gate.hosts.values()) == [1, 1, 1, 1]
    assert not gate.admit("e1", "e", closed.append)  # none holds more than e would


def test_a_connection_without_a_request_is_closed_first():
    gate, closed = ConnectionGate("admin", total=3, per_address=3), []
    _filled(gate, closed, "a")
    gate.release("a#2")
    assert gate.admit("idle", "b", closed.append)  # never sends a request
    assert gate.admit("new", "c", closed.append)
    assert closed == ["idle"]
