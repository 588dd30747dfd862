"""A dump's writing path without a server: rows encoded into given memory (encode_lines,
receive_lines), the body staged and written in aligned blocks (PartialDump, with and without
O_DIRECT), and a reader's buffer of blocks (rangebuffer.RangeBuffer)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import socket
import threading

import pytest

from cdcserver.core.names import TableName
from cdcserver.dump import partial as partial_module
from cdcserver.dump import rawrows
from cdcserver.dump.partial import ALIGN, STAGE, PartialDump, Progress

compiled = rawrows.compiled
needs_compiled = pytest.mark.skipif(compiled is None, reason="the C extension is not built")


def _prefixed(n: int) -> bytes:
    if n < 0xFB:
        return bytes([n])
    width = 2 if n < 1 << 16 else 3 if n < 1 << 24 else 8
    return bytes([{2: 0xFC, 3: 0xFD, 8: 0xFE}[width]]) + n.to_bytes(width, "little")


def _result(rnd: random.Random, columns: int, count: int, sizes: list[int]
            ) -> tuple[bytes, list[bytes]]:
    """Row packets and their EOF, and each row's form as the Python path writes it."""
    rows, packets = [], bytearray()
    for _ in range(count):
        payload = b"".join(b"\xfb" if rnd.random() < 0.2 else
                           _prefixed(n := rnd.choice(sizes)) + rnd.randbytes(n)
                           for _ in range(columns))
        packets += len(payload).to_bytes(3, "little") + b"\x00" + payload
        rows.append(rawrows._row(memoryview(payload), columns))
    packets += b"\x05\x00\x00\x00\xfe\x00\x00\x02\x00"
    return bytes(packets), rows


def _same_rows(data: bytes, rows: list[bytes], batch: int) -> None:
    """``data`` holds exactly ``rows`` as insert lines of at most ``batch`` rows."""
    expected = [rawrows.INSERT_PREFIX + b",".join(rows[i:i + batch]) + b"]}\n"
                for i in range(0, len(rows), batch)]
    assert data.replace(b"]}\n" + rawrows.INSERT_PREFIX, b",") == \
        b"".join(expected).replace(b"]}\n" + rawrows.INSERT_PREFIX, b",")
    for line in data.splitlines(keepends=True):
        assert line.startswith(rawrows.INSERT_PREFIX) and line.endswith(b"]}\n")
        assert line.count(b"],[") < batch


@needs_compiled
@pytest.mark.parametrize("simd", [True, False])
def test_rows_encoded_into_given_memory_are_the_python_paths(simd: bool) -> None:
    """encode_lines writes what parse_lines would, into the room it is given: as many rows
    as fit (OUT_FULL when the next does not; row_room says what an empty room needs), base64
    of every length through the AVX2 path and without it."""
    assert compiled is not None
    was = compiled.simd()
    compiled.simd(simd)
    try:
        for n in [*range(0, 130), 250, 251, 1000, 5000]:
            value = os.urandom(n)
            assert compiled.encode_row(_prefixed(n) + value, 1) == \
                b'["' + base64.b64encode(value) + b'"]'
        rnd = random.Random(3)
        for _ in range(300):
            columns = rnd.randint(1, 6)
            packets, rows = _result(rnd, columns, rnd.randint(1, 30),
                                    [0, 1, 2, 3, 31, 32, 33, 57, 250, 251, 300, 2000])
            batch = rnd.randint(1, 20)
            size = rnd.choice([80, 400, 3000, 100_000])
            out = bytearray(size)
            ends = [*sorted(rnd.sample(range(1, len(packets)), 2)), len(packets)]
            pos = at = count = 0
            got = bytearray()
            while True:
                state, pos, end, n, last = compiled.encode_lines(
                    packets, pos, ends[0], columns, batch, out, at, len(out))
                if n:
                    assert bytes(out[last:end - 3]) == rows[count + n - 1]
                    got += out[at:end]
                    count += n
                at = end
                if state == compiled.OUT_FULL:
                    length = int.from_bytes(packets[pos:pos + 3], "little")
                    need = compiled.row_room(length, columns)
                    if n == 0 and at == 0:
                        assert need > len(out)
                        out = bytearray(need)
                    elif len(out) - at < need:
                        at = 0
                elif state == compiled.NEED_MORE:
                    ends.pop(0)
                else:
                    break
            assert state == compiled.END and count == len(rows)
            _same_rows(bytes(got), rows, batch)
        for bad in (b"\x01ab", b"\xfc\x05", b"\xfe" + b"\xff" * 8, b"\x05ab"):
            packet = len(bad).to_bytes(3, "little") + b"\x00" + bad
            with pytest.raises(ValueError, match="does not hold its 1 columns"):
                compiled.encode_lines(packet, 0, len(packet), 1, 5, bytearray(500), 0, 500)
        with pytest.raises(ValueError, match="outside the output"):
            compiled.encode_lines(b"", 0, 0, 1, 1, bytearray(4), 0, 5)
    finally:
        compiled.simd(was)


@needs_compiled
def test_rows_received_and_encoded_without_python_between_receives() -> None:
    """receive_lines reads a socket into the receive buffer as it encodes (the unparsed
    rest moved to the front first), until ``want`` bytes are written, the result ends, the
    room is full or a packet is longer than the buffer; CLOSED when the peer goes away."""
    assert compiled is not None
    rnd = random.Random(4)
    for trial in range(40):
        columns = rnd.randint(1, 5)
        packets, rows = _result(rnd, columns, rnd.randint(1, 300),
                                [0, 3, 40, 250, 251, 900])
        ours, theirs = socket.socketpair()

        def send(data: bytes = packets, peer: socket.socket = theirs,
                 close: bool = trial % 5 == 4) -> None:
            at = 0
            while at < len(data):
                step = rnd.randint(1, 3000)
                peer.sendall(data[at:at + step])
                at += step
            if close:
                peer.close()  # then: the end packet arrives before the close

        sender = threading.Thread(target=send)
        sender.start()
        buf = bytearray(rnd.choice([2048, 8192, 1 << 16]))
        out = bytearray(1 << 16)
        pos = end = count = 0
        batch = rnd.randint(1, 40)
        got = bytearray()
        try:
            while True:
                state, pos, end, o, n, last, err = compiled.receive_lines(
                    ours.fileno(), buf, pos, end, columns, batch, out, 0, len(out),
                    rnd.choice([1, 500, 1 << 20]))
                assert err == 0
                if n:
                    assert bytes(out[last:o - 3]) == rows[count + n - 1]
                    got += out[:o]
                    count += n
                if state == compiled.NEED_MORE and end - pos == len(buf):
                    buf.extend(bytes(len(buf)))  # a packet longer than the buffer
                elif state != compiled.NEED_MORE and state != compiled.OUT_FULL:
                    break
            assert state == compiled.END and count == len(rows)
            assert bytes(buf[pos:end]) == packets[-9:]
            _same_rows(bytes(got), rows, batch)
        finally:
            sender.join()
            theirs.close()
            ours.close()
    ours, theirs = socket.socketpair()
    theirs.sendall(packets[:100])
    theirs.close()
    state, *_ = compiled.receive_lines(ours.fileno(), bytearray(1 << 16), 0, 0, columns, 5,
                                       bytearray(1 << 16), 0, 1 << 16, 1 << 20)
    ours.close()
    assert state == compiled.CLOSED


def _record(reserved: int = 5000) -> Progress:
    return Progress(TableName("db", "t"), {"gtid": "", "file": "f", "pos": 4,
                                           "taken": "2026-01-01T00:00:00+00:00"},
                    "fields", 1, reserved)


@pytest.mark.parametrize("direct", [True, False])
def test_a_staged_body_is_written_whole_in_aligned_blocks(
        tmp_path, monkeypatch: pytest.MonkeyPatch, direct: bool) -> None:
    """Bytes written and rows encoded into the staging area land in the file in order,
    whatever their sizes and however they fall on block boundaries; made durable (sync,
    checkpoint) or closed midway, continued after a crash (reopen: cut to the good bytes,
    re-hashed), finished with the header in its room and the SHA-256 of the body. With
    O_DIRECT where the file system takes it, else through the page cache."""
    monkeypatch.setattr(partial_module, "DIRECT_WRITES", direct)
    rnd = random.Random(5)
    dump = PartialDump(str(tmp_path), TableName("db", "t"))
    dump.create(_record())
    if not direct:
        assert dump._direct is None
    took_direct = dump._direct is not None  # (False on a file system without O_DIRECT)
    body = bytearray()
    for i in range(400):
        size = rnd.choice([1, 7, ALIGN - 1, ALIGN, ALIGN + 1, 100_000, STAGE - 3, STAGE + 5])
        data = rnd.randbytes(size)
        if i % 2:
            dump.write(data)
        elif (room := dump.space(min(size, STAGE))) is not None:
            area, at, limit = room
            take = min(size, limit - at)
            area[at:at + take] = data[:take]
            dump.wrote(at + take)
            data = data[:take]
        else:
            dump.write(data)
        body += data
        if i % 97 == 0:
            dump.sync()
            with open(dump.path, "rb") as f:
                assert f.read()[5000:] == body  # durable so far, the staged tail included
        if len(body) > 40 * STAGE:
            break
    assert dump.size == 5000 + len(body)
    assert (dump._direct is not None) == took_direct  # no write fell back
    dump.checkpoint()
    dump.close()

    again = PartialDump(str(tmp_path), TableName("db", "t"))
    record = again.load_progress()
    assert record is not None and record.body == len(body)
    with open(dump.path, "ab") as f:
        f.write(b"left by a crash")
    good = len(body) - 12345
    record.body = good
    again.reopen(record)
    del body[good:]
    for size in (3, ALIGN * 2 + 1, 999_999):
        data = rnd.randbytes(size)
        again.write(data)
        body += data
    path = again.finish({"format": "test"}, "t.dump")
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        assert f.read() == body
    assert header["checksum"] == "sha256:" + hashlib.sha256(body).hexdigest()
    assert not os.path.exists(again.path) and not os.path.exists(again.progress_path)


def test_a_reader_buffer_of_blocks_keeps_pieces_in_order(tmp_path) -> None:
    """Rows encoded into a buffer's blocks and bytes written to it come out in the order
    they went in, in memory and after it spilled to a file; its blocks go back to the pool
    when drained."""
    from cdcserver.dump.rangebuffer import Blocks, RangeBuffer

    blocks = Blocks()
    rnd = random.Random(6)
    for limit in (1 << 30, 3 * Blocks.SIZE // 2):
        buffer = RangeBuffer(limit, str(tmp_path), blocks)
        expected = bytearray()
        for i in range(60):
            data = rnd.randbytes(rnd.choice([1, 1000, 300_000, Blocks.SIZE // 3]))
            if i % 3 == 0:
                buffer.write(data)
            else:
                room = buffer.space(len(data))
                assert room is not None
                area, at, _ = room
                area[at:at + len(data)] = data
                buffer.wrote(at + len(data))
            expected += data
        assert buffer.tell() == len(expected)
        assert (buffer.spill is not None) == (limit < len(expected))
        assert buffer.space(Blocks.SIZE + 1) is None  # more than a block: as bytes
        out = bytearray()
        buffer.drain(out.extend)
        assert out == expected and buffer.tell() == 0 and not buffer.taken
        buffer.close()
    assert blocks.free
    blocks.close()
    assert not blocks.free
