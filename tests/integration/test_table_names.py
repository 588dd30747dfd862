"""Every table LIST-TABLES shows can be requested (issue 15, item 9): databases and tables named
with a space, a dot, a backquote, a quote, a comma, a hyphen, Unicode, a tab or a line break,
against the real MariaDB and service.

Each table is requested over a raw socket by the ``ref`` LIST-TABLES gives it, and the table
rebuilt from its stream by ``tests/oracle.py`` must equal ``SELECT`` on the source; then the
same through the client library, the ``cdc`` command, QUERY-RANGE, the dump commands and the
Spark source. A name sent without its quotes gets an error saying how to quote it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import dump_tables
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client.cli import main as cdc_main
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, RawClient
from tests.oracle import (
    column_types,
    compare,
    null_by_default,
    primary_key,
    read_stream,
    rebuild,
    source_rows,
)

pytestmark = pytest.mark.mariadb

# Databases of this test besides the source's own (t_: the source fixture drops them too).
DATABASES = ["t_my db", "t_dot.ted", "t_back`quote", "t_hy-phen", "t_ünï cödé"]
# Tables in the source's database; each database above gets "plain" and "sp ace".
TABLES = ["sp ace", "a.b", "a`b", "hy-phen", "日本 表", "x,y", 'say "hi"', "line\nbreak",
          " lead", "tab\tx", "plain", "000001", "`q`"]


def sql_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_table(database: str, table: str) -> str:
    return f"{sql_name(database)}.{sql_name(table)}"


@pytest.fixture
def odd_tables(source: Source) -> Iterator[list[tuple[str, str]]]:
    """The tables, created and written to: inserts, an update and a delete each. The
    databases are dropped afterwards here (the fixture's DROP does not quote a backquote)."""
    tables = [(source.database, t) for t in TABLES]
    tables += [(d, t) for d in DATABASES for t in ("plain", "sp ace")]
    source.execute(*(f"DROP DATABASE IF EXISTS {sql_name(d)}" for d in DATABASES),
                   *(f"CREATE DATABASE {sql_name(d)}" for d in DATABASES))
    try:
        for number, (database, table) in enumerate(tables):
            name = sql_table(database, table)
            source.execute(
                f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(40))",
                *(f"INSERT INTO {name} VALUES ({i}, 'row {i} of {number}')" for i in range(5)),
                f"UPDATE {name} SET v = 'changed' WHERE id = 2",
                f"DELETE FROM {name} WHERE id = 3")
        yield tables
    finally:
        source.execute(*(f"DROP DATABASE IF EXISTS {sql_name(d)}" for d in DATABASES))


async def _command(port: int, line: str, dialect: str | None = None) -> bytes:
    """One command on a fresh connection; its reply line."""
    client = await RawClient.connect(port)
    try:
        await client.login(dialect=dialect)
        await client.send(line.encode() + b"\n")
        return await client.line()
    finally:
        await client.close()


async def _listed(port: int) -> dict[tuple[str, str], str]:
    """LIST-TABLES: each table's request name (its "ref"), by (database, table)."""
    reply = json.loads(await _command(port, "LIST-TABLES"))
    return {(t["database"], t["table"]): t["ref"] for t in reply["tables"]}


def _assert_stream_is_table(conn: Any, database: str, table: str,
                            lines: list[dict[str, Any]]) -> None:
    """Rebuild the table from its stream (tests/oracle.py) and compare it with the table on
    the source."""
    assert lines and lines[0]["database"] == database and lines[0]["table"] == table
    types = column_types(conn, database, table)
    rows = source_rows(conn, database, table, types, from_clause=sql_table(database, table))
    rebuilt = rebuild(lines, primary_key(conn, database, table))
    comparison = compare(rebuilt, rows, types, null_by_default(conn, database, table))
    assert comparison.equal, f"{database}.{table}: {comparison}"


async def test_every_listed_table_can_be_requested_by_its_listed_name(
        cdc: RunningService, source: Source, odd_tables: list[tuple[str, str]]):
    await cdc.caught_up(source)
    listed = await _listed(cdc.port)
    assert set(odd_tables) <= set(listed), "a table the source has is not listed"
    # each requested over a raw socket by the name LIST-TABLES gives
    streams = await asyncio.gather(*(
        read_stream(cdc.port, "", user=USER, password=PASSWORD, quiet=0.5,
                    request=f"REQUEST-DATA {listed[table]}") for table in odd_tables))
    conn = source.server.connect()
    try:
        for (database, table), lines in zip(odd_tables, streams, strict=True):
            await asyncio.to_thread(_assert_stream_is_table, conn, database, table, lines)
    finally:
        conn.close()
    for lines in streams:
        assert [r["event_type"] for r in lines if "event_type" in r] == \
            ["insert"] * 5 + ["update_before", "update_after", "delete"]
    # Ordinary names stay MaxScale's: bare.
    assert listed[source.database, "plain"] == f"{source.database}.plain"
    assert listed["t_hy-phen", "plain"] == "t_hy-phen.plain"


async def test_replies_and_errors_name_tables_as_requests_do(
        cdc: RunningService, source: Source, odd_tables: list[tuple[str, str]]):
    await cdc.caught_up(source)
    listed = await _listed(cdc.port)
    db = source.database
    spaced = listed[db, "sp ace"]

    # The request: a name with a space, sent bare, is not "not a GTID: 'ace'".
    assert await _command(cdc.port, f"REQUEST-DATA {db}.sp ace") == \
        f"ERR BAD-SYNTAX a name containing a space must be quoted: {spaced}\n".encode()
    assert await _command(cdc.port, "REQUEST-DATA t_my db.sp ace 0-1-1") == \
        b"ERR BAD-SYNTAX a name containing a space must be quoted: `t_my db`.`sp ace`\n"
    # An unknown table, or version, says so.
    assert await _command(cdc.port, f"REQUEST-DATA {db}.`no such`", "EXACT") == \
        f"ERR NO-FILE File '{db}.`no such`.000001.avro' not found. (unknown table " \
        f"{db}.`no such`)\n".encode()
    assert await _command(cdc.port, f"REQUEST-DATA {spaced}.000002", "EXACT") == \
        f"ERR NO-FILE File '{spaced}.000002.avro' not found. ({spaced} has version " \
        "000001)\n".encode()

    # QUERY-TRANSACTION names the tables as LIST-TABLES does.
    source.execute(f"INSERT INTO {sql_table(db, 'a.b')} VALUES (10, 'x')")
    await cdc.caught_up(source)
    last = json.loads(await _command(cdc.port, "QUERY-LAST-TRANSACTION"))
    assert last["tables"] == [listed[db, "a.b"]] == [f"{db}.`a.b`"]
    dotted = f"INSERT INTO {sql_table('t_dot.ted', 'sp ace')} VALUES (10, 'x')"
    source.execute(dotted)
    await cdc.caught_up(source)
    last = json.loads(await _command(cdc.port, "QUERY-LAST-TRANSACTION"))
    assert last["tables"] == [listed["t_dot.ted", "sp ace"]] == ["`t_dot.ted`.`sp ace`"]

    # QUERY-RANGE takes the quoted name: the table's 8 records are in range.
    odd = listed["t_back`quote", "sp ace"]
    assert odd == "`t_back``quote`.`sp ace`"
    reply = json.loads(await _command(cdc.port, f"QUERY-RANGE {odd} LIMIT 100"))
    assert reply["events"] == 8 and reply["next"] is None

    # Dumps: listed and sent by the quoted name.
    address = parse_source_url(source.url)
    data_dir = cdc.service.config.store.data_dir
    for database, table in ((db, "line\nbreak"), ("t_back`quote", "sp ace")):
        await asyncio.to_thread(dump_tables, address, data_dir, [TableName(database, table)])
        ref = listed[database, table]
        dumps = json.loads(await _command(cdc.port, f"LIST-DUMPS {ref}"))["dumps"]
        assert [(d["database"], d["table"], d["ref"]) for d in dumps] == [(database, table, ref)]
        client = await RawClient.connect(cdc.port)
        try:
            await client.login()
            await client.send(f"REQUEST-DUMP {ref}\n".encode())
            ok, size, name = (await client.line()).decode().split()
            assert ok == "OK" and name == dumps[0]["name"]
            header = json.loads((await client.read_exactly(int(size))).split(b"\n")[0])
            assert (header["database"], header["table"]) == (database, table)
        finally:
            await client.close()
    assert await _command(cdc.port, f"REQUEST-DUMP {listed[db, 'a.b']}") == \
        f"ERR NO-FILE no dump of {db}.`a.b`\n".encode()


async def test_the_client_library_and_the_cdc_command_take_quoted_names(
        cdc: RunningService, source: Source, odd_tables: list[tuple[str, str]],
        capfdbinary: pytest.CaptureFixture[bytes]):
    await cdc.caught_up(source)
    listed = await _listed(cdc.port)
    db = source.database
    picked = [(db, "line\nbreak"), (db, "a`b"), (db, "x,y"), ("t_dot.ted", "sp ace"),
              ("t_ünï cödé", "plain")]

    def read(table: str | tuple[str, str]) -> list[tuple[int, str]]:
        with SyncCdcClient("127.0.0.1", cdc.port, USER, PASSWORD) as client:
            return [(e.values["id"], e.event_type) for e in client.stream(table, idle_timeout=1)
                    if isinstance(e, ChangeRecord)]

    for database, table in picked:
        by_ref, by_names = await asyncio.gather(
            asyncio.to_thread(read, listed[database, table]),
            asyncio.to_thread(read, (database, table)))
        assert by_ref == by_names == [(0, "insert"), (1, "insert"), (2, "insert"),
                                      (3, "insert"), (4, "insert"), (2, "update_before"),
                                      (2, "update_after"), (3, "delete")]

    options = ["-h", "127.0.0.1", "-P", str(cdc.port), "-u", USER, "-p", PASSWORD, "-t", "1"]
    assert await asyncio.to_thread(cdc_main, [*options, listed["t_my db", "sp ace"]]) == 0
    lines = [json.loads(line) for line in capfdbinary.readouterr().out.splitlines()]
    assert (lines[0]["database"], lines[0]["table"]) == ("t_my db", "sp ace")
    assert [line["id"] for line in lines[1:]] == [0, 1, 2, 3, 4, 2, 2, 3]
    assert await asyncio.to_thread(cdc_main, [*options, "t_my db.sp ace"]) == 2
    assert capfdbinary.readouterr().err == \
        b"cdc: a name containing a space must be quoted: `t_my db`.`sp ace`\n"


@pytest.mark.spark
async def test_the_spark_source_reads_quoted_names_and_lists(
        cdc: RunningService, source: Source, odd_tables: list[tuple[str, str]], spark: Any):
    await cdc.caught_up(source)
    listed = await _listed(cdc.port)
    db = source.database
    options = {"host": cdc.host, "port": str(cdc.port), "user": USER, "password": PASSWORD,
               # a list with a comma inside a quoted name, and a pattern inside quotes
               "tables": f"{db}.`x,y`, `t_my db`.*, {db}.`a*`",
               "maxRowsPerPartition": "3"}  # QUERY-RANGE with quoted names, too

    def batch() -> list[tuple[str, int, str]]:
        df = spark.read.format("cdc").options(**options).load()
        rows = df.orderBy("_table", "domain", "sequence", "event_number").collect()
        return [(r["_table"], r["id"], r["event_type"]) for r in rows]

    rows = await asyncio.to_thread(batch)
    wanted = sorted(listed[t] for t in ((db, "x,y"), ("t_my db", "plain"), ("t_my db", "sp ace"),
                                        (db, "a.b"), (db, "a`b")))
    assert sorted({table for table, _, _ in rows}) == wanted
    for table in wanted:
        assert [(i, e) for t, i, e in rows if t == table] == [
            (0, "insert"), (1, "insert"), (2, "insert"), (3, "insert"), (4, "insert"),
            (2, "update_before"), (2, "update_after"), (3, "delete")]

