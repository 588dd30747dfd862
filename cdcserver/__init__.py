"""The CDC service: MariaDB/MySQL binlog in, versioned Avro files and MaxScale's CDC protocol out.

One package per concern (each ``__init__`` says what it owns):

- ``core``: the change records, GTIDs, errors, the configuration, the pipeline to the sinks;
- ``mariadb``: what MariaDB's formats mean (column types, event kinds, character sets);
- ``replication``: reading the source (binlog connection, event decoding, preflight);
- ``schema``: the schema history that gives the binlog's columns names and types;
- ``reread``: repairs of changes the binlog carries no rows for;
- ``store``: the data directory: Avro version files, index, checkpoints;
- ``kafka``: the Kafka sink and its message formats;
- ``dump``: consistent snapshots of tables, and retention;
- ``protocol``: the listener: MaxScale's CDC protocol, its users, streams and dumps;
- ``ops``: what operators look at: metrics, /health, lag, status, verify;
- ``app``: the assembled service, its replication runner and command line, the demo.

``__version__`` is the installed distribution's version (pyproject.toml's), loaded when first
asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    __version__: str


def __getattr__(name: str) -> Any:
    if name != "__version__":
        raise AttributeError(f"module 'cdcserver' has no attribute {name!r}")
    from mariadb_cdc_client.format.version import installed_version

    globals()[name] = version = installed_version()
    return version
