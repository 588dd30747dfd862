"""``[capture]`` column rules against a real MariaDB: an excluded column, a hashed or a masked
value never reaches the store, a dump or a log line in clear; the stream rebuilt from its raw
JSON equals ``SELECT`` with the same masks written in SQL (``SHA2(CONCAT(salt, email), 256)``,
``CONCAT(LEFT(card, 4), '***')``): an oracle that shares no code with the service. The same
holds for rows a repair reads from the source (a cascade), for dumps, across a restart that
changes the rules (a new version, announced in-band), and ``cdcserver check`` shows them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import fastavro
import pytest

from cdcserver.app.cli import main as cdcserver_main
from cdcserver.core.capture import CaptureFilter
from cdcserver.core.captureconfig import CaptureConfig
from cdcserver.core.config import Config, parse_source_url
from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from cdcserver.dump.dumper import dump_tables
from cdcserver.dump.files import list_dumps
from cdcserver.dump.options import DumpOptions
from mariadb_cdc_client import ChangeRecord, SyncCdcClient
from mariadb_cdc_client.format.dump import DumpRows
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, files_holding, until, write_secret
from tests.oracle import assert_stream_equals_table, auth_message, read_stream

pytestmark = pytest.mark.mariadb

SALT = "pepper-4471"
CLEAR = ["alice.secret@example.com", "bcrypt$2y$10$notstored", "4111111111111111",
         "private note ünïcødé 漢字", "zoë.漢字@例え.jp"]


def _people(db: str) -> str:
    return (f"CREATE TABLE `{db}`.people (id INT PRIMARY KEY, email VARCHAR(80), "
            "password_hash VARCHAR(100), card VARCHAR(20), note TEXT, photo BLOB, age INT, "
            "tag CHAR(6)) DEFAULT CHARSET=utf8mb4")


def _rules(db: str, tmp_path, card: str = "card:4") -> dict[str, object]:
    salt = tmp_path / "salt"
    write_secret(salt, SALT + "\n")
    return {"columns_exclude": f"`{db}`.people.password_hash",
            "columns_hash": f"`{db}`.people.email, `{db}`.people.photo, `{db}`.people.age, "
                            f"`{db}`.*.contact",
            "columns_mask": f"`{db}`.people.{card}, `{db}`.people.note, `{db}`.people.tag:2",
            "hash_salt_file": str(salt)}


def _masks(card_keep: int = 4) -> dict[str, str]:
    return {"email": f"SHA2(CONCAT('{SALT}', email), 256)",
            "photo": f"SHA2(CONCAT('{SALT}', photo), 256)",
            "card": f"CONCAT(LEFT(card, {card_keep}), '***')",
            "note": "CONCAT(LEFT(note, 0), '***')",
            "tag": "CONCAT(LEFT(tag, 2), '***')"}


async def _people_service(tmp_path, source: Source, users_file: str
                          ) -> tuple[Config, RunningService]:
    """The people table, and the service capturing it under ``_rules``."""
    source.execute(_people(source.database))
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         capture=_rules(source.database, tmp_path))
    return config, await start_service(config)


def _write_people(source: Source, db: str, first: int) -> None:
    source.execute(
        f"INSERT INTO `{db}`.people VALUES "
        f"({first}, '{CLEAR[0]}', '{CLEAR[1]}', '{CLEAR[2]}', '{CLEAR[3]}', X'00ff10', 41, "
        "'abcdef'), "
        f"({first + 1}, '{CLEAR[4]}', 'x', '12', '', '', 7, 'é'), "
        f"({first + 2}, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        f"UPDATE `{db}`.people SET email = CONCAT('new.', email), card = '5500000000000004' "
        f"WHERE id = {first}",
        f"INSERT INTO `{db}`.people VALUES ({first + 3}, 'gone@example.com', 'h', '99', 'n', "
        "X'01', 1, 'zz')",
        f"DELETE FROM `{db}`.people WHERE id = {first + 3}")


async def test_excluded_hashed_and_masked_columns_are_stored_only_as_the_rules_say(
        tmp_path, source: Source, users_file: str, capfd: pytest.CaptureFixture[str]):
    db = source.database
    config, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            rebuilt = await assert_stream_equals_table(
                running.port, conn, db, "people", user=USER, password=PASSWORD, quiet=0.5,
                masked=_masks(), excluded=("password_hash", "age"))
        finally:
            conn.close()
        fields = {f["name"]: f for f in rebuilt.schemas[-1]["fields"]}
        assert "password_hash" not in fields and "age" not in fields  # age: an INT hashed
        assert fields["email"]["masked"] == "hash" and fields["card"]["masked"] == "mask:4"
        assert fields["email"]["type"] == ["null", "string"]
        assert fields["photo"]["type"] == ["null", "string"]  # a hash is a string
        assert "masked" not in fields["id"]
        hashed = hashlib.sha256((SALT + "new." + CLEAR[0]).encode()).hexdigest()
        assert rebuilt.rows[(1,)]["email"] == hashed

        results = await asyncio.to_thread(
            dump_tables, parse_source_url(source.url), config.store.data_dir,
            [TableName(db, "people")], capture=running.service.replication.capture)
        dumped = await _dumped_rows(running.port, db)
        assert dumped == {key[0]: {c: v for c, v in row.items()}
                          for key, row in rebuilt.rows.items()}
        with open(results[0].info.path, "rb") as f:
            assert b"password_hash" not in f.read()  # nor its name, in the header
    finally:
        await running.stop()
    for clear in CLEAR:
        assert files_holding(config.store.data_dir, clear.encode()) == [], clear
        assert clear not in capfd.readouterr().err


async def _dumped_rows(port: int, db: str) -> dict[int, dict[str, object]]:
    """The table as the client library reads a dump of it, then the changes after it."""
    rows: dict[int, dict[str, object]] = {}
    with SyncCdcClient("127.0.0.1", port, USER, PASSWORD) as client:
        events = await asyncio.to_thread(lambda: list(client.dump(f"`{db}`.people",
                                                                  idle_timeout=1.5)))
    for event in events:
        if isinstance(event, DumpRows):
            rows.update({r["id"]: dict(r) for r in event.rows})
        elif isinstance(event, ChangeRecord):
            if event.event_type in ("delete", "update_before"):
                rows.pop(event.values["id"], None)
            else:
                rows[event.values["id"]] = dict(event.values)
    return rows


async def test_rows_a_repair_reads_from_the_source_are_hashed_too(
        tmp_path, source: Source, users_file: str):
    """An ON UPDATE CASCADE changes child rows without row events: the repair reads them
    from the source, where they are in clear, and stores them as the rules say."""
    db = source.database
    source.execute(
        f"CREATE TABLE `{db}`.parent (id INT PRIMARY KEY)",
        f"CREATE TABLE `{db}`.child (id INT PRIMARY KEY, pid INT, contact VARCHAR(60), "
        f"KEY (pid), FOREIGN KEY (pid) REFERENCES `{db}`.parent (id) ON UPDATE CASCADE)")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         capture=_rules(db, tmp_path))
    running = await start_service(config)
    try:
        source.execute(f"INSERT INTO `{db}`.parent VALUES (1), (2)",
                       f"INSERT INTO `{db}`.child VALUES (1, 1, '{CLEAR[0]}'), "
                       f"(2, 2, '{CLEAR[4]}')",
                       f"UPDATE `{db}`.parent SET id = 10 WHERE id = 1")
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            pipeline = running.service.replication.runner.pipeline
            assert pipeline is not None
            await until(lambda: not pipeline.repair_pending, timeout=30)
            rebuilt = await assert_stream_equals_table(
                running.port, conn, db, "child", user=USER, password=PASSWORD, quiet=0.5,
                masked={"contact": f"SHA2(CONCAT('{SALT}', contact), 256)"})
        finally:
            conn.close()
        assert any("repair" in json.dumps(s.get("ddl", {})) or r.get("pid") == 10
                   for s in rebuilt.schemas for r in rebuilt.records)
    finally:
        await running.stop()
    for clear in (CLEAR[0], CLEAR[4]):
        assert files_holding(config.store.data_dir, clear.encode()) == [], clear


async def test_a_rule_that_changes_makes_a_new_version_announced_in_band(
        tmp_path, source: Source, users_file: str):
    db = source.database
    config, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        await running.caught_up(source)
    finally:
        await running.stop()
    changed = make_config(config.store.data_dir, source.url, users_file,
                          source={"server_id": config.source.server_id},
                          capture=_rules(db, tmp_path, card="card:1"))
    running = await start_service(changed)
    try:
        source.execute(f"UPDATE `{db}`.people SET tag = 'q'")  # every row again
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            rebuilt = await assert_stream_equals_table(
                running.port, conn, db, "people", user=USER, password=PASSWORD, quiet=0.5,
                masked=_masks(card_keep=1), excluded=("password_hash", "age"))
        finally:
            conn.close()
        masks = [{f["name"]: f.get("masked") for f in s["fields"]}["card"]
                 for s in rebuilt.schemas]
        assert masks[0] == "mask:4" and masks[-1] == "mask:1", masks
        lines = await read_stream(running.port, f"`{db}`.people", user=USER,
                                  password=PASSWORD, quiet=0.5)
        keep = None  # no version mixes masks: every card in a version has its mask's length
        for line in lines:
            if "fields" in line:
                keep = int({f["name"]: f.get("masked") for f in line["fields"]}["card"][5:])
            elif line.get("card") is not None:
                assert line["card"].endswith("***") and len(line["card"]) <= keep + 3, line
        versions = running.service.data.catalog.get(TableName(db, "people"))
        assert versions is not None and len(versions.versions) >= 2
        for info in versions.versions.values():
            with open(info.path, "rb") as f:
                for record in fastavro.reader(f):
                    assert "password_hash" not in record
        assert files_holding(os.path.join(changed.store.data_dir, "avro"),
                             b"password_hash") == []
    finally:
        await running.stop()


def test_check_shows_what_the_column_rules_do(tmp_path, source: Source,
                                             capsys: pytest.CaptureFixture[str]):
    db = source.database
    source.execute(_people(db))
    rules = _rules(db, tmp_path)
    assert cdcserver_main(["check", "--source", source.url, "--include", f"`{db}`.*",
                           "--columns-exclude", str(rules["columns_exclude"]),
                           "--columns-hash", f"`{db}`.people.email,`{db}`.people.id,"
                                             f"`{db}`.people.age",
                           "--columns-mask", f"`{db}`.people.card:4",
                           "--hash-salt-file", str(rules["hash_salt_file"])]) in (0, 1)
    out = capsys.readouterr().out
    assert f"columns: {db}.people: " in out
    assert "email hash" in out and "card mask:4" in out and "password_hash left out" in out
    assert "id stays in clear (hash names a primary-key column)" in out
    assert "age left out (hash of a int column" in out
    assert SALT not in out


def test_a_hash_without_a_salt_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.delenv("CDCSERVER_HASH_SALT", raising=False)
    with pytest.raises(ConfigError, match="columns_hash needs a salt"):
        CaptureFilter.of(CaptureConfig(columns_hash="shop.users.email"))
    monkeypatch.setenv("CDCSERVER_HASH_SALT", SALT)
    rules = CaptureFilter.of(CaptureConfig(columns_hash="shop.users.email")).columns
    assert rules.salt == SALT.encode()
    assert rules.rule(TableName("shop", "users"), "EMAIL") == "hash"  # names ignore case


async def test_a_dump_holds_the_rules_values_and_no_clear_one(
        tmp_path, source: Source, users_file: str):
    """Both dump paths (chunked by key, and one snapshot) write what the stream stores."""
    db = source.database
    source.execute(_people(db))
    _write_people(source, db, 1)
    for readers in (2, 0):
        data_dir = str(tmp_path / f"data{readers}")
        config = make_config(data_dir, source.url, users_file,
                             capture=_rules(db, tmp_path), dump={"readers": readers})
        running = await start_service(config)
        try:
            await running.caught_up(source)
            await asyncio.to_thread(dump_tables, parse_source_url(source.url), data_dir,
                                    [TableName(db, "people")], DumpOptions(config.dump),
                                    capture=running.service.replication.capture)
            assert list_dumps(data_dir, TableName(db, "people"))
            dumped = await _dumped_rows(running.port, db)
        finally:
            await running.stop()
        email = hashlib.sha256((SALT + "new." + CLEAR[0]).encode()).hexdigest()
        assert dumped[1]["email"] == email and dumped[1]["card"] == "5500***"
        assert dumped[2]["note"] == "***" and dumped[2]["tag"] == "é***"
        assert dumped[3]["email"] is None and "password_hash" not in dumped[1]
        for clear in CLEAR:
            assert files_holding(data_dir, clear.encode()) == [], (readers, clear)


async def test_verify_compares_hashed_and_masked_columns_under_their_rules(
        tmp_path, source: Source, users_file: str, capsys: pytest.CaptureFixture[str]):
    db = source.database
    config, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        await running.caught_up(source)
        args = ["verify", f"`{db}`.people", "--source", source.url, "--data-dir",
                config.store.data_dir, "--hash-salt-file", config.capture.hash_salt_file]
        assert await asyncio.to_thread(cdcserver_main, args) == 0, capsys.readouterr()
        wrong = tmp_path / "wrong-salt"
        write_secret(wrong, "not the salt")
        args[-1] = str(wrong)
        assert await asyncio.to_thread(cdcserver_main, args) == 1  # it does compare
    finally:
        await running.stop()


async def test_hostile_column_names_are_named_by_quoted_patterns(
        tmp_path, source: Source, users_file: str, capfd: pytest.CaptureFixture[str]):
    """Columns whose names hold a dot, a colon, a backquote, spaces and non-ASCII letters,
    named by quoted patterns (a mask's ``:N`` after the quote)."""
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.`weird_t` (id INT PRIMARY KEY, `e.mail ü` "
                   "VARCHAR(60), `a:1` VARCHAR(20), `x``y` TEXT) DEFAULT CHARSET=utf8mb4")
    salt = tmp_path / "salt"
    write_secret(salt, SALT)
    config = make_config(str(tmp_path / "data"), source.url, users_file, capture={
        "columns_hash": f"`{db}`.`weird_t`.`e.mail ü`",
        "columns_mask": f"`{db}`.`weird_t`.`a:1`:1",
        "columns_exclude": f"`{db}`.`weird_t`.`x``y`", "hash_salt_file": str(salt)})
    running = await start_service(config)
    try:
        source.execute(f"INSERT INTO `{db}`.`weird_t` VALUES (1, '{CLEAR[4]}', "
                       f"'{CLEAR[2]}', '{CLEAR[3]}')")
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            await assert_stream_equals_table(
                running.port, conn, db, "weird_t", user=USER, password=PASSWORD, quiet=0.5,
                masked={"e.mail ü": f"SHA2(CONCAT('{SALT}', `e.mail ü`), 256)",
                        "a:1": "CONCAT(LEFT(`a:1`, 1), '***')"}, excluded=("x`y",))
        finally:
            conn.close()
    finally:
        await running.stop()
    for clear in (CLEAR[2], CLEAR[3], CLEAR[4]):
        assert files_holding(config.store.data_dir, clear.encode()) == [], clear
        assert clear not in capfd.readouterr().err


async def test_huge_values_are_hashed_and_masked_whole(tmp_path, source: Source,
                                                       users_file: str):
    db = source.database
    source.execute(f"CREATE TABLE `{db}`.big (id INT PRIMARY KEY, note LONGTEXT, "
                   "photo LONGBLOB) DEFAULT CHARSET=utf8mb4")
    salt = tmp_path / "salt"
    write_secret(salt, SALT)
    config = make_config(str(tmp_path / "data"), source.url, users_file, capture={
        "columns_hash": f"`{db}`.big.photo", "columns_mask": f"`{db}`.big.note:3",
        "hash_salt_file": str(salt)})
    running = await start_service(config)
    try:
        source.execute(f"INSERT INTO `{db}`.big VALUES "
                       f"(1, REPEAT('ü', 2000000), REPEAT(X'00ff', 2000000))")
        await running.caught_up(source)
        conn = source.server.connect()
        try:
            rebuilt = await assert_stream_equals_table(
                running.port, conn, db, "big", user=USER, password=PASSWORD, quiet=0.5,
                masked={"note": "CONCAT(LEFT(note, 3), '***')",
                        "photo": f"SHA2(CONCAT('{SALT}', photo), 256)"})
        finally:
            conn.close()
        row = rebuilt.rows[(1,)]
        assert row["note"] == "üüü***"
        assert row["photo"] == hashlib.sha256(SALT.encode() + b"\x00\xff" * 2000000).hexdigest()
    finally:
        await running.stop()


async def test_an_update_of_hidden_columns_only_is_not_streamed(tmp_path, source: Source,
                                                                users_file: str):
    """Its before and after images would be the same: the pair would tell that, and when,
    a hidden column changed. Excluded (password_hash) and masked (note: nothing kept)
    columns hide their changes; a hashed column's change shows (its hash changes), and an
    update that also changes a kept column streams whole."""
    db = source.database
    _, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        source.execute(f"UPDATE `{db}`.people SET password_hash = 'rotated' WHERE id = 1",
                       f"UPDATE `{db}`.people SET note = 'a new secret' WHERE id = 1",
                       f"UPDATE `{db}`.people SET password_hash = 'again', note = 'n2' "
                       "WHERE id IN (1, 2)",
                       f"UPDATE `{db}`.people SET email = 'moved@example.com' WHERE id = 2",
                       f"UPDATE `{db}`.people SET password_hash = 'p', card = '4000' "
                       "WHERE id = 1",
                       f"INSERT INTO `{db}`.people (id) VALUES (100)")
        await running.caught_up(source)
        lines = await read_stream(running.port, f"`{db}`.people", user=USER,
                                  password=PASSWORD, quiet=0.5)
    finally:
        await running.stop()
    records = [r for r in lines if "event_type" in r]
    pairs = [(r["event_type"], r["id"]) for r in records if r["event_type"].startswith("update")]
    # the UPDATE of email and card in _write_people, then the hash change, then the card's
    assert pairs == [("update_before", 1), ("update_after", 1),
                     ("update_before", 2), ("update_after", 2),
                     ("update_before", 1), ("update_after", 1)], pairs
    before, after = [r for r in records if r["event_type"].startswith("update")][-2:]
    assert before["card"] != after["card"]
    assert records[-1]["event_type"] == "insert" and records[-1]["id"] == 100


def test_the_salt_file_gets_the_token_files_checks(tmp_path, monkeypatch):
    """A salt others may read is not a secret; one of whitespace only is none."""
    monkeypatch.delenv("CDCSERVER_HASH_SALT", raising=False)
    salt = tmp_path / "salt"
    salt.write_text(SALT + "\n")
    os.chmod(salt, 0o600)
    assert CaptureConfig(hash_salt_file=str(salt)).hash_salt() == SALT.encode()
    os.chmod(salt, 0o644)
    with pytest.raises(ConfigError, match="may be read by other users"):
        CaptureConfig(hash_salt_file=str(salt)).hash_salt()
    salt.write_text(" \t\n\n")
    os.chmod(salt, 0o600)
    with pytest.raises(ConfigError, match="holds no salt"):
        CaptureConfig(hash_salt_file=str(salt)).hash_salt()


async def test_another_salt_after_a_restart_is_a_new_version(tmp_path, source: Source,
                                                              users_file: str):
    """Hashes of one value under two salts must not meet in one version: an update's
    before and after images would carry two hashes of the same value."""
    db = source.database
    config, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        await running.caught_up(source)
    finally:
        await running.stop()
    other = tmp_path / "other-salt"
    write_secret(other, "another-pepper\n")
    rules = {**_rules(db, tmp_path), "hash_salt_file": str(other)}
    config = make_config(config.store.data_dir, source.url, users_file, capture=rules)
    running = await start_service(config)
    try:
        source.execute(f"UPDATE `{db}`.people SET card = '4000' WHERE id = 1")
        await running.caught_up(source)
        lines = await read_stream(running.port, f"`{db}`.people", user=USER,
                                  password=PASSWORD, quiet=0.5)
    finally:
        await running.stop()
    versions = [line for line in lines if "fields" in line]
    assert len(versions) == 2, versions
    assert versions[0]["version"] == 1 and versions[1]["version"] == 2
    before, after = [r for r in lines if r.get("event_type", "").startswith("update")][-2:]
    assert before["email"] == after["email"] == hashlib.sha256(
        ("another-pepper" + "new." + CLEAR[0]).encode()).hexdigest()


async def test_a_rewriting_alter_of_a_ruled_table_tells_nothing_the_rules_hide(
        tmp_path, source: Source, users_file: str, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture):
    """An ALTER that rewrites values makes a repair, whose reason quoted the statement (an
    excluded column's name and new DEFAULT, a masked column's) and named the columns and
    their types: neither the stream, the stored files nor the log may hold them. (The
    schema history in state/ keeps the definitions the binlog is decoded with.)"""
    db = source.database
    secrets = [b"PW-DEFAULT-SECRET", b"4000123412349999", b"password_hash"]
    caplog.set_level("INFO")
    config, running = await _people_service(tmp_path, source, users_file)
    try:
        _write_people(source, db, 1)
        source.execute("SET SESSION sql_mode = ''",  # truncating what no longer fits
                       f"ALTER TABLE `{db}`.people MODIFY card VARCHAR(4), "
                       "MODIFY email VARCHAR(12), "  # hashes that change: repair records
                       "MODIFY password_hash VARCHAR(90) NOT NULL DEFAULT "
                       "'PW-DEFAULT-SECRET', MODIFY note VARCHAR(40) DEFAULT "
                       "'4000123412349999'")
        await running.caught_up(source)
        lines = await read_stream(running.port, f"`{db}`.people", user=USER,
                                  password=PASSWORD, quiet=1.0)
    finally:
        await running.stop()
    repairs = [r for r in lines if r.get("cdc:repair")]
    assert repairs, "the ALTER made no repair"
    sent = json.dumps(lines).encode()
    logged = (capfd.readouterr().err + caplog.text).encode()
    for secret in secrets:
        assert secret not in sent and secret not in logged, secret
        found = [f for f in files_holding(config.store.data_dir, secret)
                 if not f.endswith("schema_history.jsonl")]
        assert found == [], (secret, found)


async def _raw_exchange(port: int, commands: list[bytes], fmt: str = "JSON",
                        quiet: float = 1.0) -> bytes:
    """Every byte the listener sends for ``commands`` after a login in ``fmt``, until it has
    been quiet for ``quiet`` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    out = bytearray()
    try:
        writer.write(auth_message(USER, PASSWORD))
        assert await reader.readline() == b"OK\n"
        writer.write(f"REGISTER UUID=grep, TYPE={fmt}\n".encode())
        assert await reader.readline() == b"OK\n"
        for command in commands:
            writer.write(command + b"\n")
        await writer.drain()
        while True:
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), quiet)
            except TimeoutError:
                break
            if not data:
                break
            out += data
    finally:
        writer.close()
    return bytes(out)


async def test_no_byte_the_service_writes_or_sends_holds_what_the_rules_hide(
        tmp_path, source: Source, users_file: str, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture):
    """Issue 49's "masks everywhere": a run that stores, repairs, dumps and serves a ruled
    table through every door (the CDC protocol in both formats and dialects, its errors and
    listings, the admin API, the console, /metrics, the log at DEBUG, the data directory),
    then a grep of every byte for the clear values and the excluded column's name. (The
    schema history in state/ keeps the definitions the binlog is decoded with.)"""
    import aiohttp

    from tests.server.test_admin_api import TOKEN, token_file

    db = source.database
    caplog.set_level("DEBUG")
    source.execute(_people(db))
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         capture=_rules(db, tmp_path),
                         admin={"listen": "127.0.0.1:0",
                                "token_file": token_file(str(tmp_path))})
    running = await start_service(config)
    sent: list[bytes] = []
    try:
        _write_people(source, db, 1)
        source.execute(f"UPDATE `{db}`.people SET password_hash = 'hidden-change-77' "
                       "WHERE id = 1",  # an update of the excluded column alone
                       "SET SESSION sql_mode = ''",
                       f"ALTER TABLE `{db}`.people MODIFY card VARCHAR(4), "
                       "MODIFY password_hash VARCHAR(90) NOT NULL DEFAULT "
                       "'PW-DEFAULT-SECRET', MODIFY note VARCHAR(40) DEFAULT "
                       "'4000123412349999'")
        source.execute(f"INSERT INTO `{db}`.people VALUES (20, '{CLEAR[4]}', '{CLEAR[1]}', "
                       f"'4111', '{CLEAR[3][:40]}', X'00', 3, 'abcdef')")
        await running.caught_up(source)
        await asyncio.to_thread(dump_tables, parse_source_url(source.url),
                                config.store.data_dir, [TableName(db, "people")],
                                DumpOptions(config.dump),
                                capture=running.service.replication.capture)
        table = f"`{db}`.people".encode()
        for fmt in ("JSON", "AVRO"):
            sent.append(await _raw_exchange(running.port, [
                b"LIST-TABLES", b"QUERY-STATE", b"REQUEST-DATA " + table,
            ], fmt))
        sent.append(await _raw_exchange(running.port, [b"REQUEST-DATA " + table],
                                        "JSON, DIALECT=MAXSCALE"))
        sent.append(await _raw_exchange(running.port, [b"START-DUMP " + table]))
        sent.append(await _raw_exchange(running.port, [
            b"REQUEST-DATA " + table + b".000099", f"REQUEST-DATA `{db}`.nosuch".encode(),
            b"NOT-A-COMMAND",  # errors (an echo of the client's own words is no leak)
        ]))
        host, port = running.service.admin.address  # type: ignore[misc]
        mhost, mport = running.service.monitoring.address  # type: ignore[misc]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as session:
            for url in [f"http://{host}:{port}{path}" for path in (
                    "/api/v1/replication", "/api/v1/clients", "/api/v1/tables",
                    "/api/v1/dumps", "/live", "/ready", "/health", "/console/")] + \
                    [f"http://{mhost}:{mport}/metrics"]:
                async with session.get(url, headers=headers) as response:
                    sent.append(await response.read())
                    sent.append(str(response.headers).encode())
    finally:
        await running.stop()
    assert any(b"5500***" in data for data in sent), [d[:300] for d in sent]
    logged = (capfd.readouterr().err + caplog.text).encode()
    hidden = [*CLEAR, "password_hash", "hidden-change-77", "PW-DEFAULT-SECRET",
              "4000123412349999"]
    for secret in hidden:
        forms = {secret.encode(), json.dumps(secret)[1:-1].encode()}
        for form in forms:
            assert not any(form in data for data in sent), \
                (secret, [d[max(0, d.find(form) - 300):d.find(form) + 100] for d in sent
                          if form in d])
            assert form not in logged, secret
            found = [f for f in files_holding(config.store.data_dir, form)
                     if not f.endswith("schema_history.jsonl")]
            assert found == [], (secret, found)
