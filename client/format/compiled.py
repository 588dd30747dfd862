"""The optional C extensions: one way to load one, and the switch that does without them.

Each extension stands in for a Python path that gives the same results. It is built where
a C compiler was there at install; without one the module is absent and the Python path
runs. ``CDC_PURE_PYTHON`` set to any non-empty value keeps the Python paths even where the
extensions are built, to measure or test them.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

PURE_PYTHON_ENV = "CDC_PURE_PYTHON"


def pure_python() -> bool:
    """Whether ``CDC_PURE_PYTHON`` asks for the Python paths."""
    return bool(os.environ.get(PURE_PYTHON_ENV))


def compiled_module(name: str, *, unless_pure_python: bool = True) -> Any:
    """The extension module ``name`` (``"cdcserver.replication._rowdecode"``), or None where
    it is not built or, with ``unless_pure_python``, where ``CDC_PURE_PYTHON`` is set at
    import. A caller that asks :func:`pure_python` on each use loads it regardless."""
    if unless_pure_python and pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: the Python path
        return None
