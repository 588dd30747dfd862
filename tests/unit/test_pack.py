"""``python -m mariadb_cdc_client.spark.pack``'s source of this package: a source tree is
copied before pip builds it (pip builds a local tree in place, and two builds of one
checkout at once collide in its ``build/``), with nothing of an earlier build in the copy.
The whole pack runs in tests/integration/test_spark_cluster.py."""

from __future__ import annotations

from pathlib import Path

from mariadb_cdc_client.spark import pack


def test_a_source_tree_is_built_from_a_copy_without_what_builds_left(tmp_path: Path):
    tree = tmp_path / "checkout"
    for name in ("pyproject.toml", "setup.py", "cdcserver/__init__.py", "cdcserver/x.pyx",
                 "client/format/_records.pyx", "build/bdist.linux-x86_64/wheel/m.dist-info/RECORD",
                 "mariadb_cdc.egg-info/PKG-INFO", "cdcserver/_x.cpython-311-x86_64-linux-gnu.so",
                 "cdcserver/__pycache__/x.pyc", ".git/HEAD", ".venv/bin/python"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name)
    work = tmp_path / "work"
    work.mkdir()
    copy = Path(pack._installable(str(tree), str(work)))
    assert copy.parent == work
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "cdcserver/__init__.py", "cdcserver/x.pyx", "client/format/_records.pyx",
        "pyproject.toml", "setup.py"]
    assert (tree / "build").is_dir()  # the checkout itself is left as it was


def test_a_requirement_is_installed_as_it_is(tmp_path: Path):
    assert pack._installable("mariadb-cdc==0.1.0", str(tmp_path)) == "mariadb-cdc==0.1.0"
    assert not list(tmp_path.iterdir())
