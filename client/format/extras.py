"""The optional parts of the distribution, and the one-line error when one is missing.

``pip install mariadb-cdc`` installs the service and the client library; Kafka (``aiokafka``)
Spark (``pyspark``, ``pyarrow``, ``cavro``) and Arrow record batches (``pyarrow``) come with the
``kafka``, ``spark`` and ``arrow`` extras.
Code that needs an extra calls :func:`require` before importing it, so that a user without it
reads which extra to install instead of a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "mariadb-cdc"

EXTRAS = {
    "kafka": ("aiokafka",),
    "arrow": ("pyarrow",),  # read_arrow: record batches for pyarrow, pandas, Polars, DuckDB
    "spark": ("pyspark", "pyarrow"),  # and cavro, which is faster but has a fallback
}


class MissingExtra(ModuleNotFoundError):
    """A feature was used whose extra is not installed (``name``: the missing module)."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(f"{feature} needs the '{extra}' extra ({module} is not installed): "
                         f"pip install '{DISTRIBUTION}[{extra}]'", name=module)
        self.extra = extra


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(feature, extra, module)
