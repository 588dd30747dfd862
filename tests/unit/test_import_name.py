"""The client library's import name, ``mariadb_cdc_client``, and ``client``, its name up to
0.1.0, kept for one release as a deprecated alias of the very same modules.

Each case runs in a Python process of its own, as a user's program would: outside the source
tree (whose folder client/ would otherwise be importable as ``client``), without PYTHONPATH,
with the library as installed (``pip install -e .`` here). The suite itself never imports the
old name: its warning is an error under pytest's settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mariadb_cdc_client

DEPRECATION = ("the client library's import name is now 'mariadb_cdc_client'; 'client' works "
               "until the next release")


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -E *args`` in ``cwd``: no PYTHON* variables, so the tree is not on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-E", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _script(folder: Path, name: str, code: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(code))
    return path


USERS_PROGRAM = """
    import client  # the user's own client.py, beside this program

    from mariadb_cdc_client import SyncCdcClient
    from mariadb_cdc_client.spark import register

    assert client.MINE == "the user's", client
    print(register.__module__, SyncCdcClient.__module__)
"""


def test_the_library_imports_beside_a_users_own_client_py(tmp_path: Path):
    _script(tmp_path, "client.py", 'MINE = "the user\'s"\n')
    program = _script(tmp_path, "program.py", USERS_PROGRAM)

    ran = _run(tmp_path, str(program))

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["mariadb_cdc_client.spark", "mariadb_cdc_client.sync"]
    assert ran.stderr == ""


OLD_NAME = """
    import sys
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import client
    import mariadb_cdc_client

    (warning,) = caught
    assert warning.category is DeprecationWarning, warning
    print(warning.message)
    assert warning.filename == __file__, warning.filename  # points at this import

    assert client is mariadb_cdc_client
    assert client.SyncCdcClient is mariadb_cdc_client.SyncCdcClient

    import client.format.wire
    from client.spark import register

    assert sys.modules["client.format.wire"] is sys.modules["mariadb_cdc_client.format.wire"]
    assert client.format.wire.__spec__.name == "mariadb_cdc_client.format.wire"
    new = mariadb_cdc_client.format.wire
    assert isinstance(new.ProtocolError(new.Code.BAD_AUTH, "x"), client.format.wire.ProtocolError)
    from mariadb_cdc_client.spark import register as same

    assert register is same
    aliases = [name for name in sys.modules if name.startswith("client.")]
    assert aliases and all(sys.modules[name] is sys.modules["mariadb_cdc_client" + name[6:]]
                           for name in aliases), aliases
    try:
        import client.no_such_module
    except ModuleNotFoundError as exc:
        assert exc.name == "client.no_such_module", exc
    else:
        raise AssertionError("client.no_such_module imported")
    print("ok")
"""


def test_the_old_name_warns_and_is_the_same_modules(tmp_path: Path):
    program = _script(tmp_path, "old_name.py", OLD_NAME)

    ran = _run(tmp_path, "-I", str(program))

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [DEPRECATION, "ok"]


def test_the_old_name_still_runs_a_module(tmp_path: Path):
    """``python -m client.X`` runs ``mariadb_cdc_client.X`` (the warning is then runpy's, which
    Python's default filters do not show)."""
    ran = _run(tmp_path, "-I", "-W", "always::DeprecationWarning", "-m", "client.cli",
               "--version")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"cdc {mariadb_cdc_client.__version__}\n"
    assert f"DeprecationWarning: {DEPRECATION}" in ran.stderr
