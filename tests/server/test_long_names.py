"""Any name MariaDB accepts can be stored (issue 35, item 3).

MariaDB allows 64 characters of any script in a database's and a table's name; the data
directory writes a character outside ``[A-Za-z0-9_$-]`` as five bytes, so 48 Cyrillic letters
were enough to pass the 255-byte limit of a file name, and the service exited on every
restart. Long names are now shortened with a digest (``cdcserver/store/naming.py``), every
name that fitted keeps its file name (data directories written before keep working), and two
names never share a file.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.dump import files
from cdcserver.dump.dumper import dump_tables
from cdcserver.store.naming import (
    AVRO_STEM_MAX,
    avro_stem,
    dump_stem,
    encode_identifier,
    parse_version_file,
    version_file,
)
from tests.conftest import Source, make_config, start_service
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table

# MariaDB's names: 1 to 64 characters, no NUL, not ending in a space (and no surrogates)
NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=64).filter(lambda s: not s.endswith(" "))
LONGEST_SUFFIXES = {avro_stem: ".000001.avsc.tmp", dump_stem: ".20261121T093000-123456Z.dump.tmp"}


@settings(max_examples=400, deadline=None)
@given(NAMES, NAMES)
def test_every_file_name_fits_and_names_that_fitted_keep_theirs(database: str, table: str):
    name = TableName(database, table)
    for stem, suffix in LONGEST_SUFFIXES.items():
        assert len((stem(name) + suffix).encode()) <= 255
    plain = f"{encode_identifier(database)}.{encode_identifier(table)}"
    if len(plain) <= AVRO_STEM_MAX:  # it worked before: its files keep their names
        assert avro_stem(name) == plain
        assert parse_version_file(version_file(name, 7, "avro")) == (name, 7, "avro")
    else:
        assert parse_version_file(version_file(name, 7, "avro")) == (None, 7, "avro")


def test_names_alike_but_for_their_end_get_files_of_their_own():
    head = "é" * 60
    names = [TableName(head + a, head + b) for a in ("abcd", "abce") for b in ("wxyz", "wxy")]
    for stem in LONGEST_SUFFIXES:
        stems = {stem(n) for n in names}
        assert len(stems) == len(names)


DATABASE = "t_" + "é" * 62
TABLES = ["é" * 64, "é" * 60 + "abcd", "é" * 60 + "abce", "ж" * 64, "plain"]
# Greek, in the source's short database (MariaDB names its own files with 5 bytes for a CJK
# character, 3 for these: 64 CJK characters pass its own 255-byte limit, 64 Greek do not)
GREEK = "λ" * 64


def _sql(database: str, table: str) -> str:
    return f"`{database}`.`{table}`"


@pytest.mark.mariadb
async def test_the_longest_names_stream_dump_and_survive_a_restart(tmp_path, source: Source,
                                                                  users_file: str):
    data_dir = str(tmp_path / "data")
    config = make_config(data_dir, source.url, users_file)
    running = await start_service(config)
    source.execute(f"CREATE DATABASE `{DATABASE}`")
    every = [(DATABASE, t) for t in TABLES] + [(source.database, GREEK)]
    try:
        for number, (database, table) in enumerate(every):
            name = _sql(database, table)
            source.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))",
                           *(f"INSERT INTO {name} VALUES ({i}, 'r{i} of {number}')"
                             for i in range(4)),
                           f"UPDATE {name} SET v = 'changed' WHERE id = 1",
                           f"DELETE FROM {name} WHERE id = 2")
        await running.caught_up(source)
        await running.stop()
        for directory in ("avro", "dump"):
            folder = os.path.join(data_dir, directory)
            for entry in os.listdir(folder) if os.path.isdir(folder) else []:
                assert len(entry.encode()) <= 255, entry
        tables = [TableName(d, t) for d, t in every]
        results = dump_tables(parse_source_url(source.url), data_dir, tables)
        assert [r.info.table for r in results] == tables
        listed = {d.table: d for d in files.list_dumps(data_dir)}
        assert set(listed) == set(tables)
        for table in tables:  # each dump holds its own table's rows
            assert [d.header.rows for d in files.list_dumps(data_dir, table)] == [3]
        # a restart reads the shortened names back from the files' headers
        running = await start_service(config)
        source.execute(*(f"INSERT INTO {_sql(d, t)} VALUES (9, 'after')" for d, t in every))
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            for database, table in every:
                await assert_stream_equals_table(running.port, conn, database, table,
                                                 user=USER, password=PASSWORD)
        finally:
            conn.close()
    finally:
        if not running.task.done():
            await running.stop()
        source.execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
