"""``client``, the client library's import name up to 0.1.0: deprecated, kept for one release.

The library is :mod:`mariadb_cdc_client` now (a top-level ``client`` is hidden by any user's
own ``client.py`` and collides with other distributions). Importing ``client`` warns, then
makes ``client`` and every ``client.X`` the very module objects of ``mariadb_cdc_client`` and
``mariadb_cdc_client.X``: nothing is loaded twice, so classes, ``isinstance`` checks and module
state are the same under both names. ``python -m client.spark.mirror`` still runs too.

This folder is outside the package ``mariadb_cdc_client`` (pyproject.toml maps the name
``client`` here), so it ships as a top-level package of its own. Delete it in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

import mariadb_cdc_client

OLD = "client"
NEW = "mariadb_cdc_client"

# stacklevel 2: the frame that imported ``client`` (warnings skips importlib's own frames).
warnings.warn("the client library's import name is now 'mariadb_cdc_client'; 'client' works "
              "until the next release", DeprecationWarning, stacklevel=2)


class Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A ``sys.meta_path`` finder, and the loader of what it finds: ``client.X`` is the module
    ``mariadb_cdc_client.X``, imported under that name and handed over as it is."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        real = importlib.util.find_spec(NEW + fullname[len(OLD):])  # imports only its parents
        if real is None:
            return None  # the usual "No module named 'client.X'"
        return ModuleSpec(fullname, self, origin=real.origin, loader_state=real.name,
                          is_package=real.submodule_search_locations is not None)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(spec.loader_state)
        # Once this returns, importlib's module_from_spec sets the module's __spec__ to this
        # alias spec (it always does): keep the module's own for exec_module to put back.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran once, under its own name."""
        alias = module.__spec__
        assert alias is not None
        module.__spec__ = alias.loader_state

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m client.X`` (runpy): the code of ``mariadb_cdc_client.X``."""
        real = importlib.util.find_spec(NEW + fullname[len(OLD):])
        if real is None or not isinstance(real.loader, importlib.abc.InspectLoader):
            raise ImportError(f"no code for {fullname!r}", name=fullname)
        return real.loader.get_code(real.name)


ALIAS = Alias()

if ALIAS not in sys.meta_path:
    sys.meta_path.insert(0, ALIAS)  # before the path finder, which would load a second copy
# The import system returns what sys.modules holds once this module has run.
sys.modules[OLD] = mariadb_cdc_client
