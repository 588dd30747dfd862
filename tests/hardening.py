"""Hardening scenarios against the real listener, shared by tests/unit/test_hardening.py (sized for
CI) and bench/hardening.py (the issue's sizes, printing the figures).

Each scenario returns ``Figures``: how many inputs, connections or faults it tried, how many
the server survived as it should, and what was lost. A scenario raises AssertionError on the
first misbehaviour, with what happened.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from cdcserver.core.config import ListenerConfig
from cdcserver.protocol.outcomes import Reply, SendDump, StartStream
from cdcserver.protocol.queries import QUERIES
from cdcserver.protocol.session import Session
from mariadb_cdc_client.format.wire import auth_message
from tests import fuzzing
from tests.helpers import PASSWORD, USER, RawClient
from tests.unit.test_listener import Listener, _listener

# Every reply line the grammar allows (protocol.md, "Replies and error codes").
REPLY_LINE = fuzzing.REPLY_LINE
AVRO_MAGIC = b"Obj\x01"


@dataclass
class Figures:
    scenario: str
    tried: int = 0  # inputs, connections or faults
    survived: int = 0  # handled as they should be
    lost: int = 0  # records a client should have had and did not
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        note = f" ({'; '.join(self.notes)})" if self.notes else ""
        return (f"{self.scenario}: {self.tried:,} tried, {self.survived:,} survived, "
                f"data lost: {self.lost}{note}")


async def listener(tmp_path: str, **limits: float) -> Listener:
    """A listener on 127.0.0.1:0 over a store holding ``shop.items`` (two records)."""
    settings_ = dict(auth_timeout=5.0, idle_timeout=5.0)
    settings_.update(limits)
    running = await _listener(tmp_path, ListenerConfig(**settings_))  # type: ignore[arg-type]
    await running.commit_rows((1, "one"), (2, "two"))
    return running


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


# -- fuzzing the protocol -----------------------------------------------------------------

_VERBS = ["REGISTER", "REQUEST-DATA", "QUERY-LAST-TRANSACTION", "QUERY-TRANSACTION",
          "QUERY-STATE", "QUERY-RANGE", "LIST-TABLES", "LIST-DUMPS", "REQUEST-DUMP", "CLOSE"]
_WORDS = ["shop.items", "shop.items.000001", "shop.items.2", "shop", "0-1-1", "0-1-9999",
          "UUID=x, TYPE=JSON", "UUID=x, TYPE=AVRO", "TYPE=XML", "AFTER", "UNTIL", "LIMIT",
          "FOLLOW", "10", "-1", "../../etc/passwd", "/etc/passwd", "shop.items.avro", "%s",
          "\x00", "é", "0-0-0,1-2-3", "99999999999999999999999", "*", ""]


# Characters of generated text: mostly ASCII, with controls, Latin-1, other planes and
# what a line reader splits on; never a lone surrogate (a str that cannot be encoded).
_ALPHABETS = [(0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0xD7FF), (0xE000, 0x10FFFF)]


def _text(rnd: random.Random, most: int) -> str:
    chars = []
    for _ in range(rnd.randint(0, most)):
        low, high = _ALPHABETS[0] if rnd.random() < 0.6 else rnd.choice(_ALPHABETS)
        chars.append(chr(rnd.randint(low, high)))
    return "".join(chars)


def _message(rnd: random.Random) -> bytes:
    """A command (a verb, or junk, and up to five words), raw bytes, or a login."""
    kind = rnd.random()
    if kind < 0.6:
        verb = rnd.choice(_VERBS) if rnd.random() < 0.8 else _text(rnd, 10)
        words = [rnd.choice(_WORDS) if rnd.random() < 0.7 else _text(rnd, 12)
                 for _ in range(rnd.randint(0, 5))]
        return " ".join([verb, *words]).encode()
    if kind < 0.9:
        return rnd.randbytes(rnd.randint(0, 80))
    return auth_message(USER, PASSWORD)


def _script(rnd: random.Random) -> list[bytes]:
    """A session's messages: often logged in and registered first, so the fuzzing reaches
    the commands."""
    login = [auth_message(USER, PASSWORD), b"REGISTER UUID=fuzz, TYPE=JSON"]
    return (login if rnd.random() < 0.5 else []) + \
        [_message(rnd) for _ in range(rnd.randint(1, 6))]


def fuzz_sessions(running: Listener, examples: int, seed: int | None = None) -> Figures:
    """The session state machine, in process: every reply must be in the grammar, and no
    input may raise. Counts every message as an input. Scripts come from a seeded generator
    (``CDC_FUZZ_SEED``, else a fixed seed), named in any failure: hypothesis's engine costs
    about 4 ms an example, fifty times what the session does with one."""
    if seed is None:
        seed = int(os.environ.get("CDC_FUZZ_SEED", "20261201"))
    figures = Figures(f"protocol fuzzing (session state machine, seed {seed})")
    context = running.server.context
    context.throttle.limit = 1 << 30  # the fuzzer fails logins on purpose
    rnd = random.Random(seed)
    for example in range(examples):
        script = _script(rnd)
        try:
            _run_script(context, script, figures)
        except BaseException as exc:
            raise AssertionError(f"seed {seed}, example {example}: {script!r}") from exc
    return figures


def _run_script(context: Any, script: list[bytes], figures: Figures) -> None:
    session = Session(context, "fuzz:1")
    for message in script:
        figures.tried += 1
        outcome = session.receive(message)
        while isinstance(outcome, QUERIES):  # the connection runs it in a thread
            outcome = session.answered(outcome, outcome.fetch(context))
        if isinstance(outcome, Reply):
            for line in outcome.data.splitlines(keepends=True):
                assert REPLY_LINE.match(line), (message, outcome.data)
            if outcome.close:
                break
        elif isinstance(outcome, StartStream | SendDump):
            break  # the stream itself is the socket fuzzer's and the stream tests' part
        else:
            assert outcome is None, (message, outcome)
        figures.survived += 1
    else:
        return
    figures.survived += 1


async def fuzz_sockets(running: Listener, connections: int, seed: int = 7) -> Figures:
    """Random scripts over real connections, 50 at a time: each reply line in the grammar
    (an AVRO stream excepted), and every connection ends or falls quiet: no hang. Then the
    server must be left with no connection open."""
    import random

    figures = Figures("protocol fuzzing (real sockets)")
    rnd = random.Random(seed)
    running.server.context.throttle.limit = 1 << 30

    def script() -> list[bytes]:
        lines = [auth_message(USER, PASSWORD), b"REGISTER UUID=f, TYPE=JSON"] \
            if rnd.random() < 0.7 else []
        for _ in range(rnd.randint(1, 5)):
            if rnd.random() < 0.3:
                lines.append(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 60))))
            else:
                words = [rnd.choice(_WORDS) for _ in range(rnd.randint(0, 4))]
                lines.append(" ".join([rnd.choice(_VERBS), *words]).encode())
        return lines

    async def run(lines: list[bytes]) -> None:
        client = await RawClient.connect(running.port)
        client.writer.write(b"\n".join(lines) + b"\n")
        received = b""
        try:
            while True:  # until the server closes, or falls quiet (a stream waiting)
                more = await asyncio.wait_for(client.reader.read(1 << 20), 0.5)
                if not more:
                    break
                received += more
        except TimeoutError:
            pass
        await client.close()
        for line in received.split(AVRO_MAGIC, 1)[0].splitlines(keepends=True):
            if line.endswith(b"\n"):
                assert REPLY_LINE.match(line), (lines, line)
        figures.tried += len(lines)
        figures.survived += len(lines)

    scripts = [script() for _ in range(connections)]
    for start in range(0, connections, 50):
        await asyncio.gather(*(run(lines) for lines in scripts[start:start + 50]))
    open_connections = set(running.server._connections)  # they linger after an error reply
    if open_connections:
        await asyncio.wait(open_connections, timeout=10)
    assert running.server.connections == 0, f"{running.server.connections} left open"
    figures.notes.append(f"{connections} connections")
    return figures


# -- load and abuse -----------------------------------------------------------------------

async def hold_connections(running: Listener, count: int, patience: float = 60.0) -> Figures:
    """``count`` clients logged in and tailing a table at once; a commit reaches every one
    (each client waits ``patience`` seconds at most for each answer)."""
    raise_fd_limit(4 * count + 256)
    figures = Figures(f"{count:,} concurrent connections")
    clients: list[RawClient] = []

    async def tail() -> RawClient:
        client = await RawClient.connect(running.port)
        clients.append(client)  # closed below whatever happens
        await client.login(timeout=patience)
        await client.send(b"REQUEST-DATA shop.items\n")
        for _ in range(3):
            await client.json_line(timeout=patience)
        return client

    try:
        tailing = await asyncio.gather(*(tail() for _ in range(count)))
        assert running.server.connections == count
        figures.tried = count
        await running.commit_rows((100, "to everyone"))
        got = await asyncio.gather(*(c.json_line(timeout=patience) for c in tailing))
        figures.survived = sum(1 for g in got if g["id"] == 100)
        figures.lost = count - figures.survived
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return figures


def _rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


async def slow_readers(running: Listener, clients: int, megabytes: int) -> Figures:
    """Clients that request ``megabytes`` of records and never read: the server holds a
    bounded amount for each (its memory does not grow with the data), and a reading client
    meanwhile gets everything."""
    figures = Figures(f"slow clients that never read ({megabytes} MB each)")
    rows_per_txn, row = 50, "z" * 2000
    transactions = megabytes * 1_000_000 // (rows_per_txn * len(row))
    for i in range(transactions):
        await running.commit_rows(*[(10_000 + i * rows_per_txn + j, row)
                                    for j in range(rows_per_txn)])
    before = _rss_mib()
    stuck = []
    for _ in range(clients):
        _, writer = await asyncio.open_connection("127.0.0.1", running.port, limit=1024)
        writer.transport.pause_reading()  # never reads: the kernel buffers fill, then ours
        writer.write(auth_message(USER, PASSWORD) + b"\nREGISTER UUID=s, TYPE=JSON\n"
                     b"REQUEST-DATA shop.items\n")
        stuck.append(writer)
    reader_client = await RawClient.connect(running.port)
    await reader_client.login()
    await reader_client.send(b"REQUEST-DATA shop.items\n")
    expected = 1 + 2 + transactions * rows_per_txn
    lines = [await reader_client.line(timeout=60) for _ in range(expected)]
    figures.lost = expected - len([line for line in lines if line])
    growth = _rss_mib() - before
    figures.tried = clients
    figures.survived = clients if growth < 64 + clients * 2 else 0
    figures.notes.append(f"server memory grew {growth:.0f} MiB for {clients} x "
                         f"{megabytes} MB unread")
    assert figures.survived == clients, figures.notes
    await reader_client.close()
    for writer in stuck:
        writer.close()
    return figures


async def slowloris(running: Listener, connections: int, auth_timeout: float) -> Figures:
    """Connections that keep sending a byte every 0.1 s without ever authenticating (empty
    lines: a byte without a newline would be a whole message, MaxScale's framing, and fail
    at once) are cut at the authentication deadline, one deadline for the whole phase, and
    a normal client is served meanwhile. Each is cut while it is still sending, several
    deadlines before it would stop (a deadline each byte renewed would never cut it): how
    late past the deadline is a figure, not a bound, since the dribblers share the test's
    loop with the server (a CI run beside the suite saw 1.9 s for a 1 s deadline)."""
    figures = Figures(f"slowloris ({connections} connections, a byte every 0.1 s)")
    raise_fd_limit(4 * connections + 256)

    async def dribble() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        started = time.monotonic()
        reply = asyncio.ensure_future(reader.readline())
        cut_while_sending = False
        try:
            for _ in range(int(auth_timeout * 10) + 50):
                writer.write(b"\n")
                await writer.drain()
                await asyncio.wait({reply}, timeout=0.1)
                if reply.done():
                    cut_while_sending = True
                    break
        except ConnectionError:
            cut_while_sending = True
        cut = time.monotonic() - started
        assert cut_while_sending, f"still not cut after {cut:.1f} s of dribbling"
        line = await asyncio.wait_for(reply, 5)
        assert line.startswith(b"ERR TIMEOUT authentication timeout"), line
        writer.close()
        return cut

    dribblers = [asyncio.create_task(dribble()) for _ in range(connections)]
    normal = await RawClient.connect(running.port)
    await normal.login()
    await normal.send(b"LIST-TABLES\n")
    assert (await normal.json_line())["tables"]
    await normal.close()
    cut_after = await asyncio.gather(*dribblers)
    figures.tried = connections
    open_connections = set(running.server._connections)
    if open_connections:  # after the reply, each is closed (a moment's linger)
        await asyncio.wait(open_connections, timeout=10)
    assert running.server.connections == 0
    figures.survived = len(cut_after)  # each cut while it was sending (asserted above)
    figures.notes.append(f"cut after {max(cut_after):.1f} s at most (auth timeout "
                         f"{auth_timeout:g} s)")
    assert figures.survived == connections, figures.notes
    return figures


async def oversized_lines(running: Listener, count: int, size: int) -> Figures:
    figures = Figures(f"oversized lines ({size:,} bytes)")
    for _ in range(count):
        client = await RawClient.connect(running.port)
        await client.send(b"A" * size)
        reply = await client.closed()
        assert reply.startswith(b"ERR LINE-TOO-LONG "), reply[:80]
        figures.tried += 1
        figures.survived += 1
    return figures


TRAVERSALS = ["../../../../etc/passwd", "/etc/passwd", "..", "shop/../../etc.passwd",
              "shop.items/../../../etc/passwd", "shop.items%2f..%2f..", "....//....//etc",
              "shop\x00.items", "~root/.ssh/id_rsa", "shop.items.000001.avro/../../x",
              "\\..\\..\\windows", "shop.*", "shop.items.-1", "a" * 300]
_TRAVERSAL_COMMANDS = ["REQUEST-DATA {}", "REQUEST-DATA shop.{}", "REQUEST-DUMP {}",
                       "REQUEST-DUMP {} FOLLOW", "LIST-DUMPS {}", "QUERY-RANGE {} LIMIT 5",
                       "QUERY-TRANSACTION {}", "REQUEST-DATA shop.items {}",
                       "REQUEST-DATA shop.items AFTER {}", "QUERY-RANGE shop.items AFTER {} "
                       "LIMIT 5", "REGISTER UUID={}, TYPE=JSON"]


async def path_traversal(running: Listener) -> Figures:
    """Every argument of every command, given a path: an error in the grammar, never a
    file's content and never a crash."""
    figures = Figures("path traversal in every argument")
    for template in _TRAVERSAL_COMMANDS:
        for attack in TRAVERSALS:
            client = await RawClient.connect(running.port)
            await client.login()
            command = template.format(attack).encode()
            await client.send(command + b"\n")
            try:
                reply = await asyncio.wait_for(client.reader.read(1 << 16), 2)
            except TimeoutError:
                reply = b""  # a waiting stream (AFTER a state still to come) sends nothing
            await client.close()
            figures.tried += 1
            assert b"root:" not in reply and b"PRIVATE KEY" not in reply, (command, reply)
            first = reply.split(b"\n", 1)[0] + b"\n" if reply else b""
            assert not first or REPLY_LINE.match(first), (command, reply[:200])
            if first.startswith(b"{") and b'"table"' in first:
                # a stream started: only for the real table, with a harmless argument
                assert b"shop.items" in command, (command, first)
            figures.survived += 1
    return figures
