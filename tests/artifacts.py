"""What the suite builds from the source tree, once per run: the wheel and the Spark
executors' packed environment.

Each is built by the first test that needs it and kept for the run, shared by the
pytest-xdist workers through a lock in the run's temporary folder (the one the workers'
own folders are in), as pytest-xdist documents for session data. The wheel is built from a
copy of the files git would commit, never in the checkout: pip builds a local tree in place
(``build/``, the generated C), and two builds of one tree at once collide there (``File
exists: build/bdist.linux-x86_64/wheel/mariadb_cdc-0.1.0.dist-info``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).parent.parent


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder this run's workers share (each worker's base folder is inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("gw") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Path]) -> Path:
    """``build(folder)``'s result, built by one worker in ``folder`` and reused by all."""
    folder = run_folder(tmp_path_factory) / name
    done = folder.with_suffix(".done")
    with FileLock(str(folder.with_suffix(".lock"))):
        if done.exists():
            return Path(done.read_text())
        if folder.exists():  # a build that failed: start again
            shutil.rmtree(folder)
        folder.mkdir()
        result = build(folder)
        done.write_text(str(result))
        return result


def committed_copy(target: Path) -> Path:
    """The files git would commit (tracked, and new ones not ignored), copied to ``target``:
    nothing left over in the checkout (``build/``, generated C, compiled extensions) gets in."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / name)
    return target


def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This package's wheel, built as `pip install` builds one (but unoptimised), from a
    committed copy."""
    def build(folder: Path) -> Path:
        source = committed_copy(folder / "src")
        # Unoptimised: what the tests read is which files the wheel holds, and every
        # extension still has to compile; -O3 with debug information costs three times the
        # CPU (68 s against 21 s) on two cores the other workers share.
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                                "--disable-pip-version-check", "--wheel-dir",
                                str(folder / "dist"), str(source)],
                               env={**os.environ, "CFLAGS": "-O0 -g0"},
                               capture_output=True, text=True, timeout=900, check=False)
        assert built.returncode == 0, built.stdout + built.stderr
        (path,) = (folder / "dist").glob("mariadb_cdc-*.whl")
        return path

    return built_once(tmp_path_factory, "wheel", build)


def packed_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Spark executors' environment, as docs/spark.md says to build it, with this run's
    wheel (``--wheel``) instead of a second build of the tree."""
    built_wheel = wheel(tmp_path_factory)

    def build(folder: Path) -> Path:
        out = folder / "cdc-env.tar.gz"
        done = subprocess.run([sys.executable, "-m", "mariadb_cdc_client.spark.pack", str(out),
                               "--wheel", str(built_wheel)],
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        return out

    return built_once(tmp_path_factory, "pack", build)
