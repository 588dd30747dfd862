"""`cdcserver` refuses what cannot work in one line that names the thing and the fix, with
exit code 2 (a configuration error), never a traceback: a missing users file, a data
directory that is a file or read-only, a listen port in use, a path that does not exist, a
misspelled ``CDCSERVER_`` variable. Each runs the installed command as an operator does.

The source URL points at a port nothing listens on: every refusal here comes before the
service connects to it (a service that got further would retry it forever)."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcserver.app.cli import _parser
from cdcserver.app.cli import main as cdcserver_main
from cdcserver.core import config as cfg
from cdcserver.core.errors import ConfigError
from cdcserver.protocol.users import UsersFile

UNREACHABLE = "mysql://root@127.0.0.1:1"
MISSPELT = {"CDCSERVER_SOURCE_UR", "CDCSERVER_FOO"}  # here and in docs/operations.md's example
ROOT = Path(__file__).resolve().parent.parent.parent


def cdcserver(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
              stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    return subprocess.run([command, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=env, check=False)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``cdcserver run`` on the unreachable source, without the monitoring endpoint."""
    return cdcserver("run", "--source", UNREACHABLE, "--metrics-listen", "", *args, cwd=cwd)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start printed (exit code 2, no traceback)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "ERROR" in line or
             line.startswith("cdcserver:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def users(tmp_path: Path) -> str:
    path = str(tmp_path / "cdcusers")
    UsersFile(path).add("alice", "pw")
    return path


# -- the users file ----------------------------------------------------------------------

def test_run_refuses_the_missing_default_users_file_and_says_how_to_create_it(tmp_path):
    expected = tmp_path / "users" / "cdcusers"  # the default, relative to where it runs

    line = refused(run("--data-dir", "data", "--listen", "127.0.0.1:0", cwd=tmp_path))

    assert f"listener.users_file {expected} does not exist" in line
    fix = re.search(r"`(cdcserver users add NAME --users-file \S+)`", line)
    assert fix is not None, line
    # The command it gives creates the file; then the start gets past it.
    name_and_path = fix[1].replace("NAME", "alice").split()[1:]
    added = cdcserver(*name_and_path, "--password-stdin", cwd=tmp_path, stdin="pw\n")
    assert added.returncode == 0 and expected.is_file(), added.stderr
    (tmp_path / "a-file").write_text("")
    line = refused(run("--data-dir", "a-file", "--listen", "127.0.0.1:0", cwd=tmp_path))
    assert "users_file" not in line and "store.data_dir" in line


def test_run_refuses_a_users_file_given_that_does_not_exist(tmp_path):
    line = refused(run("--users-file", "nowhere/cdcusers", "--data-dir", "data",
                       "--listen", "127.0.0.1:0", cwd=tmp_path))
    assert f"{tmp_path / 'nowhere' / 'cdcusers'} does not exist" in line


def test_users_list_and_check_refuse_a_missing_file(tmp_path):
    missing = str(tmp_path / "cdcusers")
    for args in (("users", "list", "--users-file", missing), ("users", "check", missing)):
        line = refused(cdcserver(*args))
        assert f"listener.users_file {missing} does not exist" in line, args


# -- the data directory --------------------------------------------------------------------

def test_run_refuses_a_data_dir_that_is_a_file(tmp_path, users: str):
    (tmp_path / "data").write_text("not a directory")

    line = refused(run("--users-file", users, "--data-dir", str(tmp_path / "data"),
                       "--listen", "127.0.0.1:0"))

    assert f"store.data_dir {tmp_path / 'data'} is a file, not a directory" in line
    assert "--data-dir" in line


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only file system (a tmpfs: root, which the suite runs as,
    writes through any permission bits)."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs",
                              str(mount_point)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_run_refuses_a_read_only_data_dir(read_only_dir: Path, users: str):
    line = refused(run("--users-file", users, "--data-dir", str(read_only_dir),
                       "--listen", "127.0.0.1:0"))

    assert f"store.data_dir {read_only_dir}: cannot write" in line
    assert "Read-only file system" in line and "--data-dir" in line


def test_dumps_refuses_a_data_dir_that_does_not_exist(tmp_path):
    line = refused(cdcserver("dumps", "--data-dir", str(tmp_path / "nowhere")))
    assert f"store.data_dir {tmp_path / 'nowhere'} does not exist" in line


# -- the listen address --------------------------------------------------------------------

def test_run_refuses_a_listen_port_in_use(tmp_path, users: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        line = refused(run("--users-file", users, "--data-dir", str(tmp_path / "data"),
                           "--listen", f"127.0.0.1:{port}"))

    assert f"listener.listen 127.0.0.1:{port}: Address already in use" in line
    assert "--listen" in line


# -- the environment -----------------------------------------------------------------------

def test_a_misspelled_variable_is_refused_with_the_name_meant(tmp_path):
    env = {**os.environ, "CDCSERVER_SOURCE_UR": UNREACHABLE}
    line = refused(cdcserver("dumps", "--data-dir", str(tmp_path), env=env))
    assert "unknown environment variable CDCSERVER_SOURCE_UR (did you mean " \
           "CDCSERVER_SOURCE_URL?)" in line
    with pytest.raises(ConfigError, match="unknown environment variable CDCSERVER_FOO "):
        cfg.Config.load(environ={"CDCSERVER_FOO": "1"})


def test_every_cdcserver_variable_the_project_names_is_accepted():
    """The secrets read beside the settings, and every name the code, the tests, the
    deployment files and the documentation use."""
    texts = [ROOT / name for name in ("README.md", "SECURITY.md", "protocol.md")]
    for folder in ("docs", "cdcserver", "client", "tests", "docker", "deploy"):
        texts += [path for path in (ROOT / folder).rglob("*") if path.is_file() and
                  path.suffix in ("", ".py", ".md", ".toml", ".yaml", ".service")]
    named = {name for path in texts
             for name in re.findall(r"\bCDCSERVER_[A-Z][A-Z_]*[A-Z]\b",
                                    path.read_text(errors="replace"))} - MISSPELT
    assert {"CDCSERVER_SOURCE_PASSWORD", "CDCSERVER_KAFKA_SASL_PASSWORD"} <= named
    for name in sorted(named):
        try:
            cfg.Config.load(environ={name: "1"})
        except ConfigError as exc:
            assert "unknown environment variable" not in str(exc), name


# -- the command line ----------------------------------------------------------------------

def test_version(capsys):
    import cdcserver

    with pytest.raises(SystemExit) as exited:
        cdcserver_main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"cdcserver {cdcserver.__version__}\n"


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from every_parser(command)


def test_every_option_of_every_command_has_help():
    missing = [f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
               for parser in every_parser(_parser()) for action in parser._actions
               if not action.help and not isinstance(action, argparse._SubParsersAction)]
    assert missing == []
