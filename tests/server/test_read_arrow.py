"""``mariadb_cdc_client.arrow.read_arrow``: a table's changes as Arrow record batches,
checked against ``SELECT`` on the source (the oracle: the rows rebuilt from the batches' last
images), and read by Polars, DuckDB and pandas, which share no code with the decoder."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from cdcserver.core.config import DumpConfig, parse_source_url  # noqa: E402
from cdcserver.core.names import TableName  # noqa: E402
from cdcserver.dump.dumper import DumpOptions, dump_tables  # noqa: E402
from mariadb_cdc_client.arrow import (  # noqa: E402
    AVSC_KEY,
    ZeroDateError,
    read_arrow,
    read_dump_arrow,
)
from mariadb_cdc_client.sync import SyncCdcClient  # noqa: E402
from tests.conftest import RunningService, Source  # noqa: E402
from tests.helpers import PASSWORD, USER, zero_dates_table  # noqa: E402

pytestmark = pytest.mark.mariadb

COLUMNS = ("id INT PRIMARY KEY, big BIGINT UNSIGNED, amount DECIMAL(12,2), wide DECIMAL(45,5), "
           "name VARCHAR(64), body BLOB, day DATE, at DATETIME(6), ts TIMESTAMP(3) NULL, "
           "took TIME(6), score DOUBLE, ratio FLOAT, flag BIT(1), doc JSON")
ROWS = [
    "(1, 18446744073709551615, -12345678.91, 1234567890123456789012345678901234567890.12345, "
    "'zoë ✓ {x}', x'00ff10', '2024-02-29', '2024-02-29 12:34:56.123456', "
    "'2024-03-01 01:02:03.456', '-838:59:59.000000', 1.5e300, 0.25, b'1', '{\"a\": [1, 2]}')",
    "(2, 0, 0.01, -0.00001, '', x'', '1000-01-01', '9999-12-31 23:59:59.999999', "
    "'1970-01-01 00:00:01.000', '00:00:00.000001', -0.0, -3.5, b'0', 'null')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
]


def _client(cdc: RunningService) -> SyncCdcClient:
    return SyncCdcClient("127.0.0.1", cdc.port, USER, PASSWORD)


async def _read(cdc: RunningService, table: str, **kwargs: Any) -> tuple[Any, list[Any]]:
    """A range and its tables, read by the blocking client in a thread (the service runs in
    this event loop)."""
    def read() -> tuple[Any, list[Any]]:
        arrow_range = read_arrow(_client(cdc), table, **kwargs)
        return arrow_range, arrow_range.read_all()
    return await asyncio.to_thread(read)


async def _dump(cdc: RunningService, source: Source, table: str) -> None:
    """A dump of the test database's ``table``, taken beside the service into its store."""
    await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                            cdc.service.config.store.data_dir,
                            [TableName(source.database, table)], DumpOptions(DumpConfig()))


def _select(source: Source, table: str) -> dict[int, dict[str, Any]]:
    """The table as the source has it, TIMESTAMPs in UTC, by id."""
    conn = source.server.connect(database=source.database,
                                 init_command="SET time_zone = '+00:00'")
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def _rebuilt(tables: list[Any]) -> dict[int, dict[str, Any]]:
    """The rows the changes leave, from each record's image (deletes remove them)."""
    rows: dict[int, dict[str, Any]] = {}
    for table in tables:
        for record in table.to_pylist():
            if record["event_type"] == "delete":
                rows.pop(record["id"])
            elif record["event_type"] != "update_before":
                rows[record["id"]] = record
    return rows


def _as_selected(value: Any, column: str) -> Any:
    """A batch's value as pymysql gives the column (the oracle's types)."""
    if value is None:
        return None
    if column == "ts":
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if column == "flag":
        return b"\x01" if value else b"\x00"
    if column == "wide":
        return Decimal(value)  # over 38 digits: the exact text
    return value


def _assert_same(rebuilt: dict[int, dict[str, Any]], selected: dict[int, dict[str, Any]]
                 ) -> None:
    assert rebuilt.keys() == selected.keys()
    for key, row in selected.items():
        for column, expected in row.items():
            got = _as_selected(rebuilt[key][column], column)
            if column == "doc" and expected is not None:
                assert got.replace(" ", "") == expected.replace(" ", ""), (key, column)
            else:
                assert got == expected, (key, column, got, expected)


async def test_read_arrow_rebuilds_the_table_value_by_value(cdc: RunningService, source: Source):
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} ({COLUMNS})", f"INSERT INTO {t} VALUES {ROWS[0]}",
                   f"INSERT INTO {t} VALUES {ROWS[1]}, {ROWS[2]}")
    source.execute(f"UPDATE {t} SET amount = amount + 1, name = 'renamed' WHERE id = 2",
                   f"DELETE FROM {t} WHERE id = 3")
    await cdc.caught_up(source)

    first, tables = await _read(cdc, f"{source.database}.t")
    assert len(tables) == 1
    table = tables[0]
    assert [r["event_type"] for r in table.select(["event_type"]).to_pylist()] == [
        "insert", "insert", "insert", "update_before", "update_after", "delete"]
    types = {f.name: str(f.type) for f in table.schema}
    assert types | {"doc": "string"} == {
        "domain": "uint32", "server_id": "uint32", "sequence": "uint64", "event_number": "int32",
        "timestamp": "int64", "event_type": "string", "id": "int32",
        "big": "decimal128(20, 0)", "amount": "decimal128(12, 2)", "wide": "string",
        "name": "string", "body": "binary", "day": "date32[day]", "at": "timestamp[us]",
        "ts": "timestamp[us, tz=UTC]", "took": "duration[us]", "score": "double",
        "ratio": "float", "flag": "bool", "doc": "string"}
    assert b'"version":1' in table.schema.metadata[AVSC_KEY].replace(b" ", b"")
    _assert_same(_rebuilt(tables), _select(source, t))
    again = await asyncio.to_thread(lambda: [b.to_pylist() for b in first])
    assert again == [r for x in tables for r in [x.to_pylist()]]  # the same, every time

    # read on from where the first range ended: exactly the later changes, a schema change
    # inside the range as a second table
    source.execute(f"INSERT INTO {t} (id, name) VALUES (4, 'four')",
                   f"ALTER TABLE {t} ADD COLUMN extra VARCHAR(8) DEFAULT 'e'",
                   f"UPDATE {t} SET extra = 'x' WHERE id = 1")
    await cdc.caught_up(source)
    second, later = await _read(cdc, f"{source.database}.t", after=first.end)
    assert len(later) == 2 and later[0].column("id").to_pylist() == [4]  # before the ALTER
    assert "extra" not in later[0].schema.names  # the version after it has the column
    assert {"event_type": "update_after", "id": 1, "extra": "x"} in later[1].select(
        ["event_type", "id", "extra"]).to_pylist()
    _assert_same(_rebuilt(tables + later), _select(source, t))
    assert (await _read(cdc, f"{source.database}.t", after=second.end))[1] == []


async def test_polars_and_duckdb_read_the_batches(cdc: RunningService, source: Source):
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    t = f"`{source.database}`.orders"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, amount DECIMAL(10,2), "
                   "placed DATETIME)",
                   *(f"INSERT INTO {t} VALUES ({i}, {i}.25, '2024-01-{i:02d} 10:00:00')"
                     for i in range(1, 21)))
    await cdc.caught_up(source)
    _, (changes,) = await _read(cdc, f"{source.database}.orders")
    assert polars.from_arrow(changes).filter(polars.col("id") > 10).height == 10
    assert changes.to_pandas().set_index("id").loc[7, "amount"] == Decimal("7.25")
    total = duckdb.sql("SELECT sum(amount) FROM changes WHERE event_type = 'insert'")
    assert total.fetchall()[0][0] == source.query(f"SELECT SUM(amount) FROM {t}")[0][0]


async def test_zero_dates_are_an_error_unless_read_as_null(cdc: RunningService, source: Source):
    zero_dates_table(source, "z")
    await cdc.caught_up(source)
    with pytest.raises(ZeroDateError, match=r"0000-00-00.*zero_dates='null'"):
        await _read(cdc, f"{source.database}.z")
    _, (table,) = await _read(cdc, f"{source.database}.z", zero_dates="null")
    assert table.select(["id", "d", "dtm"]).to_pylist() == [
        {"id": 1, "d": None, "dtm": None},
        {"id": 2, "d": dt.date(2024, 1, 2), "dtm": dt.datetime(2024, 1, 2, 3, 4, 5)}]
    with pytest.raises(ValueError, match="zero_dates"):
        await _read(cdc, f"{source.database}.z", zero_dates="zero")
    # and in a dump's rows, the same
    await _dump(cdc, source, "z")
    name = f"{source.database}.z"
    with pytest.raises(ZeroDateError, match=r"0000-00-00.*zero_dates='null'"):
        await asyncio.to_thread(lambda: list(read_dump_arrow(_client(cdc), name)))
    dumped = await asyncio.to_thread(
        lambda: list(read_dump_arrow(_client(cdc), name, zero_dates="null")))
    assert pa.Table.from_batches(dumped).select(["id", "d", "dtm"]).to_pylist() == \
        table.select(["id", "d", "dtm"]).to_pylist()


async def test_an_unknown_table_is_a_clear_error(cdc: RunningService, source: Source):
    from mariadb_cdc_client.format.wire import ProtocolError

    source.execute(f"CREATE TABLE `{source.database}`.k (id INT)",
                   f"INSERT INTO `{source.database}`.k VALUES (1)")
    await cdc.caught_up(source)
    with pytest.raises(ProtocolError, match=r"NO-FILE .*\.nope\.000001\.avro' not found"):
        await _read(cdc, f"{source.database}.nope")


async def test_a_hostile_name_a_huge_value_and_a_user_reaching_past_its_tables(
        cdc: RunningService, source: Source, users_file: str):
    """A table whose name holds a dot, a space, a comma and a colon, columns named like the
    metadata and with a space, a 3 MB value (blocks over 1 MiB); a user granted that table
    alone reads it, and is refused another table, and the state it reads to tells nothing
    of the other table's later transactions."""
    from cdcserver.protocol.users import UsersFile
    from mariadb_cdc_client.format.names import table_ref
    from mariadb_cdc_client.format.wire import ProtocolError
    from mariadb_cdc_client.sync import SyncCdcClient as Client

    name = table_ref(source.database, "v1.2 ,:x")
    huge = "z" * 3_000_000
    source.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, `domain` INT, `a b` TEXT, "
                   "big LONGBLOB)",
                   f"INSERT INTO {name} VALUES (1, 7, 'x', REPEAT('z', 3000000)), "
                   "(2, NULL, NULL, NULL)",
                   f"CREATE TABLE `{source.database}`.other (id INT PRIMARY KEY)",
                   f"INSERT INTO `{source.database}`.other VALUES (1)")
    await cdc.caught_up(source)
    UsersFile(users_file).add("limited", "pw-limited", name)
    limited = Client("127.0.0.1", cdc.port, "limited", "pw-limited")

    def read(table: str) -> tuple[Any, list[Any]]:
        arrow_range = read_arrow(limited, table)
        return arrow_range, arrow_range.read_all()

    mine, (table,) = await asyncio.to_thread(read, name)
    assert table.select(["id", "domain_", "a_b"]).to_pylist() == [
        {"id": 1, "domain_": 7, "a_b": "x"}, {"id": 2, "domain_": None, "a_b": None}]
    assert table.column("big").to_pylist() == [huge.encode(), None]
    with pytest.raises(ProtocolError, match="FORBIDDEN"):
        await asyncio.to_thread(read, f"{source.database}.other")
    source.execute(f"INSERT INTO `{source.database}`.other VALUES (2)")  # not limited's
    await cdc.caught_up(source)
    again, batches = await asyncio.to_thread(read, name)
    assert again.end == mine.end and batches[0].equals(table)


async def test_follow_arrow_gives_every_change_once_as_it_is_stored(cdc: RunningService,
                                                                     source: Source):
    """Ranges as changes are stored, each holding a record of the table; following again
    from a saved end continues exactly after it. Another table's transactions make no
    range."""
    from mariadb_cdc_client.arrow import follow_arrow

    t = f"`{source.database}`.f"
    source.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1), (2)",
                   f"CREATE TABLE `{source.database}`.noise (id INT PRIMARY KEY)")
    await cdc.caught_up(source)

    def follow(after: str | None, last: int) -> list[tuple[str, str, list[int]]]:
        """The ranges up to the one holding ``last`` (60 s at most without a new one)."""
        seen = []
        for changes in follow_arrow(_client(cdc), f"{source.database}.f", after=after,
                                    poll=0.2, idle_timeout=60):
            ids = [i for b in changes for i in b.column("id").to_pylist()]
            seen.append((changes.after, changes.end, ids))
            if last in ids:
                break
        return seen

    first = await asyncio.to_thread(follow, None, 2)
    assert [ids for _, _, ids in first] == [[1, 2]] and first[0][0] == ""
    following = asyncio.create_task(asyncio.to_thread(follow, first[0][1], 5))
    for n in range(3, 6):
        source.execute(f"INSERT INTO `{source.database}`.noise VALUES ({n})",
                       f"INSERT INTO {t} VALUES ({n})")
        await asyncio.sleep(0.3)
    later = await following
    assert [i for _, _, ids in later for i in ids] == [3, 4, 5]  # each once, in order
    assert all(ids for _, _, ids in later)  # the noise made no range of its own


async def test_a_dump_and_the_changes_after_it_rebuild_the_table(cdc: RunningService,
                                                                 source: Source):
    """read_dump_arrow gives a dump's rows as Arrow batches of the version's schema (every
    type, in batches of 2 rows here), and read_arrow after its GTID gives exactly what came
    after: together they are the table, against SELECT value by value."""
    t = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {t} ({COLUMNS})", f"INSERT INTO {t} VALUES {ROWS[0]}",
                   f"INSERT INTO {t} VALUES {ROWS[1]}, {ROWS[2]}",
                   f"UPDATE {t} SET name = 'renamed' WHERE id = 2")
    await cdc.caught_up(source)
    await _dump(cdc, source, "t")
    source.execute(f"INSERT INTO {t} (id, name) VALUES (4, 'after the dump')",
                   f"DELETE FROM {t} WHERE id = 3")
    await cdc.caught_up(source)

    def read() -> tuple[Any, list[Any], list[Any]]:
        dump = read_dump_arrow(_client(cdc), f"{source.database}.t", batch_rows=2)
        batches = list(dump)
        later = read_arrow(_client(cdc), f"{source.database}.t", after=dump.header.gtid)
        return dump, batches, later.read_all()

    dump, batches, later = await asyncio.to_thread(read)
    assert [b.num_rows for b in batches] == [2, 1] and dump.header.rows == 3
    dumped = pa.Table.from_batches(batches)
    assert dumped.schema.equals(later[0].schema)  # the same version, the same types
    assert dumped.column("event_number").to_pylist() == [1, 2, 3]
    assert set(dumped.column("event_type").to_pylist()) == {"insert"}
    assert [r["event_type"] for r in later[0].select(["event_type"]).to_pylist()] == [
        "insert", "delete"]
    _assert_same(_rebuilt([dumped, *later]), _select(source, t))
