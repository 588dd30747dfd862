"""The users file (MaxScale's cdcusers format) and ``cdcserver users``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from cdcserver.app.cli import main
from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import Dialect


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, check=False)


def test_add_list_remove_through_the_command(tmp_path):
    path = str(tmp_path / "cdcusers")
    added = _cli("users", "add", "alice", "--users-file", path, "--password-stdin",
                 stdin="s3cret-pass\n")
    assert added.returncode == 0, added.stderr
    assert "s3cret-pass" not in added.stdout + added.stderr
    assert _cli("users", "add", "bob", "--users-file", path, "--password-stdin",
                "--tables", "shop.*", stdin="other\n").returncode == 0
    listed = _cli("users", "list", "--users-file", path).stdout.splitlines()
    assert [line.split() for line in listed] == [["alice", "*", "maxscale,scram"],
                                                 ["bob", "shop.*", "maxscale,scram"]]
    with open(path) as f:
        text = f.read()
    assert "s3cret-pass" not in text
    expected = hashlib.sha1(hashlib.sha1(b"s3cret-pass").digest()).hexdigest().upper()
    assert f"alice:{expected}:*:scram=4096$" in text and ":shop.*:scram=4096$" in text
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert _cli("users", "remove", "alice", "--users-file", path).returncode == 0
    assert _cli("users", "list", "--users-file", path).stdout.split() == \
        ["bob", "shop.*", "maxscale,scram"]
    missing = _cli("users", "remove", "alice", "--users-file", path)
    assert missing.returncode == 1 and "no user alice" in missing.stderr


def test_a_maxscale_cdcusers_file_works_unchanged(tmp_path):
    # The line MaxScale's cdc_users.py prints for foobar / foopasswd.
    path = tmp_path / "cdcusers"
    path.write_text("foobar:534EBD301EF499621802C63709693765CB5E81E0\n")
    users = UsersFile(str(path))
    assert users.verify("foobar", hashlib.sha1(b"foopasswd").digest())
    assert not users.verify("foobar", hashlib.sha1(b"wrong").digest())
    assert not users.verify("nobody", hashlib.sha1(b"foopasswd").digest())


def test_the_file_is_reloaded_when_it_changes(tmp_path):
    path = tmp_path / "cdcusers"
    users = UsersFile(str(path))
    assert not users.verify("carol", hashlib.sha1(b"pw").digest())
    UsersFile(str(path)).add("carol", "pw")
    assert users.verify("carol", hashlib.sha1(b"pw").digest())


@pytest.mark.parametrize("line", ["nocolon", "x:lowercase534ebd301ef499621802c63709693765cb5e81",
                                  "x:ABC", ":534EBD301EF499621802C63709693765CB5E81E0",
                                  "x:534EBD301EF499621802C63709693765CB5E81E0:not a table"])
def test_a_malformed_line_is_skipped_with_its_line_number_and_the_rest_works(
        tmp_path, line, caplog):
    """MaxScale starts with such a line and never matches it; so does the service. (It used to
    refuse the whole file: one bad line locked every user out.)"""
    path = tmp_path / "cdcusers"
    path.write_text(f"# comment\n{line}\nfoobar:534EBD301EF499621802C63709693765CB5E81E0\n")
    users = UsersFile(str(path))
    loaded, problems = users.check()
    assert list(loaded) == ["foobar"] and len(problems) == 1 and ":2:" in problems[0]
    with caplog.at_level("WARNING"):
        assert users.verify("foobar", hashlib.sha1(b"foopasswd").digest())
    assert any(":2:" in r.getMessage() for r in caplog.records)


def test_a_lowercase_hash_is_accepted(tmp_path):
    path = tmp_path / "cdcusers"
    path.write_text("foobar:534ebd301ef499621802c63709693765cb5e81e0\n")
    assert UsersFile(str(path)).verify("foobar", hashlib.sha1(b"foopasswd").digest())


def test_users_check_reports_each_problem(tmp_path):
    path = tmp_path / "cdcusers"
    path.write_text("foobar:534EBD301EF499621802C63709693765CB5E81E0\nbroken\nx:ABC\n")
    checked = _cli("users", "check", str(path))
    assert checked.returncode == 1
    assert f"{path}:2:" in checked.stdout and f"{path}:3:" in checked.stdout
    assert "1 users, 2 problems" in checked.stdout
    path.write_text("foobar:534EBD301EF499621802C63709693765CB5E81E0\n")
    assert _cli("users", "check", str(path)).returncode == 0
    # a rewrite would drop a malformed line: add and remove refuse until it is fixed
    path.write_text("broken\n")
    refused = _cli("users", "add", "bob", "--users-file", str(path), "--password-stdin",
                   stdin="pw\n")
    assert refused.returncode == 2 and ":1:" in refused.stderr and path.read_text() == "broken\n"


def test_invalid_names_and_empty_passwords_are_refused(tmp_path):
    users = UsersFile(str(tmp_path / "cdcusers"))
    with pytest.raises(ConfigError):
        users.add("a:b", "pw")
    with pytest.raises(ConfigError):
        users.add("ok", "")


def test_cli_main_returns_usage_without_a_command(capsys):
    assert main([]) == 2


def test_a_users_json_dialect_is_a_fourth_field_kept_across_password_changes(tmp_path):
    path = str(tmp_path / "cdcusers")
    assert _cli("users", "add", "etl", "--users-file", path, "--password-stdin",
                "--json", "exact", stdin="pw\n").returncode == 0
    assert _cli("users", "add", "bi", "--users-file", path, "--password-stdin",
                "--tables", "shop.*", "--json", "maxscale", stdin="pw\n").returncode == 0
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("bi:") and ":shop.*:json=maxscale:scram=4096$" in lines[0]
    assert lines[1].startswith("etl:") and ":*:json=exact:scram=4096$" in lines[1]
    users = UsersFile(path)
    users.add("etl", "new password")  # keeps the dialect, as it keeps the tables
    assert users.dialect("etl") == Dialect.EXACT and users.dialect("bi") == Dialect.MAXSCALE
    assert users.verify("etl", hashlib.sha1(b"new password").digest())
    bad = _cli("users", "add", "x", "--users-file", path, "--password-stdin", "--json", "fast",
               stdin="pw\n")
    assert bad.returncode != 0 and "invalid choice" in bad.stderr
    with open(path, "a") as f:  # a hand-written line with an unknown dialect is skipped
        f.write("odd:534EBD301EF499621802C63709693765CB5E81E0:*:json=fast\n")
    loaded, problems = users.check()
    assert "odd" not in loaded and "etl" in loaded
    assert problems == [f"{path}:3: user odd: unknown JSON dialect 'fast' (exact or maxscale)"]


def test_a_table_list_names_any_table_with_quotes(tmp_path):
    """Names with a dot, comma, colon, space or * are quoted as MariaDB quotes them; the file
    keeps them so, and a grant allows exactly the tables it names (found by attack: a dotted
    table could not be granted)."""
    path = tmp_path / "cdcusers"
    added = _cli("users", "add", "carol", "--users-file", str(path), "--password-stdin",
                 "--tables", "`my db`.`v1.2`, `sh:op`.*, `a,b`.t, db.`*`, `x``y`.z",
                 stdin="pw\n")
    assert added.returncode == 0, added.stderr
    users = UsersFile(str(path))  # read back from the file
    allowed = [("my db", "v1.2"), ("sh:op", "anything"), ("a,b", "t"), ("db", "*"),
               ("x`y", "z")]
    refused = [("my db", "v1"), ("my db.v1", "2"), ("v1", "2"), ("sh", "op"), ("a", "b.t"),
               ("db", "other"), ("x", "y.z")]
    for database, table in allowed:
        assert users.may_read("carol", TableName(database, table)), (database, table)
    for database, table in refused:
        assert not users.may_read("carol", TableName(database, table)), (database, table)
    assert path.read_text().split(":scram=")[0].split(":", 2)[2] == (
        "`my db`.`v1.2`,`sh:op`.*,`a,b`.t,db.`*`,`x``y`.z")
    listed = _cli("users", "list", "--users-file", str(path)).stdout
    assert "`my db`.`v1.2`" in listed
    for bad in ("`my db`.v1.2", "`unclosed.t", "*.t", "db.*x", "`a`b.t", "db.", "`a`"):
        with pytest.raises(ConfigError, match="invalid table list"):
            users.add("carol", "pw", bad)
