"""MaxScale's own example clients against the service, unchanged.

They are MaxScale's (BSL-licensed) scripts, so they are not part of this repository. Point
``MAXSCALE_EXAMPLES`` at one or more copies of MaxScale's ``server/modules/protocol/examples``
folder (separated by ``:``; e.g. one from MaxScale 2.5 and one from 24.02, whose ``cdc.py``
reads differently) to run these tests, or ``MAXSCALE_CDC_PY`` at a single ``cdc.py``; without
either they are skipped. Each script runs as a subprocess, as a user would run it.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
from decimal import Decimal

import fastavro
import pytest

from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import Dialect
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, write_secret
from tests.server.test_types import _fill, _from_maxscale, _json_lines, _typed, _zero_date_text


def _example_folders() -> list[str]:
    folders = [d for d in os.environ.get("MAXSCALE_EXAMPLES", "").split(os.pathsep) if d]
    single = os.environ.get("MAXSCALE_CDC_PY", "")
    if single:
        folders.append(os.path.dirname(os.path.abspath(single)))
    return [d for d in folders if os.path.isfile(os.path.join(d, "cdc.py"))]


FOLDERS = _example_folders()

pytestmark = [pytest.mark.mariadb,
              pytest.mark.skipif(not FOLDERS, reason="set MAXSCALE_EXAMPLES to MaxScale's "
                                 "server/modules/protocol/examples to run these")]


@pytest.fixture(params=FOLDERS or [""], ids=str)
def examples(request: pytest.FixtureRequest) -> str:
    folder: str = request.param
    return folder


def _script(folder: str, name: str, *args: str, stdin: bytes | None = None
            ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, os.path.join(folder, name), *args], input=stdin,
                          capture_output=True, timeout=60, check=False)


def _cdc_py(folder: str, port: int, *args: str, user: str = USER, password: str = PASSWORD
            ) -> subprocess.CompletedProcess[bytes]:
    return _script(folder, "cdc.py", "-h", "127.0.0.1", "-P", str(port), "-u", user,
                   "-p", password, "-t", "2", *args)


async def test_cdc_py_json_avro_gtid_and_refusals(examples: str, cdc: RunningService,
                                                  source: Source):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(20))",
                   f"INSERT INTO {table} VALUES (1, 'one'), (2, 'two')",
                   f"INSERT INTO {table} VALUES (3, 'three')")
    await cdc.caught_up(source)
    name = f"{source.database}.t"

    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, name)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines, (result.returncode, result.stderr)
    assert lines[0]["table"] == "t" and [r["id"] for r in lines[1:]] == [1, 2, 3]

    last = lines[-1]
    gtid = f"{last['domain']}-{last['server_id']}-{last['sequence']}"
    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, name, gtid)
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()[1:]] == [3]

    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, "-f", "AVRO", name)
    assert [r["id"] for r in fastavro.reader(io.BytesIO(result.stdout))] == [1, 2, 3]

    # MaxScale's refusal, byte for byte: cdc.py prints it and exits 1
    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, f"{source.database}.missing")
    assert result.returncode == 1
    assert result.stderr == f"ERR NO-FILE File '{source.database}.missing.000001.avro' not " \
                            "found.\n\n".encode()
    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, name, password="wrong")
    assert result.returncode == 1 and result.stderr.startswith(b"ERR AUTH-FAILED")


async def test_cdc_py_reads_a_table_whose_names_statement_and_values_hold_err(
        examples: str, cdc: RunningService, source: Source):
    """The letters 2.5's ``cdc.py`` takes for an error reply in its first read, here in the
    database's name (the test's), a column's, the statement the schema's ``ddl`` carries and
    the values: it reads the table, and the values are the table's."""
    table = f"`{source.database}`.contacts"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, error_code VARCHAR(20) "
                   "COMMENT 'preferred number')",
                   f"INSERT INTO {table} VALUES (1, 'server ERROR'), (2, 'Terrace'), (3, NULL)")
    await cdc.caught_up(source)
    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, f"{source.database}.contacts")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert "'preferred number'" in lines[0]["ddl"]["statement"]
    assert [(r["id"], r["error_code"]) for r in lines[1:]] == [
        (1, "server ERROR"), (2, "Terrace"), (3, None)]


async def test_cdc_last_transaction_py(examples: str, cdc: RunningService, source: Source):
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                   f"INSERT INTO {table} VALUES (1), (2)", f"INSERT INTO {table} VALUES (3)")
    await cdc.caught_up(source)
    gtids = source.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    login = ("-h", "127.0.0.1", "-P", str(cdc.port), "-u", USER, "-p", PASSWORD)

    result = await asyncio.to_thread(_script, examples, "cdc_last_transaction.py", *login)
    last = json.loads(result.stdout)
    assert last["GTID"] == gtids and last["events"] == 1
    assert last["tables"] == [f"{source.database}.t"]

    before = gtids.rsplit("-", 1)[0] + "-" + str(int(gtids.rsplit("-", 1)[1]) - 1)
    result = await asyncio.to_thread(_script, examples, "cdc_last_transaction.py", *login,
                                     before)
    earlier = json.loads(result.stdout)
    assert earlier["GTID"] == before and earlier["events"] == 2


async def test_cdc_users_py_lines_log_in(examples: str, cdc: RunningService, source: Source,
                                         users_file: str):
    """A line from MaxScale's cdc_users.py, appended to the users file as its help says,
    logs in (the service reads the file again when it changes)."""
    result = await asyncio.to_thread(_script, examples, "cdc_users.py", "maxuser", "s3cret pw")
    line = result.stdout.decode()
    assert line.startswith("maxuser:") and line.endswith("\n")
    with open(users_file, "a", encoding="utf-8") as f:
        f.write(line)
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)",
                   f"INSERT INTO {table} VALUES (7)")
    await cdc.caught_up(source)

    async def logged_in() -> list[int]:
        while True:
            result = await asyncio.to_thread(_cdc_py, examples, cdc.port,
                                             f"{source.database}.t", user="maxuser",
                                             password="s3cret pw")
            if result.returncode == 0:
                return [json.loads(r)["id"] for r in result.stdout.splitlines()[1:]]
            assert result.stderr.startswith(b"ERR AUTH-FAILED"), result.stderr

    assert await asyncio.wait_for(logged_in(), 30) == [7]


async def test_cdc_py_output_through_cdc_kafka_producer_py(
        examples: str, cdc: RunningService, source: Source, kafka_broker):
    """MaxScale's pipeline of its examples: cdc.py's JSON lines into cdc_kafka_producer.py
    (kafka-python), read back from the broker."""
    pytest.importorskip("kafka", reason="cdc_kafka_producer.py needs kafka-python")
    from aiokafka import AIOKafkaConsumer

    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(20))",
                   f"INSERT INTO {table} VALUES (1, 'one'), (2, 'two')")
    await cdc.caught_up(source)
    stream = await asyncio.to_thread(_cdc_py, examples, cdc.port, f"{source.database}.t")
    topic = f"{source.database}-maxscale"
    result = await asyncio.to_thread(_script, examples, "cdc_kafka_producer.py", "-K",
                                     kafka_broker.bootstrap, "-T", topic, stdin=stream.stdout)
    assert result.returncode == 0, result
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        values = []
        while len(values) < 3:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            values += [json.loads(m.value) for ms in batch.values() for m in ms]
    finally:
        await consumer.stop()
    # (kafka-python spreads messages without a key over the topic's partitions: no order)
    assert [v["table"] for v in values if "namespace" in v] == ["t"]
    assert sorted(v["id"] for v in values if "namespace" not in v) == [1, 2]


@pytest.mark.parametrize("dialect", [None, Dialect.EXACT])
async def test_cdc_py_reads_every_type_in_both_dialects(examples: str, dialect: Dialect | None,
                                                        cdc: RunningService, source: Source,
                                                        users_file: str):
    """The type table of tests/server/test_types.py (protocol.md "Tested clients"): cdc.py
    prints the schema line and 9 records, each parses, and their values are the exact
    dialect's."""
    UsersFile(users_file).add("typed", "pw", dialect=dialect)
    name = _fill(source)
    await cdc.caught_up(source)
    result = await asyncio.to_thread(_cdc_py, examples, cdc.port, name, user="typed",
                                     password="pw")
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 10, (result.returncode, result.stderr)
    # what cdc.py prints is what the server sends that dialect's clients, line for line
    sent = await _json_lines(cdc, name, 10, dialect=dialect.name if dialect else None)
    assert lines == sent
    schema = json.loads(lines[0])
    fields = {f["name"]: f for f in schema["fields"]}
    exact = await asyncio.to_thread(_typed, cdc.port, name, "JSON")
    for line, record in zip(lines[1:], exact, strict=True):
        row = json.loads(line, parse_float=Decimal)  # each line parses
        if dialect is None:  # and holds the exact dialect's values, by protocol.md's table
            for column, value in record.values.items():
                ours = _from_maxscale(fields[column], row[column])
                assert ours == value or _zero_date_text(value, ours, fields[column]), column


async def test_cdc_py_reads_a_table_under_column_rules(examples: str, tmp_path,
                                                       source: Source, users_file: str):
    """A field's ``masked`` key (and a column left out) is nothing MaxScale's client needs to
    know: it prints the hashed and masked values, in JSON and through Avro."""
    from tests.conftest import make_config, start_service

    salt = tmp_path / "salt"
    write_secret(salt, "cdc-py-salt")
    db = source.database
    config = make_config(os.path.join(tmp_path, "data"), source.url, users_file, capture={
        "columns_exclude": f"`{db}`.u.secret", "columns_hash": f"`{db}`.u.email",
        "columns_mask": f"`{db}`.u.card:2", "hash_salt_file": str(salt)})
    running = await start_service(config)
    try:
        source.execute(f"CREATE TABLE `{db}`.u (id INT PRIMARY KEY, email VARCHAR(40), "
                       "secret VARCHAR(40), card VARCHAR(20))",
                       f"INSERT INTO `{db}`.u VALUES (1, 'a@b.c', 'pw-9931', '4111')")
        await running.caught_up(source)
        hashed = hashlib.sha256(b"cdc-py-salt" + b"a@b.c").hexdigest()
        result = await asyncio.to_thread(_cdc_py, examples, running.port, f"{db}.u")
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert lines, (result.returncode, result.stderr)
        assert {f["name"]: f.get("masked") for f in lines[0]["fields"]}["email"] == "hash"
        row = lines[1]
        assert (row["email"], row["card"], "secret" in row) == (hashed, "41***", False)
        result = await asyncio.to_thread(_cdc_py, examples, running.port, "-f", "AVRO",
                                         f"{db}.u")
        records = list(fastavro.reader(io.BytesIO(result.stdout)))
        assert [(r["email"], r["card"]) for r in records] == [(hashed, "41***")]
        assert b"pw-9931" not in result.stdout
    finally:
        await running.stop()
