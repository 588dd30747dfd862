"""The client library and the `cdc` command against a server that lies: a dump's name that is
a path, a size that is not one, text full of terminal escapes, a schema and then an error
over and over. The real service never sends these, so a small server here plays the hostile
one (a stand-in by necessity: what is tested is the client's defence). It accepts any
MaxScale login (it refuses SCRAM, as MaxScale does), REGISTER, then answers the first command
with the scenario's bytes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mariadb_cdc_client.aio import CdcClient
from mariadb_cdc_client.format.avro import AvroFormatError, container_header, write_varint
from mariadb_cdc_client.format.dump import DumpError
from mariadb_cdc_client.stream import StreamFormatError
from mariadb_cdc_client.sync import SyncCdcClient

SCHEMA = (b'{"namespace":"MaxScaleChangeDataSchema.avro","type":"record","name":"ChangeRecord",'
          b'"database":"db","table":"t","version":1,"gtid":"0-1-1","fields":['
          b'{"name":"domain","type":"int"},{"name":"server_id","type":"int"},'
          b'{"name":"sequence","type":"long"},{"name":"event_number","type":"int"},'
          b'{"name":"timestamp","type":"long"},{"name":"event_type","type":{"type":"enum",'
          b'"name":"EVENT_TYPES","symbols":["insert","update_before","update_after","delete"]}},'
          b'{"name":"id","type":["null","long"],"real_type":"int","length":-1}]}\n')


class HostileServer:
    """Answers the first command after REGISTER with ``answer``, then hangs up (or with
    ``keep_open``, stays silent until closed); counts them."""

    def __init__(self, answer: bytes, keep_open: bool = False) -> None:
        self.answer = answer
        self.keep_open = keep_open
        self.answered = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    if data.startswith(b"AUTH SCRAM"):
                        conn.sendall(b"ERR UNKNOWN-COMMAND\n")
                    elif data.startswith((b"REQUEST-", b"LIST-", b"QUERY-")):
                        self.answered += 1
                        conn.sendall(self.answer)
                        while self.keep_open and not self._stop:
                            time.sleep(0.1)
                        return
                    else:
                        conn.sendall(b"OK\n")  # a MaxScale login (hex), REGISTER
            except OSError:
                return

    def close(self) -> None:
        self._stop = True
        self._sock.close()


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileServer]]:
    servers: list[HostileServer] = []

    def start(answer: bytes, keep_open: bool = False) -> HostileServer:
        server = HostileServer(answer, keep_open)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def cdc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = os.path.join(os.path.dirname(sys.executable), "cdc")
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, check=False)


def clean_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


@pytest.mark.parametrize("name", ["../../escaped.dump", "{tmp}/absolute.dump", ".bashrc",
                                  "db.t.20261121T093000-123456Z.dump/../../x"])
def test_a_dump_name_that_is_a_path_is_refused_and_nothing_is_written(
        hostile, tmp_path: Path, name: str):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    server = hostile(f"OK 10 {name.format(tmp=tmp_path)}\n".encode() + b"PWNED1234\n")
    error = clean_error(cdc("dump", "db.t", "--port", str(server.port), "-u", "u", "-p", "p",
                            cwd=work))
    assert "not a dump's name" in error
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("reply", ["OK abc db.t.20261121T093000-123456Z.dump", "OK",
                                   "OK -5 db.t.20261121T093000-123456Z.dump"])
def test_a_dump_reply_without_a_size_is_a_clear_error(hostile, tmp_path: Path, reply: str):
    server = hostile(reply.encode() + b"\n")
    error = clean_error(cdc("dump", "db.t", "--port", str(server.port), "-u", "u", "-p", "p",
                            cwd=tmp_path))
    assert "not OK <bytes> <name>" in error
    assert list(tmp_path.iterdir()) == []


def test_a_dump_whose_header_is_not_one_is_a_clear_error_and_leaves_no_file(
        hostile, tmp_path: Path):
    body = b'{"database": "db"}\nrest\n'
    name = "db.t.20261121T093000-123456Z.dump"
    server = hostile(f"OK {len(body)} {name}\n".encode() + body)
    error = clean_error(cdc("dump", "db.t", "--port", str(server.port), "-u", "u", "-p", "p",
                            cwd=tmp_path))
    assert "not a dump header" in error
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_the_name_too(hostile, tmp_path: Path):
    server = hostile(b"OK 10 ../../x\nPWNED1234\n")
    client = SyncCdcClient("127.0.0.1", server.port, "u", "p")
    with pytest.raises(DumpError, match="not a dump's name"):
        client.fetch_dump("db.t", str(tmp_path / "out.dump"))


def _dump_reply(body: bytes, checksum: str) -> bytes:
    """A dump server's answer: ``OK <size> <name>``, a dump header, ``body``."""
    header = {"format": "cdc-dump/1", "database": "db", "table": "t",
              "schema": json.loads(SCHEMA), "gtid": "0-1-1",
              "binlog": {"file": "mysql-bin.000001", "pos": 4}, "rows": 1,
              "checksum": checksum, "created": "2026-11-21T09:30:00Z", "stream_version": 1}
    dump = json.dumps(header).encode() + b"\n" + body
    return f"OK {len(dump)} db.t.20261121T093000-123456Z.dump\n".encode() + dump


def _fetch_dump(library: str, port: int, path: Path) -> object:
    if library == "sync":
        return SyncCdcClient("127.0.0.1", port, "u", "p").fetch_dump("db.t", str(path))
    return asyncio.run(CdcClient("127.0.0.1", port, "u", "p").fetch_dump("db.t", str(path)))


BODY = b'{"action": "insert", "rows": [["MQ=="]]}\n'


@pytest.mark.parametrize("library", ["sync", "asyncio"])
def test_the_library_saves_a_corrupt_dump_nowhere_and_leaves_the_file_there_alone(
        hostile, tmp_path: Path, library: str):
    """A dump whose checksum does not match was left at the caller's path, looking like a
    dump; now it is written beside, as path.part, and removed: the path keeps what it had."""
    server = hostile(_dump_reply(BODY, "sha256:" + "0" * 64))
    path = tmp_path / "saved.dump"
    path.write_bytes(b"yesterday's dump")
    with pytest.raises(DumpError, match="checksum"):
        _fetch_dump(library, server.port, path)
    assert [p.name for p in tmp_path.iterdir()] == ["saved.dump"]
    assert path.read_bytes() == b"yesterday's dump"


@pytest.mark.parametrize("library", ["sync", "asyncio"])
def test_the_library_saves_a_whole_dump_under_the_callers_path(
        hostile, tmp_path: Path, library: str):
    reply = _dump_reply(BODY, "sha256:" + hashlib.sha256(BODY).hexdigest())
    server = hostile(reply)
    path = tmp_path / "saved.dump"
    header = _fetch_dump(library, server.port, path)
    assert header.rows == 1  # type: ignore[attr-defined]
    assert [p.name for p in tmp_path.iterdir()] == ["saved.dump"]
    assert path.read_bytes() == reply.split(b"\n", 1)[1]


def test_a_schema_then_an_error_backs_off_and_max_retries_holds(hostile):
    """A quarantined table's stream (MaxScale's clients see the same): its schema, then ERR
    QUARANTINED, a retriable error. A schema alone is not a record: the failures count on,
    the waits grow, and max_retries ends it."""
    server = hostile(SCHEMA + b"ERR QUARANTINED the table is being resynced\n")
    client = SyncCdcClient("127.0.0.1", server.port, "u", "p", max_retries=3)
    started = time.monotonic()
    with pytest.raises(Exception, match="QUARANTINED"):
        for _ in client.stream("db.t"):
            pass
    assert server.answered == 4  # the first request and three more
    assert time.monotonic() - started >= 0.1 + 0.5 + 1  # DELAYS' first three waits


@pytest.mark.parametrize("command", [("db.t",), ("dump", "db.t"), ("dumps",)])
def test_a_servers_error_reaches_the_terminal_escaped_and_cut(hostile, tmp_path: Path,
                                                             command: tuple[str, ...]):
    """Escape sequences (clear the screen, set the window's title), a carriage return that
    would overwrite the line with another, a right-to-left override, 100,000 characters."""
    evil = "\x1b[2J\x1b]0;owned\x07 \rcdc: saved\u202e " + "A" * 100_000
    server = hostile(f"ERR NO-FILE {evil}\n".encode())
    error = clean_error(cdc(*command, "--port", str(server.port), "-u", "u", "-p", "p",
                            cwd=tmp_path))
    assert not any(c in error[:-1] for c in "\x1b\x07\r\u202e"), error[:200]
    assert error.count("\n") == 1 and "\\x1b[2J" in error, error[:200]
    assert len(error) < 3000 and "more characters" in error


def _dripping_server(piece: bytes, every: float, pieces: int) -> tuple[int, socket.socket]:
    """A server that answers a connection with ``pieces`` copies of ``piece``, one every
    ``every`` seconds, never a newline, then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                for _ in range(pieces):
                    conn.sendall(piece)
                    time.sleep(every)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], listener


def test_a_login_answer_sent_a_byte_at_a_time_times_out_as_a_whole():
    """The timeout is the answer's, not each byte's: a server dripping a byte every 0.2 s
    for a minute held the blocking client until it stopped. TimeoutError, not the hang-up
    that ends the drip, says the client gave up first."""
    port, listener = _dripping_server(b"O", 0.2, 300)
    with listener, pytest.raises(TimeoutError, match="did not come whole within 2 s"):
        SyncCdcClient("127.0.0.1", port, "u", "p", timeout=2.0, auth="legacy").connect()


def test_a_login_answer_without_end_is_refused_past_its_limit():
    port, listener = _dripping_server(b"O" * (1 << 20), 0, 40)  # 40 MB, no newline
    with listener, pytest.raises(ValueError, match="longer than 16777216 bytes"):
        SyncCdcClient("127.0.0.1", port, "u", "p", auth="legacy").connect()


@pytest.mark.parametrize("block, error", [
    (write_varint(1 << 40) + write_varint(8) + b"\x00" * 8, "1099511627776 records"),
    (write_varint(1) + write_varint(1 << 50), "claims 1125899906842624 bytes"),
    (write_varint(3) + write_varint(8) + b"\x02" * 8, "does not decode"),
])
def test_a_corrupt_avro_block_is_a_format_error_not_a_connection_to_retry(
        hostile, block: bytes, error: str):
    """A block that claims more than it holds or than a client takes, or that does not
    decode, is the stream's error at once (AvroFormatError, final): not read further into
    memory, and not taken for a lost connection retried without end."""
    sync = b"S" * 16
    header = container_header(SCHEMA.rstrip(b"\n").decode(), "null", sync)
    server = hostile(header + block + (sync if len(block) < 40 else b""))
    client = SyncCdcClient("127.0.0.1", server.port, "u", "p", format="AVRO", max_retries=3)
    with pytest.raises(AvroFormatError, match=error):
        for _ in client.stream("db.t"):
            pass
    assert server.answered == 1


@pytest.mark.parametrize("line, error", [
    (b'{"id": 1}\n', "KeyError"),  # no metadata
    (b'{"namespace": "x", "fields": "not a list"}\n', "neither a schema"),
])
def test_a_json_line_that_is_not_a_record_of_its_schema_is_a_clear_error(
        hostile, line: bytes, error: str):
    server = hostile(SCHEMA + line)
    client = SyncCdcClient("127.0.0.1", server.port, "u", "p", max_retries=0)
    with pytest.raises(StreamFormatError, match=error):
        for _ in client.stream("db.t"):
            pass


@pytest.mark.parametrize("answer", [b'{"dumps": 5}', b"[1, 2]", b'{"dumps": ["x"]}'])
def test_a_query_answer_of_the_wrong_shape_is_a_clear_error(hostile, tmp_path: Path,
                                                            answer: bytes):
    server = hostile(answer + b"\n")
    error = clean_error(cdc("dumps", "--port", str(server.port), "-u", "u", "-p", "p",
                            cwd=tmp_path))
    assert "the server's answer" in error


def test_a_server_stopping_inside_a_line_is_a_failure_not_the_quiet_end_of_the_stream(
        hostile):
    """With ``idle_timeout``, a quiet stream ends the iteration; a server that stopped in the
    middle of a line has not gone quiet, it stalled: the client reconnects (and here, its
    retries spent, raises), rather than end as if the table had nothing more."""
    server = hostile(SCHEMA + b'{"domain": 0, "server_id": 1, "seq', keep_open=True)
    client = SyncCdcClient("127.0.0.1", server.port, "u", "p", max_retries=1)
    # (idle_timeout runs from the request: a stand-in server answering later than it
    # would look like a quiet stream, so it is not short)
    with pytest.raises(TimeoutError, match="stopped inside a message"):
        for _ in client.stream("db.t", idle_timeout=3.0):
            pass
    assert server.answered == 2
