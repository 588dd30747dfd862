"""The JVM programs the tests run (Apache Kafka; others beside it), resolved by Maven before
the tests start: ``bash tests/jvm/fetch.sh`` (tests/run.sh calls it) reads
``tests/jvm/<component>/pom.xml`` and writes the component's classpath into the cache,
``${CDC_TEST_CACHE:-~/.cache/mariadb-cdc-tests}/classpath/<component>-<pom hash>.txt`` (named
by the pom's content: a changed pom needs fetching again). A test only reads that file:
nothing is downloaded while a test runs.

Adding a component: a folder ``tests/jvm/<name>/`` holding a ``pom.xml`` (``<packaging>pom``,
pinned ``<dependencies>``, nothing to build); then ``classpath("<name>")`` gives the ``-cp``
argument and :func:`java` a command line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

HERE = Path(__file__).parent

# A JVM that lives seconds to minutes beside the other test workers on two shared cores:
# compiled by C1 alone (C2 spends more CPU warming up than such a run gains), one collector
# thread, the class data sharing archive when the runtime has one.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=1",
               "-Xshare:auto", "-Djava.awt.headless=true")


class MissingComponent(RuntimeError):
    """A component's classpath was not fetched (or its pom.xml changed since)."""


def pom_hash(pom: Path) -> str:
    """What tests/jvm/fetch.sh names the classpath file by (``sha256sum | cut -c1-16``)."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("CDC_TEST_CACHE") or
                Path.home() / ".cache" / "mariadb-cdc-tests")


def classpath(component: str) -> str:
    """The ``-cp`` of a component, as ``tests/jvm/fetch.sh`` resolved it."""
    pom = HERE / component / "pom.xml"
    if not pom.is_file():
        raise MissingComponent(f"no JVM component {component!r}: {pom} does not exist")
    path = cache_dir() / "classpath" / f"{component}-{pom_hash(pom)}.txt"
    fetch = f"bash tests/jvm/fetch.sh {component}"
    if not path.is_file():
        raise MissingComponent(f"{component} is not fetched for this {pom} ({path} does not "
                               f"exist): run `{fetch}` (tests/run.sh does) with Maven "
                               "installed")
    text = path.read_text().strip()
    missing = [jar for jar in text.split(os.pathsep) if not os.path.isfile(jar)]
    if not text or missing:
        raise MissingComponent(f"{path} names jars that are gone ({missing[:1]}): run "
                               f"`{fetch}`")
    return text


def java() -> str:
    """The ``java`` launcher (``JAVA_HOME``'s when set)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise MissingComponent("no `java` on PATH: install default-jre-headless "
                               "(tests/run.sh does)")
    return found


def command(component: str, main_class: str, *args: str, heap: str = "256m",
            options: tuple[str, ...] = (), tuning: tuple[str, ...] = JVM_OPTIONS) -> list[str]:
    """A command line running ``main_class`` of ``component`` in a small JVM (``tuning``:
    other JVM options instead of the tests' short-lived ones, as a benchmark runs a JVM the
    way its users do)."""
    return [java(), f"-Xmx{heap}", *tuning, *options, "-cp", classpath(component),
            main_class, *args]
