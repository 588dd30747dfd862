"""What Spark executors on a cluster need to run the ``cdc`` source: a packed virtualenv.

    python -m mariadb_cdc_client.spark.pack cdc-env.tar.gz
    spark-submit --master spark://HOST:7077 --archives cdc-env.tar.gz#environment \\
        --conf spark.pyspark.python=./environment/bin/python app.py

On a cluster (standalone, YARN, Kubernetes) executors are other processes, often on other
hosts, with their own Python, which does not have this package: a read fails there with
Spark's ``No module named 'mariadb_cdc_client'``. Spark's documented answer for Python
dependencies ("Python Package Management") is a packed virtualenv shipped with
``--archives`` (``spark.archives``), unpacked in each executor's working directory, whose
interpreter ``spark.pyspark.python`` names. This builds one: a virtualenv of the interpreter
this runs on, holding this package (its compiled Avro-to-Arrow decoder included, built for
that interpreter) and what the Spark source needs on an executor (``fastavro``, ``pyarrow``,
``scramp``, ``cavro``), not PySpark (each executor has the cluster's own) nor the service's
dependencies. It is a gzipped tar of the virtualenv, as ``venv-pack`` makes one.

As with ``venv-pack``, the executors' hosts need the same Python at the same path as this
one (the virtualenv's ``bin/python`` links to it; a container image built from the same base
has it): the archive carries the packages, not the interpreter.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

DISTRIBUTION = "mariadb-cdc"
# What the Spark source imports on an executor (client/spark/source.py, arrow.py; login.py)
EXECUTOR_PACKAGES = ("fastavro", "pyarrow", "scramp", "cavro")


def base_python() -> str:
    """The interpreter a virtualenv of this one is made from (its base, when this runs in a
    virtualenv itself)."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def this_package() -> str:
    """What pip installs this package from: the source tree it is imported from (an editable
    install, a checkout), else the same version from the index."""
    import mariadb_cdc_client

    tree = os.path.dirname(os.path.dirname(os.path.abspath(mariadb_cdc_client.__file__)))
    if os.path.isfile(os.path.join(tree, "pyproject.toml")) and \
            os.path.isdir(os.path.join(tree, "cdcserver")):
        return tree
    dist = importlib.metadata.distribution(DISTRIBUTION)
    direct = dist.read_text("direct_url.json")
    if direct:
        url = json.loads(direct).get("url", "")
        if url.startswith("file://"):
            return url[len("file://"):]
    return f"{DISTRIBUTION}=={dist.version}"


def requirements() -> list[str]:
    """The executor packages, with the version ranges this package declares for them."""
    declared = importlib.metadata.requires(DISTRIBUTION) or []
    found = []
    for name in EXECUTOR_PACKAGES:
        spec = next((r.split(";")[0].strip() for r in declared
                     if re.match(rf"{name}\b", r.split(";")[0].strip())), name)
        found.append(spec)
    return found


def pack(output: str, python: str | None = None, log: bool = True,
         wheel: str | None = None) -> str:
    """Build the archive at ``output``; returns its path. ``wheel``: this package as a wheel
    already built for that interpreter (else it is built here)."""
    output = os.path.abspath(output)
    with tempfile.TemporaryDirectory(prefix="cdc-pack-") as work:
        env = os.path.join(work, "environment")
        _run([python or base_python(), "-m", "venv", env], log)
        pip = [os.path.join(env, "bin", "python"), "-m", "pip", "install", "--quiet",
               "--disable-pip-version-check"]
        _run([*pip, *requirements()], log)
        _run([*pip, "--no-deps", wheel or _installable(this_package(), work)], log)
        _check(env)
        partial = output + ".partial"
        with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
            for entry in sorted(os.listdir(env)):
                tar.add(os.path.join(env, entry), arcname=entry)
        os.replace(partial, output)
    return output


# What a source tree holds that is not source: a build of it in the copy starts clean
_NOT_SOURCE = ("build", "dist", "*.egg-info", ".git", ".venv", "__pycache__", "*.so",
               ".pytest_cache", ".mypy_cache", ".ruff_cache", ".cdc-demo", ".cdc-test",
               "test-artifacts")


def _installable(package: str, work: str) -> str:
    """What pip installs: a requirement as it is; a source tree copied first. pip builds a
    local tree in place (``build/`` and the generated C beside the sources), so two builds of
    one checkout at once, or a build beside a running editable install, would share
    ``build/bdist.*/wheel``: the copy keeps every build of this package out of the user's
    tree."""
    if not os.path.isdir(package):
        return package
    copy = os.path.join(work, "source")
    shutil.copytree(package, copy, symlinks=True,
                    ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    return copy


def _check(env: str) -> None:
    """The packed interpreter imports what the source needs and its compiled decoder, outside
    any source tree (PySpark itself comes from the executor's Spark)."""
    probe = ("import fastavro, pyarrow, scramp, cavro, mariadb_cdc_client.format.dump, "
             "mariadb_cdc_client.login; import mariadb_cdc_client.spark._avroarrow")
    subprocess.run([os.path.join(env, "bin", "python"), "-c", probe], check=True,
                   cwd=env, env={"PATH": "/usr/bin:/bin"})


def _run(command: list[str], log: bool) -> None:
    if log:
        sys.stderr.write("+ " + " ".join(command) + "\n")
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mariadb_cdc_client.spark.pack",
                                     description="Pack a virtualenv for Spark executors "
                                                 "(--archives FILE#environment)")
    parser.add_argument("output", help="the archive to write (e.g. cdc-env.tar.gz)")
    parser.add_argument("--python", help="the interpreter to build it for (default: the base "
                                         "of this one; the executors need the same)")
    parser.add_argument("--wheel", help="install this package from this wheel (built for that "
                                        "interpreter) instead of building it")
    args = parser.parse_args(argv)
    path = pack(args.output, args.python, wheel=args.wheel)
    sys.stdout.write(f"{path}: ship with --archives {os.path.basename(path)}#environment "
                     "and --conf spark.pyspark.python=./environment/bin/python\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
