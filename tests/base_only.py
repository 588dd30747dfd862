"""Does a base install (``pip install mariadb-cdc``, no extras) import and run?

    python tests/base_only.py            in a virtualenv that has the base dependencies only
    python tests/base_only.py --block    in any virtualenv: every distribution that the base
                                         dependencies do not pull in is made unimportable first

Imports every module of ``cdcserver`` and ``mariadb_cdc_client``: each must import, except the
modules that exist only for an extra, which may fail only for want of that extra's own
modules. Then runs the commands that need an extra, which must say in one line which extra to
install (exit code 2), never a traceback. Prints what went wrong, one line each, and exits 1 if
anything did. Standard library only (``--block`` also uses ``packaging``), so that it runs in
the virtualenv of the README's first command (``.ci/readme-first-command``) as in the suite's
(``tests/integration/test_base_install.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.metadata as md
import io
import os
import pkgutil
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

DISTRIBUTION = "mariadb-cdc"
PACKAGES = ("cdcserver", "mariadb_cdc_client")
# Modules that exist only for an extra, and the extra's modules they may miss.
EXTRA_ONLY = {
    "cdcserver.sinks.kafka.sink": "aiokafka", "cdcserver.sinks.kafka.connect": "aiokafka",
    "cdcserver.sinks.kafka.routing": "aiokafka", "cdcserver.sinks.kafka.sender": "aiokafka",
    "cdcserver.sinks.kafka.accumulator": "aiokafka", "cdcserver.sinks.kafka.checkpoint": "aiokafka",
    "cdcserver.sinks.kafka.transactional": "aiokafka",
    "cdcserver.sinks.kafka.partitioner": "aiokafka", "cdcserver.sinks.kafka.topics": "aiokafka",
    "cdcserver.sinks.kafka.rowmessages": "aiokafka",
    "cdcserver.sinks.kafka.snapshotworker": "aiokafka",
    "mariadb_cdc_client.spark.": "pyspark|pyarrow",  # every module of the package
    "mariadb_cdc_client.arrow": "pyarrow",  # read_arrow, the arrow extra's
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_distributions() -> set[str]:
    """The project and every distribution its base dependencies pull in, by their markers."""
    from packaging.requirements import Requirement

    wanted, seen = [DISTRIBUTION], set()
    while wanted:
        name = _normal(wanted.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return seen


def blocked_modules(base: set[str]) -> set[str]:
    """Top-level modules that only distributions outside ``base`` provide."""
    blocked = set()
    for module, providers in md.packages_distributions().items():
        if module in sys.stdlib_module_names or module in PACKAGES:
            continue
        if not {_normal(p) for p in providers} & base:
            blocked.add(module)
    return blocked


class _Hiding(importlib.abc.MetaPathFinder):
    """A finder of ``sys.meta_path`` that does not find the blocked modules: their imports
    fail, and ``importlib.util.find_spec`` answers None, as where they are not installed."""

    def __init__(self, finder: Any, blocked: set[str]) -> None:
        self.finder = finder
        self.blocked = blocked

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.partition(".")[0] in self.blocked:
            return None
        return self.finder.find_spec(fullname, path, target)

    def invalidate_caches(self) -> None:
        if hasattr(self.finder, "invalidate_caches"):
            self.finder.invalidate_caches()

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:
        """Installed distributions' metadata, as before (scramp reads its own version)."""
        if hasattr(self.finder, "find_distributions"):
            return self.finder.find_distributions(*args, **kwargs)
        return iter(())


def block_extras() -> set[str]:
    blocked = blocked_modules(base_distributions())
    for name in list(sys.modules):
        if name.partition(".")[0] in blocked:
            del sys.modules[name]
    sys.meta_path[:] = [_Hiding(f, blocked) for f in sys.meta_path if hasattr(f, "find_spec")]
    return blocked


def _allowed_failure(module: str, exc: BaseException) -> bool:
    for prefix, missing in EXTRA_ONLY.items():
        if module == prefix or (prefix.endswith(".") and module.startswith(prefix)):
            name = getattr(exc, "name", None) or ""
            return isinstance(exc, ModuleNotFoundError) and \
                re.fullmatch(missing, name.partition(".")[0]) is not None
    return False


def import_everything() -> list[str]:
    problems = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001 - each is reported, none stops the walk
                if not _allowed_failure(info.name, exc):
                    problems.append(f"import {info.name}: {type(exc).__name__}: {exc}")
    return problems


def _one_line_refusal(what: str, extra: str, run: Callable[[], int]) -> list[str]:
    """``run`` must return 2 having printed one line that names the extra to install."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code: object = run()
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # noqa: BLE001 - a traceback is what this looks for
            return [f"{what}: raised {type(exc).__name__}: {exc}"]
    text = err.getvalue()
    wanted = f"pip install '{DISTRIBUTION}[{extra}]'"
    if code != 2 or text.count("\n") != 1 or wanted not in text:
        return [f"{what}: exit {code!r}, printed {text!r} (expected one line with {wanted})"]
    return []


def extra_commands(blocked: set[str]) -> list[str]:
    """The commands that need an extra, where it is missing."""
    from cdcserver.app import cli as server_cli
    from cdcserver.protocol.users import UsersFile
    from mariadb_cdc_client import cli
    from mariadb_cdc_client.spark import mirror

    problems = []
    if "aiokafka" in blocked:
        problems += _one_line_refusal("cdc kafka", "kafka", lambda: cli.main(["kafka", "t"]))
        problems += _one_line_refusal("cdc kafka --help", "kafka",
                                      lambda: cli.main(["kafka", "--help"]))
        with tempfile.TemporaryDirectory() as tmp:
            users = os.path.join(tmp, "cdcusers")
            UsersFile(users).add("u", "p")
            problems += _one_line_refusal("cdcserver run --kafka", "kafka", lambda: server_cli.main(
                ["run", "--source", "mysql://u@127.0.0.1:9", "--data-dir", tmp, "--users-file",
                 users, "--server-id", "9", "--listen", "127.0.0.1:0",
                 "--kafka", "127.0.0.1:9"]))
    if "pyspark" in blocked:
        problems += _one_line_refusal("python -m mariadb_cdc_client.spark.mirror", "spark",
                                      lambda: mirror.main(["--table", "db.t", "--path", "p",
                                                           "--checkpoint", "c", "--user", "u",
                                                           "--password", "p"]))
    return problems


def main(argv: Sequence[str]) -> int:
    blocked = block_extras() if "--block" in argv else {
        m for m in ("aiokafka", "pyspark", "pyarrow") if importlib.util.find_spec(m) is None}
    problems = import_everything() + extra_commands(blocked)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
