"""Fuzzing at scale (issue 36), shared by tests/unit/test_fuzzing.py (sized for CI) and
bench/bench_fuzz.py (a million inputs to the session core, a hundred thousand over sockets).

A seeded generator (``Inputs``) writes the protocol's messages the way an attacker varies
them: logins of both kinds with hostile names, every command with hostile table names, GTIDs
and dump names, then mutations of those (cut, doubled, a byte flipped or inserted) and plain
random bytes. Every input goes through the real session state machine, or a real listener on
127.0.0.1; every reply must be in the protocol's grammar, nothing may raise, memory must stay
bounded, and afterwards a normal client must get exactly the table's records. A failure
names its seed and the input, so it can be replayed.

``REGRESSION`` is every input of the issue's report (the password-hash dump, the junk logins,
the long names, the colliding and log-forging names, a replayed login): each is replayed over
a socket on every run.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from cdcserver.protocol.outcomes import Delay, Reply, SendDump, StartStream
from cdcserver.protocol.queries import QUERIES
from cdcserver.protocol.session import Session
from mariadb_cdc_client.format.wire import Code, auth_message
from tests.helpers import PASSWORD, USER, RawClient
from tests.unit.test_listener import Listener

_CODES = "|".join(re.escape(c.value) for c in Code)
# Every reply line the grammar allows: OK (after SCRAM, with the server's signature), an
# error with a known code, the SCRAM server-first message, or one JSON object.
REPLY_LINE = re.compile(rb"^(OK|OK v=[A-Za-z0-9+/=]+|ERR (" + _CODES.encode() +
                        rb") [^\n]*|SCRAM r=[!-+\--~]+,s=[A-Za-z0-9+/=]+,i=\d+|\{[^\n]*\})\n$")
AVRO_MAGIC = b"Obj\x01"
MAX_MESSAGE = 65536  # the listener's max_line: the framing refuses longer ones itself

VERBS = ["REGISTER", "REQUEST-DATA", "QUERY-LAST-TRANSACTION", "QUERY-TRANSACTION",
         "QUERY-STATE", "QUERY-RANGE", "LIST-TABLES", "LIST-DUMPS", "START-DUMP",
         "REQUEST-DUMP", "CLOSE", "AUTH", "request-data", "REQUEST-DATA\t"]
USERS = [USER, "victim", "nobody", "x" * 43, "x" * 44, "x" * 32768, "a:b", "ünï", "a\nb",
         "\x1b[31mred", "\u202eevil", "", "=2C", "a,b", "a=b", "root", " "]
TABLES = ["shop.items", "`shop`.`items`", "shop.items.000001", "shop.items.2", "shop.*", "*",
          "mysql.*", "mysql.global_priv", "mysql.user", "information_schema.TABLES",
          "performance_schema.*", "sys.*", "`a.b`.c", "a.`b.c`", "`x``y`.z", "ünï.çødé",
          "a" * 64 + ".t", "é" * 200 + ".t", "shop.\u202eevil", "shop.items\x1b[2J",
          "shop.\nitems", "..", "../../etc/passwd", "/etc/passwd", "shop", "shop.", ".t",
          "shop.items.99999999999999999999", "`shop`.`items`.0", "`", "``.``", "-1"]
GTIDS = ["0-1-1", "0-1-2", "0-1-9999", "0-1-18446744073709551615", "0-1-18446744073709551616",
         "4294967295-4294967295-1", "4294967296-1-1", "1-2-3,4-5-6", "0-1-" + "9" * 400,
         "x-y-z", "0--1", "-0-1-1", ",", "0-1-1," * 100, "0-0-0", "1-1-1,1-1-2", "", "0-1",
         "0-1-1-1", "0x1-1-1", "٣-1-1"]
DUMPS = ["shop.items", "shop.items.20261128T000000Z", "shop.items.dump", "../x.dump",
         "/etc/passwd", "%2e%2e/x", "shop.items.*", "mysql.global_priv", "shop.items LATEST",
         "shop.items FOLLOW", "shop.items DATABUS", "\x00"]
FORMS = ["{verb}", "{verb} {table}", "{verb} {table} {gtid}", "{verb} {table} AFTER {gtid}",
         "{verb} {table} UNTIL {gtid}", "{verb} {table} AFTER {gtid} UNTIL {gtid}",
         "{verb} {table} LIMIT {number}", "{verb} {table} AFTER {gtid} LIMIT {number}",
         "{verb} {gtid}", "{verb} {dump}", "{verb} {dump} FOLLOW", "{verb} {table} {table}",
         "REGISTER UUID={word}, TYPE={fmt}", "REGISTER UUID={word}, TYPE={fmt}, DIALECT={word}",
         "REGISTER {word}", "QUERY-TRANSACTION {gtid}", "QUERY-STATE {gtid}",
         "START-DUMP {table}", "REQUEST-DUMP {dump}", "LIST-DUMPS {table}",
         "QUERY-RANGE {table} AFTER {gtid} UNTIL {gtid} LIMIT {number}"]
NUMBERS = ["0", "1", "10", "-1", "99999999999999999999", "1e9", "", "NaN", "٣"]
WORDS = ["x", "", "JSON", "AVRO", "XML", "exact", "maxscale", "é" * 50, "%s%n", "\x00",
         "a" * 1000, "UUID=", ",", "=", "'", "\"", "\\"]


def login_script() -> list[bytes]:
    return [auth_message(USER, PASSWORD), b"REGISTER UUID=fuzz, TYPE=JSON"]


class Inputs:
    """The generator: ``script()`` is one connection's messages."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rnd = random.Random(seed)

    def script(self) -> list[bytes]:
        lines = login_script() if self.rnd.random() < 0.6 else []
        return lines + [self.message() for _ in range(self.rnd.randint(1, 6))]

    def message(self) -> bytes:
        r = self.rnd.random()
        if r < 0.15:
            message = self.login()
        elif r < 0.75:
            message = self.command()
        elif r < 0.92:
            message = self.mutate(self.rnd.choice([self.login, self.command])())
        else:
            message = self.rnd.randbytes(self.rnd.randint(0, 120))
        return message[:MAX_MESSAGE]

    def login(self) -> bytes:
        user = self.rnd.choice(USERS)
        password = self.rnd.choice([PASSWORD, "wrong", "", "é" * 20, self.word()])
        r = self.rnd.random()
        if r < 0.5:
            return auth_message(user, password)
        nonce = self.rnd.choice(["abc", "", "a,b", "x" * 100, self.word()])
        escaped = user.replace("=", "=3D").replace(",", "=2C")
        if r < 0.8:
            return (f"AUTH SCRAM-SHA-256 {self.rnd.choice(['n', 'y', 'p=x', 'q'])},,"
                    f"n={escaped},r={nonce}").encode()
        return f"c=biws,r={nonce},p={self.word()}".encode()  # a final with no exchange

    def command(self) -> bytes:
        form = self.rnd.choice(FORMS)
        return form.format(verb=self.rnd.choice(VERBS), table=self.rnd.choice(TABLES),
                           gtid=self.rnd.choice(GTIDS), dump=self.rnd.choice(DUMPS),
                           number=self.rnd.choice(NUMBERS), word=self.word(),
                           fmt=self.rnd.choice(["JSON", "AVRO", "XML", ""])).encode()

    def word(self) -> str:
        return self.rnd.choice(WORDS)

    def mutate(self, message: bytes) -> bytes:
        data = bytearray(message)
        for _ in range(self.rnd.randint(1, 3)):
            kind = self.rnd.randrange(5)
            at = self.rnd.randint(0, len(data))
            if kind == 0:
                del data[at:]
            elif kind == 1:
                data[at:at] = bytes([self.rnd.randrange(256)])
            elif kind == 2 and at < len(data):
                data[at] ^= 1 << self.rnd.randrange(8)
            elif kind == 3:
                data += data[:self.rnd.randint(0, 200)]
            else:
                data[at:at] = self.rnd.choice([b"\r", b"\x00", b" ", b"`", b".", b","])
        return bytes(data)


def framed(script: list[bytes]) -> Iterator[bytes]:
    """The messages the listener's framing makes of a script sent line by line."""
    for message in script:
        for part in message.split(b"\n"):
            yield part.rstrip(b"\r")


def check_reply(data: bytes, context: object) -> None:
    for line in data.splitlines(keepends=True):
        assert REPLY_LINE.match(line), (context, line[:300])


@dataclass
class Figures:
    scenario: str
    inputs: int = 0
    sessions: int = 0
    rss_mib: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        start, end = self.rss_mib
        note = f"; {'; '.join(self.notes)}" if self.notes else ""
        return (f"{self.scenario}: {self.inputs:,} inputs in {self.sessions:,} sessions, no "
                f"crash; RSS {start:.0f} -> {end:.0f} MiB{note}")


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def fuzz_core(running: Listener, inputs: int, seed: int) -> Figures:
    """``inputs`` generated messages through the session state machine, in process (the
    throttle as configured: a wait is taken at once)."""
    figures = Figures(f"session core (seed {seed})")
    generator = Inputs(seed)
    context = running.server.context
    before = rss_mib()
    while figures.inputs < inputs:
        script = generator.script()
        figures.sessions += 1
        session = Session(context, f"fuzz:{figures.sessions % 50_000}")
        for message in framed(script):
            figures.inputs += 1
            try:
                if not _step(session, message, (seed, script, message)):
                    break
            except AssertionError:
                raise
            except Exception as exc:  # the connection would send INTERNAL and log it
                raise AssertionError(f"seed {seed}: {message[:200]!r} raised {exc!r}"
                                     ) from exc
    figures.rss_mib = (before, rss_mib())
    return figures


def _step(session: Session, message: bytes, context: object) -> bool:
    """One message; False when the connection would end (closed, or a stream started)."""
    outcome = session.receive(message)
    while isinstance(outcome, (*QUERIES, Delay)):
        outcome = outcome.then() if isinstance(outcome, Delay) else \
            session.answered(outcome, outcome.fetch(session.context))
    if isinstance(outcome, Reply):
        check_reply(outcome.data, context)
        return not outcome.close
    if isinstance(outcome, StartStream | SendDump):
        return False  # what streams is the socket fuzzer's and the stream tests' part
    assert outcome is None, (context, outcome)
    return True


async def fuzz_sockets(running: Listener, inputs: int, seed: int, concurrency: int = 100
                       ) -> Figures:
    """``inputs`` generated messages over real connections, ``concurrency`` at a time: every
    reply line in the grammar (an AVRO stream's bytes excepted), every connection ends or
    falls quiet, and none is left open afterwards."""
    figures = Figures(f"real sockets (seed {seed})")
    generator = Inputs(seed)
    throttle = running.server.context.throttle
    throttle.limit = throttle.per_address = 1 << 30  # waits are the throttle tests' part
    before = rss_mib()
    taken_before = _taken(running)

    async def run(script: list[bytes]) -> None:
        client = await RawClient.connect(running.port)
        try:
            client.writer.write(b"\n".join(script) + b"\n")
            received = b""
            try:
                while True:  # until the server closes, or falls quiet (a stream waiting)
                    more = await asyncio.wait_for(client.reader.read(1 << 20), 0.3)
                    if not more:
                        break
                    received += more
            except TimeoutError:
                pass
            except ConnectionError:
                pass  # it hung up while we wrote (LINE-TOO-LONG, TOO-MANY-ERRORS)
        finally:
            await client.close()
        complete = received.split(AVRO_MAGIC, 1)[0]
        check_reply(complete[:complete.rfind(b"\n") + 1], (seed, script))

    while figures.inputs < inputs:
        batch = [generator.script() for _ in range(concurrency)]
        figures.inputs += sum(len(s) for s in batch)
        figures.sessions += len(batch)
        await asyncio.gather(*(run(s) for s in batch))
    await _all_closed(running, taken_before + figures.sessions)
    figures.rss_mib = (before, rss_mib())
    return figures


async def _all_closed(running: Listener, taken: int, timeout: float = 60.0) -> None:
    """The server has ``taken`` connections since it started (a loaded one may accept some
    after their client has gone: the kernel queued them), and every one has ended."""
    server = running.server
    deadline = asyncio.get_running_loop().time() + timeout
    while (server.connections or _taken(running) < taken) and \
            asyncio.get_running_loop().time() < deadline:
        if server.connections:
            await asyncio.wait(set(server._connections), timeout=1.0)
        else:
            await asyncio.sleep(0.05)
    assert server.connections == 0 and _taken(running) >= taken, \
        f"{server.connections} left open; {_taken(running)} of {taken} connections taken"


def _taken(running: Listener) -> int:
    """Connections the server has accepted or refused since it started."""
    return running.server.connections_total + running.server.connections_refused


# -- the inputs ---------------------------------------------------------------------

JUNK_LOGINS = 10_010  # what flushed victim's throttle entry


VICTIM, VICTIM_PASSWORD = "victim", "victim-pw"  # a user allowed only shop.other


def regression() -> list[tuple[str, list[bytes], list[bytes]]]:
    """Every input of issue 36's report, as (what, one connection's messages, bytes that must
    not come back)."""
    logged_in = login_script()
    hashes = [b"authentication_string", b"global_priv\"", b"*5E24"]
    return [
        ("the password hashes by START-DUMP mysql.*",
         [*logged_in, b"START-DUMP mysql.*", b"REQUEST-DUMP mysql.global_priv",
          b"REQUEST-DATA mysql.global_priv", b"REQUEST-DATA mysql.user",
          b"LIST-DUMPS mysql.global_priv", b"START-DUMP mysql.global_priv"], hashes),
        ("metadata past the table list",
         [auth_message(VICTIM, VICTIM_PASSWORD), b"REGISTER UUID=v, TYPE=JSON",
          b"QUERY-LAST-TRANSACTION", b"QUERY-TRANSACTION 0-1-1", b"QUERY-STATE",
          b"QUERY-RANGE shop.items LIMIT 5", b"LIST-TABLES", b"REQUEST-DATA shop.items"],
         [b'"GTID"', b"items\"", b'"gtid_state": "0-']),
        ("32 KB user names", [auth_message("v" * 32768, "pw")], [b"v" * 44]),
        ("wrong passwords for victim", [auth_message(VICTIM, f"guess{n}") for n in range(6)],
         [b"OK\n"]),
        ("victim's own login while it is guessed at (it logged in before)",
         [auth_message(VICTIM, VICTIM_PASSWORD), b"REGISTER UUID=v, TYPE=JSON"], [b"ERR"]),
        ("a 32 KB SCRAM user name", [f"AUTH SCRAM-SHA-256 n,,n={'v' * 32768},r=x".encode()],
         [b"v" * 44]),
        ("colliding names", [*logged_in, b"REQUEST-DATA `a.b`.c", b"REQUEST-DATA a.`b.c`",
                             b"QUERY-RANGE `a.b`.c LIMIT 1"], [b'"table"', b'"events": 1']),
        ("log-forging names", [*logged_in, b"REQUEST-DATA shop.x\r\nINFO forged",
                               "REQUEST-DATA shop.\u202eevil".encode(),
                               b"REQUEST-DATA shop.\x1b[2Jitems",
                               auth_message("a\nINFO forged", "pw")], [b"\x1b"]),
        ("a replayed MaxScale login", [auth_message(USER, PASSWORD)] * 3, []),
        ("random bytes", [random.Random(36).randbytes(4096)], []),
        ("a long line", [b"REQUEST-DATA " + b"x" * (MAX_MESSAGE + 1)], []),
        ("pipelined commands", [*logged_in, *[b"QUERY-STATE"] * 2000], []),
        ("REGISTERs", [auth_message(USER, PASSWORD), *[b"REGISTER UUID=r, TYPE=JSON"] * 2000],
         []),
    ]


# The inputs whose replies depend on those before them: victim logs in, then its password is
# guessed at until it is throttled, then it logs in while it is.
_IN_ORDER = ("metadata past the table list", "wrong passwords for victim",
             "victim's own login while it is guessed at (it logged in before)")


async def replay_regression(running: Listener) -> int:
    """Each regression input on a connection of its own (victim's in order, the others at
    once: each waits for its connection to fall quiet), then ``JUNK_LOGINS`` logins with
    junk names: replies in the grammar, nothing that must not come back, and victim's
    throttle budget still spent (junk did not flush it). How many inputs were sent."""
    inputs = regression()
    chained = [i for i in inputs if i[0] in _IN_ORDER]
    assert [i[0] for i in chained] == list(_IN_ORDER)

    async def in_order() -> int:
        return sum([await _replay(running, *i) for i in chained])

    sent = sum(await asyncio.gather(in_order(), *(_replay(running, *i) for i in inputs
                                                  if i[0] not in _IN_ORDER)))
    throttle = running.server.context.throttle
    clock, paused = throttle.clock, throttle.clock()
    # The throttle's clock stands still while the junk goes in: what is asserted is that junk
    # does not flush victim's entry, not that 10,010 logins fit in its 60 s window (on a busy
    # machine they need not, and victim's guesses would then leave it as they should).
    throttle.clock = lambda: paused
    try:
        for start in range(0, JUNK_LOGINS, 500):
            await asyncio.gather(*(_junk_login(running.port, n)
                                   for n in range(start, min(start + 500, JUNK_LOGINS))))
        turn = throttle.turn("127.0.0.1", VICTIM, b"\1" * 20, True)
    finally:
        throttle.clock = clock
    assert turn.wait > 0, "victim's next guess would be checked at once"
    return sent + JUNK_LOGINS


async def _replay(running: Listener, what: str, script: list[bytes], absent: list[bytes]
                  ) -> int:
    """One input on a connection of its own, read until the connection ends or is quiet
    for 3 s: how many messages it sent."""
    client = await RawClient.connect(running.port)
    try:
        client.writer.write(b"\n".join(script) + b"\n")
        received = b""
        try:
            while more := await asyncio.wait_for(client.reader.read(1 << 20), 3.0):
                received += more
        except (TimeoutError, ConnectionError):
            pass
    finally:
        await client.close()
    assert received, what
    for text in absent:
        assert text not in received, (what, text, received[:300])
    complete = received.split(AVRO_MAGIC, 1)[0]
    check_reply(complete[:complete.rfind(b"\n") + 1], what)
    return len(script)


async def _junk_login(port: int, n: int) -> None:
    """One junk login, as the report's flood sent them: without waiting long for a turn."""
    client = await RawClient.connect(port)
    try:
        await client.send(auth_message(f"junk{n}", "pw") + b"\n")
        reply = await client.line(timeout=0.5)
        assert not reply or REPLY_LINE.match(reply), reply
    except TimeoutError:
        pass  # its turn is later: gone before it comes
    finally:
        await client.close()


async def served_afterwards(running: Listener, records: int) -> None:
    """A normal client logs in and gets exactly the table's ``records`` records, in order."""
    client = await RawClient.connect(running.port)
    try:
        await client.login()
        await client.send(b"REQUEST-DATA shop.items\n")
        schema = await client.json_line()
        assert schema["table"] == "items", schema
        ids = [(await client.json_line())["id"] for _ in range(records)]
        assert ids == list(range(1, records + 1)), ids
    finally:
        await client.close()
