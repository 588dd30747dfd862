"""Big values in JSON mode: a block too big to hold goes out in pieces (``protocol/bigjson.py``),
the very lines the whole-block renderer writes, and a client that does not read holds no copy
of the values (issue 49, finding 5)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time

import pytest

from cdcserver.core.names import TableName
from cdcserver.protocol import bigjson, blockdata
from cdcserver.protocol.dialect import JsonStyle
from cdcserver.protocol.render import EXACT, json_block
from cdcserver.store.avrofile import scan_blocks
from mariadb_cdc_client.format.wire import Dialect
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import RawClient, until

pytestmark = pytest.mark.mariadb

MIB = 1 << 20


def _big_rows(source: Source, table: str, sizes: list[int], seed: int) -> list[tuple]:
    """Rows of (id, short text, big text, big blob, small int) written in one transaction
    each, and the values written (the oracle)."""
    rnd = random.Random(seed)
    alphabet = "aé€🎉\"\\{}\n\t\x01<>/ xyz"
    rows = []
    conn = source.server.connect()
    try:
        with conn.cursor() as cur:
            for i, size in enumerate(sizes, 1):
                text = "".join(rnd.choice(alphabet) for _ in range(64)) * (size // 64 or 1)
                blob = bytes(rnd.randrange(256) for _ in range(256)) * (size // 256 or 1)
                rows.append((i, f"row {i}", text, blob, i * 7))
                cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)", rows[-1])
                conn.commit()
    finally:
        conn.close()
    return rows


def _make_table(source: Source) -> str:
    table = f"`{source.database}`.big"
    source.execute("SET GLOBAL max_allowed_packet = 67108864",
                   f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(20), "
                   "body LONGTEXT, data LONGBLOB, n INT) DEFAULT CHARSET=utf8mb4")
    return table


async def _lines_of(info, block, fd, style, accepts=None) -> bytes:
    out = bytearray()

    async def send(data: bytes) -> None:
        assert len(data) <= max(bigjson.RUN_BYTES, bigjson.PIECE) + 2 * bigjson.LARGE_VALUE
        out.extend(data)

    await bigjson.send_large_block(info, block, fd, style, send, lambda n: None, accepts)
    return bytes(out)


@pytest.mark.parametrize("codec", ["null", "deflate", "zstandard", "snappy"])
async def test_large_blocks_go_out_as_the_lines_the_block_renderer_writes(
        source: Source, users_file: str, tmp_path, codec: str):
    table = _make_table(source)
    sizes = [100, 3 * MIB, 70_000, 200, 2 * MIB + 5]
    _big_rows(source, table, sizes, seed=20261202)
    source.execute(f"UPDATE {table} SET n = n + 1",  # an update's two images, one block
                   f"INSERT INTO {table} SELECT id + 100, name, 'small', NULL, n FROM {table}")
    cdc = await start_service(make_config(str(tmp_path / "data"), source.url, users_file,
                                          store={"codec": codec}))
    try:
        await cdc.caught_up(source)
        entry = cdc.service.data.catalog.get(TableName(source.database, "big"))
        assert entry is not None
        info = entry.latest()
        fd = os.open(info.path, os.O_RDONLY)
        try:
            blocks = list(scan_blocks(info.path, info.header, info.header.size,
                                      info.committed, fd))
            assert sum(blockdata.large(info, b, fd) for b in blocks) >= 3
            for style in (EXACT, JsonStyle(Dialect.MAXSCALE)):
                for block in blocks:
                    expected = json_block(info, block, style)
                    assert await _lines_of(info, block, fd, style) == expected
                    # and with a filter that drops every other record
                    kept = await _lines_of(info, block, fd, style,
                                           lambda r: r["sequence"] % 2 == 0)
                    lines = expected.splitlines(keepends=True)
                    assert kept == b"".join(line for line in lines
                                            if int(line.split(b'"sequence": ')[1]
                                                   .split(b",")[0]) % 2 == 0)
        finally:
            os.close(fd)
    finally:
        await cdc.stop()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _stalled_client(port: int, request: bytes) -> RawClient:
    """A client that asks for the table and then reads nothing: a receive buffer of 4 KiB."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    client = RawClient(reader, writer)
    await client.login("JSON")
    await client.send(request)
    return client


async def test_json_clients_that_do_not_read_hold_no_copy_of_big_values(
        cdc: RunningService, source: Source):
    table = _make_table(source)
    rows = _big_rows(source, table, [8 * MIB, 8 * MIB], seed=7)
    await cdc.caught_up(source)
    request = f"REQUEST-DATA {source.database}.big".encode()

    # one client that reads: every value whole and exact, against what was written
    reader = RawClient(*await asyncio.open_connection("127.0.0.1", cdc.port, limit=1 << 27))
    await reader.login("JSON")
    await reader.send(request)
    await reader.line()  # the schema
    for row in rows:
        record = json.loads(await reader.line(timeout=60))
        assert (record["id"], record["name"], record["body"], bytes.fromhex(record["data"]),
                record["n"]) == row
    await reader.close()

    assert cdc.service.listener.server is not None
    traffic = cdc.service.listener.server.traffic
    before, sent_before = _rss(), traffic.bytes_sent
    clients = [await _stalled_client(cdc.port, request) for _ in range(8)]
    try:
        last = [traffic.bytes_sent, time.monotonic()]  # bytes sent, and since when

        def settled() -> bool:  # the clients' sockets are full: nothing has moved for 1 s
            if traffic.bytes_sent != last[0]:
                last[:] = [traffic.bytes_sent, time.monotonic()]
            return time.monotonic() - last[1] >= 1.0

        await until(settled, timeout=30, what="the stalled clients' sockets to fill")
        sent = traffic.bytes_sent
        grown = _rss() - before
        assert sent - sent_before > 8 * bigjson.PIECE  # each was sent what it could take
        # whole blocks rendered per client held the block and its rendering (8 MiB of text,
        # 16 MiB of hex): about 250 MiB for the eight
        assert grown < 24 * MIB, f"RSS grew {grown / MIB:.0f} MiB with 8 stalled clients"
    finally:
        for client in clients:
            client.writer.transport.abort()
            client.writer.close()
