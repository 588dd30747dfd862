"""The CDC service: MariaDB/MySQL binlog in, versioned Avro files and MaxScale's CDC protocol out.

One package per concern (each ``__init__`` says what it owns), lowest first: each imports
only those before it (``tests/unit/test_layers.py``). Under them all is the shared format,
``mariadb_cdc_client.format`` (``client/format``), which the clients speak too.

- ``core``: change records, table names, GTIDs, errors, the configuration, crash-safe writes;
- ``mariadb``: what MariaDB's formats mean (column types, event kinds, character sets);
- ``schema``: table definitions from DDL, the schema history, a column's Avro type;
- ``replication``: reading the source (binlog connection, event decoding, preflight);
- ``store``: the data directory: Avro version files, index, checkpoints;
- ``messages``: events built from changes and their formats (databus, dip, Debezium, ...);
- ``dump``: consistent snapshots of tables, and retention;
- ``reread``: repairs of changes the binlog carries no rows for, quarantine;
- ``sinks``: the pipeline and its sinks (the store's, Kafka's and its publisher lease);
- ``protocol``: the listener: MaxScale's CDC protocol, its users, streams and dumps;
- ``ops``: what operators look at: metrics, /health, lag, status, verify;
- ``app``: assembly: the service, its replication runner and command line, the demo.

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
