"""The listener on a real socket (127.0.0.1, port 0) over a real store filled with synthetic
changes: framing, phases, errors, limits. No MariaDB needed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from cdcserver.core.changes import Begin, ColumnDef, Commit, Rows, RowsKind, TableLayout
from cdcserver.core.config import ListenerConfig
from cdcserver.core.gtid import BinlogPosition, Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType
from cdcserver.protocol.framing import LINE_REST, MessageReader
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.server import CdcServer
from cdcserver.protocol.users import UsersFile
from cdcserver.store.catalog import Catalog
from cdcserver.store.store import AvroStore
from mariadb_cdc_client.format.wire import Code, ProtocolError, auth_incomplete, auth_message
from tests.helpers import PASSWORD, USER, RawClient, pace

LAYOUT = TableLayout("shop", "items", (
    ColumnDef("id", ColumnType.LONG, nullable=False),
    ColumnDef("name", ColumnType.VARCHAR, meta=64, charset="utf-8"),
), primary_key=(0,))


@dataclass
class Listener:
    server: CdcServer
    store: AvroStore
    port: int
    sequence: int = 0

    async def commit_rows(self, *rows: tuple[int, str]) -> None:
        self.sequence += 1
        gtid = Gtid(0, 1, self.sequence)
        state = GtidState([gtid])
        await self.store.apply([
            Begin(gtid, 1700000000 + self.sequence),
            Rows(LAYOUT, RowsKind.INSERT, 1700000000 + self.sequence, list(rows)),
            Commit(BinlogPosition(state, "mysql-bin.000001", 100 * self.sequence), 0)])


async def _listener(tmp_path: str, limits: ListenerConfig) -> Listener:
    catalog = Catalog(os.path.join(tmp_path, "avro"))
    store = AvroStore(tmp_path, catalog)
    store.open()
    users = UsersFile(os.path.join(tmp_path, "cdcusers"))
    users.add(USER, PASSWORD)
    context = SessionContext(catalog, users, lambda: store.index)
    server = CdcServer(context, limits)
    _, port = await server.start("127.0.0.1", 0)
    return Listener(server, store, port)


@pytest.fixture
async def listener(tmp_path: os.PathLike[str]) -> AsyncIterator[Listener]:
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=5, idle_timeout=5))
    await running.commit_rows((1, "one"), (2, "two"))
    yield running
    await running.server.stop()
    running.store.close()


async def test_netcat_framing_several_lines_in_one_write(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.send(auth_message(USER, PASSWORD) + b"\r\nREGISTER UUID=nc, TYPE=JSON\n"
                      b"REQUEST-DATA shop.items\n")
    assert await client.line() == b"OK\n"
    assert await client.line() == b"OK\n"
    assert (await client.json_line())["table"] == "items"
    assert (await client.json_line())["name"] == "one"
    await client.close()


async def test_maxscale_framing_one_write_per_command_without_newline(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.login("JSON")  # sends each command as one write, no newline
    await client.send(b"REQUEST-DATA shop.items")
    await client.json_line()
    assert [(await client.json_line())["id"] for _ in range(2)] == [1, 2]
    await client.close()


async def test_wrong_password_is_refused_and_can_be_retried(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.send(auth_message(USER, "wrong"))
    assert (await client.line()).startswith(f"ERR {Code.AUTH_FAILED.value} ".encode())
    await client.send(auth_message("nobody", PASSWORD))
    assert (await client.line()).startswith(b"ERR AUTH-FAILED")
    await client.send(auth_message(USER, PASSWORD))
    assert await client.line() == b"OK\n"
    await client.close()


@pytest.mark.parametrize("cuts", [(len(USER) * 2 + 2,), (3,), (5, 17, 40)])
async def test_the_reader_joins_a_login_sent_in_several_writes(cuts):
    """bborbe's Go client writes hex(user:) and the digest's hex separately, without a
    newline. The reader is driven step by step: after each write but the last it must be
    waiting for more, not hand over the part it has."""
    message = auth_message(USER, PASSWORD)
    stream = asyncio.StreamReader()
    reading = MessageReader(stream, 1024).next(auth_incomplete)
    start = 0
    for cut in cuts:
        stream.feed_data(message[start:cut])
        waiting = reading.send(None)  # runs until it waits for the next write
        assert isinstance(waiting, asyncio.Future) and not waiting.done()
        start = cut
    stream.feed_data(message[start:])
    with pytest.raises(StopIteration) as whole:
        reading.send(None)
    assert whole.value.value == message


async def test_a_login_sent_in_several_writes_logs_in(listener: Listener):
    message = auth_message(USER, PASSWORD)
    client = await RawClient.connect(listener.port)
    for start in range(0, len(message), 16):  # four writes, each drained before the next
        await client.send(message[start:start + 16])
    assert await client.line() == b"OK\n"
    await client.send(b"REGISTER UUID=split, TYPE=JSON")
    assert await client.line() == b"OK\n"
    await client.close()


async def test_a_login_that_never_completes_times_out(tmp_path: os.PathLike[str]):
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=0.5))
    try:
        client = await RawClient.connect(running.port)
        await client.send(auth_message(USER, PASSWORD)[:20])  # hex of "user:" and a bit
        assert b"ERR TIMEOUT" in await client.closed()
    finally:
        await running.server.stop()
        running.store.close()


async def test_a_bad_line_added_to_the_users_file_locks_nobody_out(listener: Listener):
    """A line with a lowercase hash and a malformed one, added while the service runs: the
    lowercase one logs in, everyone else still does, the malformed one is skipped (it used to
    fail every login with ERR INTERNAL until it was removed)."""
    path = listener.server.context.users.path
    lowercase = hashlib.sha1(hashlib.sha1(b"pw2").digest()).hexdigest()
    with open(path, "a") as f:
        f.write(f"second:{lowercase}\nnot a user line\n")
    for user, password in ((USER, PASSWORD), ("second", "pw2")):
        client = await RawClient.connect(listener.port)
        await client.send(auth_message(user, password))
        assert await client.line() == b"OK\n", user
        await client.close()


async def test_malformed_auth_message(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.send(b"not hex at all\n")
    assert (await client.line()).startswith(b"ERR BAD-AUTH")
    await client.close()


@pytest.mark.parametrize("scram", [False, True])
async def test_a_login_that_is_not_utf8_is_a_bad_login_not_a_bad_command(listener: Listener,
                                                                          scram: bool):
    """Bytes that are not UTF-8 in the login's place are answered as a login (BAD-AUTH), as
    any other malformed login is, and after them a correct login still works (found by
    attack: they were answered BAD-SYNTAX, as a command)."""
    client = await RawClient.connect(listener.port)
    if scram:
        await client.send(b"AUTH SCRAM-SHA-256 n,,n=" + USER.encode() + b",r=abcdefghijkl\n")
        assert (await client.line()).startswith(b"SCRAM r=abcdefghijkl")
    await client.send(b"\xff\xfe\x80 not UTF-8\n")
    assert (await client.line()).startswith(b"ERR BAD-AUTH")
    await client.close()
    client = await RawClient.connect(listener.port)
    await client.send(auth_message(USER, PASSWORD))
    assert await client.line() == b"OK\n"
    await client.close()


async def test_unknown_table_keeps_the_connection_usable(listener: Listener):
    # MaxScale's reply byte for byte (what its clients may compare with); a client that asked
    # for the exact dialect (this project's) reads the cause after it (protocol.md "Error
    # codes").
    for dialect, nothere, version7 in (
            (None, b"", b""),
            ("EXACT", b" (unknown table shop.nothere)", b" (shop.items has version 000001)")):
        client = await RawClient.connect(listener.port)
        await client.login(dialect=dialect)
        await client.send(b"REQUEST-DATA shop.nothere\n")
        assert await client.line() == \
            b"ERR NO-FILE File 'shop.nothere.000001.avro' not found." + nothere + b"\n"
        await client.send(b"REQUEST-DATA shop.items.000007\n")
        assert await client.line() == \
            b"ERR NO-FILE File 'shop.items.000007.avro' not found." + version7 + b"\n"
        await client.send(b"REQUEST-DATA shop.items\n")
        assert (await client.json_line())["version"] == 1
        await client.close()


@pytest.mark.parametrize("target", [
    "../../etc/passwd", "/etc/passwd", "shop/../../x.items", "..%2f..%2fetc.passwd",
    "shop.items/../../../etc", "shop.items.000001/../x",
])
async def test_paths_outside_the_data_directory_are_refused(listener: Listener, target: str):
    client = await RawClient.connect(listener.port)
    await client.login()
    await client.send(f"REQUEST-DATA {target}\n".encode())
    assert (await client.line()).startswith(b"ERR NO-FILE")
    await client.close()


async def test_commands_before_register_and_unknown_commands(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.send(auth_message(USER, PASSWORD) + b"\n")
    assert await client.line() == b"OK\n"
    await client.send(b"REQUEST-DATA shop.items\n")
    assert (await client.line()).startswith(b"ERR NOT-REGISTERED")
    await client.send(b"REGISTER UUID=x, TYPE=XML\n")
    assert (await client.line()).startswith(b"ERR REGISTRATION-FAILED")
    await client.send(b"REGISTER UUID=x, TYPE=JSON\n")
    assert await client.line() == b"OK\n"
    await client.send(b"FROBNICATE now\n")
    assert (await client.line()).startswith(b"ERR UNKNOWN-COMMAND")
    await client.send(b"REQUEST-DATA shop.items not-a-gtid\n")
    assert (await client.line()).startswith(b"ERR BAD-SYNTAX")
    await client.close()


async def test_bad_command_budget_ends_the_connection(tmp_path: os.PathLike[str]):
    running = await _listener(str(tmp_path), ListenerConfig(bad_command_limit=3))
    try:
        client = await RawClient.connect(running.port)
        await client.login()
        for _ in range(2):
            await client.send(b"NOPE\n")
            assert (await client.line()).startswith(b"ERR UNKNOWN-COMMAND")
        await client.send(b"NOPE\n")
        rest = await client.closed()
        assert b"ERR UNKNOWN-COMMAND" in rest and b"ERR TOO-MANY-ERRORS" in rest
    finally:
        await running.server.stop()
        running.store.close()


async def test_line_too_long_is_refused(tmp_path: os.PathLike[str]):
    running = await _listener(str(tmp_path), ListenerConfig(max_line=1024))
    try:
        client = await RawClient.connect(running.port)
        await client.send(b"A" * 5000 + b"\n")
        assert (await client.closed()).startswith(b"ERR LINE-TOO-LONG")
    finally:
        await running.server.stop()
        running.store.close()


async def test_auth_and_idle_timeouts(tmp_path: os.PathLike[str]):
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=0.3, idle_timeout=0.5))
    try:
        silent = await RawClient.connect(running.port)
        assert (await silent.closed()).startswith(b"ERR TIMEOUT authentication")
        idle = await RawClient.connect(running.port)
        await idle.login()
        assert (await idle.closed()).startswith(b"ERR TIMEOUT idle")
    finally:
        await running.server.stop()
        running.store.close()


async def test_connection_cap(tmp_path: os.PathLike[str]):
    running = await _listener(str(tmp_path), ListenerConfig(max_connections=2))
    try:
        first = await RawClient.connect(running.port)
        second = await RawClient.connect(running.port)
        await first.login()
        await second.login()
        third = await RawClient.connect(running.port)
        assert (await third.closed()).startswith(b"ERR TOO-MANY-CONNECTIONS")
        assert running.server.stats().connections_refused == 1
        await first.close()
        await second.close()
    finally:
        await running.server.stop()
        running.store.close()


async def test_close_ends_a_stream_and_other_commands_are_refused(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.login()
    await client.send(b"REQUEST-DATA shop.items\n")
    for _ in range(3):
        await client.json_line()
    await client.send(b"CLOSE\n")
    assert await client.closed() == b""

    client = await RawClient.connect(listener.port)
    await client.login()
    await client.send(b"REQUEST-DATA shop.items\n")
    for _ in range(3):
        await client.json_line()
    await client.send(b"QUERY-LAST-TRANSACTION\n")
    assert (await client.closed()).startswith(b"ERR STREAMING")


async def test_every_waiting_client_gets_a_new_commit(listener: Listener):
    clients = [await RawClient.connect(listener.port) for _ in range(20)]
    for client in clients:
        await client.login()
        await client.send(b"REQUEST-DATA shop.items\n")
        for _ in range(3):
            await client.json_line()
    await listener.commit_rows((3, "three"))
    got = await asyncio.gather(*(c.json_line() for c in clients))
    assert [g["id"] for g in got] == [3] * 20
    for client in clients:
        await client.close()


async def test_a_client_that_never_reads_does_not_stall_others(listener: Listener):
    for i in range(200):
        await listener.commit_rows(*[(1000 + i * 50 + j, "x" * 200) for j in range(50)])
    stuck = await RawClient.connect(listener.port)
    await stuck.login()
    await stuck.send(b"REQUEST-DATA shop.items\n")  # and never reads
    reader = await RawClient.connect(listener.port)
    await reader.login()
    await reader.send(b"REQUEST-DATA shop.items\n")
    lines = [await reader.json_line() for _ in range(1 + 2 + 200 * 50)]
    assert lines[-1]["id"] == 1000 + 199 * 50 + 49
    await reader.close()
    await stuck.close()


async def test_a_client_leaving_does_not_disturb_others_tailing_the_table(listener: Listener):
    leaving = await RawClient.connect(listener.port)
    staying = await RawClient.connect(listener.port)
    for client in (leaving, staying):
        await client.login()
        await client.send(b"REQUEST-DATA shop.items\n")
        for _ in range(3):
            await client.json_line()
    await leaving.send(b"CLOSE\n")
    assert await leaving.closed() == b""
    await listener.commit_rows((9, "nine"))
    assert (await staying.json_line())["id"] == 9
    await staying.close()


async def test_empty_lines_do_not_extend_the_authentication_timeout(tmp_path):
    running = await _listener(str(tmp_path), ListenerConfig(auth_timeout=0.6))
    try:
        client = await RawClient.connect(running.port)
        reply = asyncio.ensure_future(client.closed(timeout=5))
        sent = 0
        while not reply.done() and sent < 10:  # a slowloris: an empty line every 0.2 s
            try:
                await client.send(b"\n")
            except ConnectionError:
                break  # the server hung up before our reader saw it (a busy machine)
            sent += 1
            await pace(0.2)
        assert sent <= 5, "empty lines kept an unauthenticated connection open"
        assert (await reply).startswith(b"ERR TIMEOUT authentication")
    finally:
        await running.server.stop()
        running.store.close()


async def test_a_corrupt_file_is_an_internal_error_not_a_hang(listener: Listener):
    entry = listener.store.catalog.get(TableName("shop", "items"))
    assert entry is not None
    info = entry.latest()
    assert info is not None
    with open(info.path, "r+b") as f:  # break the block's sync marker
        f.seek(info.committed - 1)
        last = f.read(1)[0]
        f.seek(info.committed - 1)
        f.write(bytes([last ^ 0xFF]))  # (writing a fixed byte: a no-op 1 time in 256)
    client = await RawClient.connect(listener.port)
    try:
        await client.login()
        await client.send(b"REQUEST-DATA shop.items\n")
        await client.json_line()  # the schema
        reply = await client.line()
        assert reply.startswith(b"ERR INTERNAL"), reply  # not a record, not silence
        assert await client.closed() == b""  # and the server hangs up
    finally:
        await client.close()


def _stuck_client(port: int, fmt: str) -> socket.socket:
    """A client that requests the table and then does not read (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(auth_message(USER, PASSWORD) + f"\nREGISTER UUID=stuck, TYPE={fmt}\n"
                 "REQUEST-DATA shop.items\n".encode())
    return sock


def _ids_from(sock: socket.socket, count: int) -> list[int]:
    """Read the two OKs, the schema and ``count`` record lines; their ids in order."""
    sock.settimeout(30)
    reader = sock.makefile("rb")
    assert [reader.readline() for _ in range(2)] == [b"OK\n", b"OK\n"]
    assert json.loads(reader.readline())["table"] == "items"
    return [json.loads(reader.readline())["id"] for _ in range(count)]


async def test_a_tailing_client_that_stops_reading_leaves_the_shared_tail_and_loses_nothing(
        listener: Listener):
    """Clients at the end of a table share one reader (protocol/tail.py). One that stops
    reading must neither hold the others back nor make the server buffer without bound: it
    is dropped from the shared tail and later gets every record, in order, from its own
    stream."""
    stuck = await asyncio.to_thread(_stuck_client, listener.port, "JSON")
    reader = await RawClient.connect(listener.port)
    await reader.login()
    await reader.send(b"REQUEST-DATA shop.items\n")
    assert (await reader.json_line())["table"] == "items"
    assert [(await reader.json_line())["id"] for _ in range(2)] == [1, 2]
    await pace(0.2)  # the stuck client's request is served: both wait at the end
    ids = [1, 2]
    for i in range(400):  # 40 MB: far more than the tail buffers and the socket holds
        rows = [(100 + i * 50 + j, "x" * 2000) for j in range(50)]
        await listener.commit_rows(*rows)
        ids += [row[0] for row in rows]
        got = [(await reader.json_line())["id"] for _ in rows]
        assert got == [row[0] for row in rows]
    assert await asyncio.to_thread(_ids_from, stuck, len(ids)) == ids
    stuck.close()
    await reader.close()


async def test_an_avro_client_at_the_end_gets_the_file_byte_for_byte(listener: Listener):
    client = await RawClient.connect(listener.port)
    await client.login("AVRO")
    await client.send(b"REQUEST-DATA shop.items\n")
    info = listener.server.context.catalog.tables[TableName("shop", "items")].latest()
    assert info is not None
    received = await client.read_exactly(info.committed)
    for i in range(20):
        await listener.commit_rows((10 + i, "tail"))
        received += await client.read_exactly(info.committed - len(received))
    with open(info.path, "rb") as f:
        assert received == f.read()
    await client.close()


def _avro_bytes(port: int, size: int) -> bytes:
    """An AVRO-mode client with a small receive buffer reading ``size`` bytes of data in
    small pieces: the server's socket fills and sendfile(2) has to wait for it."""
    sock = _stuck_client(port, "AVRO")
    sock.settimeout(30)
    reader = sock.makefile("rb", buffering=0)
    assert [reader.readline() for _ in range(2)] == [b"OK\n", b"OK\n"]
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(min(4096, size - len(data)))
        assert piece, "the server closed the connection"
        data += piece
    sock.close()
    return bytes(data)


async def test_a_large_file_in_avro_mode_arrives_whole_to_a_slow_reader(listener: Listener):
    for i in range(200):
        await listener.commit_rows(*[(100 + i * 50 + j, "y" * 2000) for j in range(50)])
    info = listener.server.context.catalog.tables[TableName("shop", "items")].latest()
    assert info is not None and info.committed > 20_000_000
    received = await asyncio.to_thread(_avro_bytes, listener.port, info.committed)
    with open(info.path, "rb") as f:
        assert received == f.read()


async def test_a_line_client_s_command_cut_by_the_network_is_read_whole():
    """After a client's first newline-terminated command, a write without one is the start
    of a line TCP cut (a GTID state of many domains in several segments): the reader waits
    for the rest. Before, each part was taken for a command: a request for 0-1-400 cut after
    "0-1-40" streamed from 40 (found by attack)."""
    stream = asyncio.StreamReader()
    reader = MessageReader(stream, 1 << 20)
    stream.feed_data(b"REGISTER UUID=u, TYPE=JSON\n")
    assert await reader.next() == b"REGISTER UUID=u, TYPE=JSON"
    reading = asyncio.ensure_future(reader.next())
    stream.feed_data(b"REQUEST-DATA db.t 0-1-40")
    await asyncio.sleep(LINE_REST / 5)
    assert not reading.done()
    stream.feed_data(b"0\n")
    assert await asyncio.wait_for(reading, 5) == b"REQUEST-DATA db.t 0-1-400"


async def test_a_command_without_its_newline_from_a_line_client_is_taken_after_a_moment():
    """A client that mixes the two (its login, or a command, ended by a newline, the next
    command written without one, then waiting for the reply) is answered: the bytes whose
    rest does not come within LINE_REST are a command."""
    stream = asyncio.StreamReader()
    reader = MessageReader(stream, 1 << 20)
    stream.feed_data(b"REGISTER UUID=u, TYPE=JSON\n")
    assert await reader.next() == b"REGISTER UUID=u, TYPE=JSON"
    stream.feed_data(b"REQUEST-DATA db.t")
    assert await asyncio.wait_for(reader.next(), 5) == b"REQUEST-DATA db.t"


async def test_a_maxscale_style_command_of_exactly_max_line_bytes_is_answered():
    """A write of exactly 65,536 bytes without a newline (the longest command max_line
    allows by default) fills one read: it was taken for the start of something longer and
    waited for the idle timeout. Its rest not coming within LINE_REST, it is a command; one
    byte more is too long."""
    stream = asyncio.StreamReader()
    reader = MessageReader(stream, 65536)
    command = b"QUERY-STATE" + b" " * (65536 - 11)
    stream.feed_data(command)
    assert await asyncio.wait_for(reader.next(), 5) == command
    stream.feed_data(command)
    nxt = asyncio.ensure_future(reader.next())
    await asyncio.sleep(LINE_REST / 5)
    stream.feed_data(b" ")  # the rest of the write: now one byte too long
    with pytest.raises(ProtocolError, match="at most 65536 bytes"):
        await asyncio.wait_for(nxt, 5)


async def test_a_login_ended_by_a_newline_leaves_the_commands_maxscale_style():
    """The library's SCRAM login ends its lines with a newline, and its commands have none
    (MaxScale would not parse them with one): those are commands at once, not lines."""
    stream = asyncio.StreamReader()
    reader = MessageReader(stream, 1 << 20)
    stream.feed_data(b"AUTH SCRAM-SHA-256 n,,n=u,r=x\n")
    assert await reader.next(lambda _: False) == b"AUTH SCRAM-SHA-256 n,,n=u,r=x"
    stream.feed_data(b"REGISTER UUID=u, TYPE=JSON")
    assert await asyncio.wait_for(reader.next(), LINE_REST / 5) == b"REGISTER UUID=u, TYPE=JSON"


async def test_a_maxscale_client_s_write_without_a_newline_is_still_a_command():
    stream = asyncio.StreamReader()
    reader = MessageReader(stream, 1 << 20)
    stream.feed_data(b"REGISTER UUID=u, TYPE=JSON")
    assert await reader.next() == b"REGISTER UUID=u, TYPE=JSON"
    stream.feed_data(b"REQUEST-DATA db.t")
    assert await reader.next() == b"REQUEST-DATA db.t"


async def test_a_gtid_state_naming_a_domain_twice_or_too_many_is_refused(listener: Listener):
    """One GTID per domain (protocol.md's grammar), and at most 1,024 domains: a repeated
    domain was taken silently, the last one winning (``AFTER 0-1-5,0-1-7`` streamed from
    8, ``0-1-7,0-1-5`` from 6), and states of thousands held memory and a check per
    commit for each waiting client (found by attack). The connection stays usable."""
    client = await RawClient.connect(listener.port)
    await client.login()
    for state, said in (("0-1-5,0-1-7", b"0 appears twice"), ("0-1-7,1-1-2,1-1-3",
                                                            b"1 appears twice"),
                        (",".join(f"{d}-1-1" for d in range(1025)),
                         b"at most 1024 domains, not 1025")):
        for command in (f"REQUEST-DATA shop.items AFTER {state}",
                        f"REQUEST-DATA shop.items UNTIL {state}",
                        f"QUERY-RANGE shop.items AFTER {state} LIMIT 5"):
            await client.send(command.encode() + b"\n")
            line = await client.line()
            assert line.startswith(b"ERR BAD-SYNTAX") and said in line, (command[:40], line)
    await client.send(b"REQUEST-DATA shop.items AFTER 0-1-1,1-1-1\n")
    assert (await client.json_line())["version"] == 1
    await client.close()


async def test_a_long_uuid_or_request_is_logged_cut(listener: Listener,
                                                    caplog: pytest.LogCaptureFixture):
    """A client's UUID and request are logged at most 300 characters each, saying how much
    more there was (a 60 KB UUID and a 44 KB GTID state were logged whole: found by
    attack)."""
    caplog.set_level(logging.INFO)
    client = await RawClient.connect(listener.port)
    await client.send(auth_message(USER, PASSWORD))
    assert await client.line() == b"OK\n"
    await client.send(b"REGISTER UUID=" + b"u" * 20_000 + b", TYPE=JSON\n")
    assert await client.line() == b"OK\n"
    state = ",".join(f"{d}-1-1" for d in range(1000))
    await client.send(f"REQUEST-DATA shop.items AFTER {state}\n".encode())
    assert (await client.json_line())["version"] == 1
    await client.close()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("cdcserver.protocol")]
    assert any("registered" in line and "more characters" in line for line in lines), lines
    assert any("REQUEST-DATA" in line and "more characters" in line for line in lines), lines
    assert max(len(line) for line in lines) < 500, max(lines, key=len)[:200]
