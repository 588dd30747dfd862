"""A base install (``pip install mariadb-cdc``, no extras) imports every module and runs every
command; commands of an extra name it in one line. The README's first command depends on it:
once a module-level import of the ``kafka`` extra made it fail on every fresh machine while
the suite, whose virtualenv has every extra, stayed green.

The suite's virtualenv has the extras, so ``tests/base_only.py --block`` hides every
distribution the base dependencies do not pull in (by pyproject.toml's installed metadata)
before importing; ``.ci/readme-first-command`` runs the same script in a real base install.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_every_module_imports_and_every_command_runs_without_the_extras():
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "base_only.py"), "--block"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_extras_are_hidden_by_the_check():
    """The check hides what only the extras bring (it would pass vacuously otherwise)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import base_only
    finally:
        sys.path.remove(str(ROOT / "tests"))
    blocked = base_only.blocked_modules(base_only.base_distributions())
    assert {"aiokafka", "pyspark", "pyarrow", "cavro", "pytest"} <= blocked
    assert not {"orjson", "fastavro", "pymysqlreplication", "pymysql", "tenacity"} & blocked


def test_read_arrow_without_pyarrow_names_the_extra():
    """Without pyarrow (the base install, as base_only.py hides it) the module that reads
    Arrow batches says which extra brings it, and is still a ModuleNotFoundError."""
    code = ("import sys; sys.path.insert(0, 'tests'); import base_only; "
            "base_only.block_extras(); "
            "import mariadb_cdc_client.arrow")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, check=False)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("mariadb_cdc_client.format.extras.MissingExtra: mariadb_cdc_client.arrow "
                    "(read_arrow) needs the 'arrow' extra (pyarrow is not installed): "
                    "pip install 'mariadb-cdc[arrow]'"), result.stderr
