"""Packaging: what a wheel built from this tree holds (no generated C, the licence, the project
URLs) and where ``__version__`` comes from. No MariaDB needed; the wheel build compiles the C
extensions, hence ``slow``."""

from __future__ import annotations

import email.parser
import tomllib
import zipfile
from collections.abc import Iterator
from email.message import Message
from importlib import metadata
from pathlib import Path

import pytest

import cdcserver
import mariadb_cdc_client
from tests import artifacts

# The module's tests on one worker: the others need not wait for the run's one wheel.
pytestmark = pytest.mark.xdist_group("packaging")

ROOT = Path(__file__).parent.parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The run's wheel (tests/artifacts.py: built once, from a copy of the files git would
    commit, so nothing left over in this tree, a build/ directory or generated C, gets in)."""
    with zipfile.ZipFile(artifacts.wheel(tmp_path_factory)) as archive:
        yield archive


def _metadata(wheel: zipfile.ZipFile) -> Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(wheel.read(name).decode())


@pytest.mark.slow
def test_the_wheel_holds_no_generated_c_nor_cython_sources(wheel: zipfile.ZipFile):
    names = wheel.namelist()
    assert not [n for n in names if n.endswith((".c", ".pyx", ".pxd"))]
    assert "cdcserver/py.typed" in names and "mariadb_cdc_client/py.typed" in names
    assert "cdcserver/mariadb/charmaps.json.gz" in names
    for page in ("index.html", "console.js", "console.css"):  # the web console (docs/admin.md)
        assert f"cdcserver/ops/console/{page}" in names


@pytest.mark.slow
def test_the_wheel_holds_every_compiled_extension(wheel: zipfile.ZipFile):
    """The extensions are optional (a machine without a C compiler builds without them), so
    a .pyx that stops compiling (a shared .pxd not found) would otherwise go unnoticed; the
    suite's machine has gcc (tests/run.sh installs it)."""
    built = {n.split(".")[0] for n in wheel.namelist() if n.endswith(".so")}
    assert built == {"cdcserver/store/_transcode", "cdcserver/protocol/_jsonlines",
                     "cdcserver/dump/_rawrows", "cdcserver/messages/_databus",
                     "cdcserver/replication/_bindecimal", "cdcserver/replication/_rowdecode",
                     "cdcserver/sinks/kafka/_murmur2",
                     "mariadb_cdc_client/spark/_avroarrow", "mariadb_cdc_client/format/_records",
                     "mariadb_cdc_client/format/_dumprows"}


@pytest.mark.slow
def test_the_wheel_installs_the_client_as_mariadb_cdc_client_and_client_as_the_shim(
        wheel: zipfile.ZipFile):
    """client/ goes in as mariadb_cdc_client, every module of it; the top-level ``client`` is
    the deprecated alias alone, and the folder it comes from is not in the new package."""
    names = wheel.namelist()
    client_modules = {f"mariadb_cdc_client/{p.relative_to(ROOT / 'client').as_posix()}"
                      for p in (ROOT / "client").rglob("*.py") if "_legacy" not in p.parts}
    assert {"mariadb_cdc_client/__init__.py", "mariadb_cdc_client/format/wire.py",
            "mariadb_cdc_client/spark/source.py"} <= client_modules
    assert client_modules == {n for n in names if n.startswith("mariadb_cdc_client/")
                              and n.endswith(".py")}
    assert [n for n in names if n.startswith("client/")] == ["client/__init__.py"]
    assert "import mariadb_cdc_client" in wheel.read("client/__init__.py").decode()
    assert not [n for n in names if "_legacy" in n]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "cdc = mariadb_cdc_client.cli:main" in wheel.read(entry_points).decode()


def test_every_package_folder_is_in_the_package_list():
    """pyproject.toml lists the packages (the client's folder has another name): a new
    subpackage must be added there, or the wheel would leave it out."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"mariadb_cdc_client": "client",
                                         "client": "client/_legacy/client"}
    folders = {"cdcserver": ROOT / "cdcserver", "mariadb_cdc_client": ROOT / "client"}
    found = {"client"}
    for name, folder in folders.items():
        found.update(".".join((name, *init.parent.relative_to(folder).parts))
                     for init in folder.rglob("__init__.py") if "_legacy" not in init.parts)
    assert sorted(setuptools["packages"]) == sorted(found)


@pytest.mark.slow
def test_the_wheel_carries_the_apache_licence(wheel: zipfile.ZipFile):
    (licence,) = [n for n in wheel.namelist() if ".dist-info/" in n and n.endswith("/LICENSE")]
    text = wheel.read(licence).decode()
    assert text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a notice
    assert _metadata(wheel)["License-Expression"] == PYPROJECT["project"]["license"] \
        == "Apache-2.0"


@pytest.mark.slow
def test_the_wheel_metadata_has_the_version_and_the_project_urls(wheel: zipfile.ZipFile):
    info = _metadata(wheel)
    assert info["Version"] == PYPROJECT["project"]["version"]
    urls = dict(u.split(", ", 1) for u in info.get_all("Project-URL", []))
    assert set(urls) >= {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(u.startswith("https://github.com/mariadb-cdc/mariadb-cdc") for u in urls.values())
    assert info.get_all("Classifier") and info["Keywords"]


def test_version_is_the_installed_distributions():
    assert cdcserver.__version__ == mariadb_cdc_client.__version__ \
        == metadata.version("mariadb-cdc") == PYPROJECT["project"]["version"]


def test_version_in_a_source_tree_never_installed(monkeypatch: pytest.MonkeyPatch):
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    from mariadb_cdc_client.format.version import installed_version, source_tree_version

    assert installed_version() == PYPROJECT["project"]["version"]
    assert source_tree_version(ROOT / "no-such-file.toml") == "0+unknown"
