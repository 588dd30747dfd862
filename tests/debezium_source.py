"""Debezium's own binlog source connector in Kafka Connect standalone (tests/kafka_connect.py),
reading the same MariaDB as the service: for bench/bench_peers.py (issue 53) and its smoke
test.

The connector is Debezium 3.6.1's MySQL connector (tests/jvm/debezium-mariadb/pom.xml says
why not its MariaDB one) with everything kept on this machine: offsets in the worker's file
(``offset.storage.file.filename``), the schema history in a file
(``io.debezium.storage.file.history.FileSchemaHistory``), no Kafka topic of its own but the
change topics ``<prefix>.<db>.<table>`` and the schema change topic ``<prefix>``.

Snapshot mode ``configuration_based`` with schema, data and nothing else snapshotted, only
``start.stream``: the connector reads the binlog from its oldest file, as the service's
``start_gtid = "oldest"`` does, and learns the tables from the DDL it reads there. Debezium
3.6 has no ``never`` any more (``BinlogConnectorConfig.SnapshotMode``), and ``no_data``
would take the schema from the server and stream from the current position, after the
workload.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cdcserver.app.embedded import EmbeddedMariaDB
from tests import jvm
from tests.kafka_connect import KafkaConnect

CONNECTOR = "io.debezium.connector.mysql.MySqlConnector"
USER, PASSWORD = "debezium", "debezium-pw"

# What Kafka's bin/connect-standalone.sh runs a worker with when KAFKA_HEAP_OPTS and
# KAFKA_JVM_PERFORMANCE_OPTS are unset (kafka-run-class.sh): a benchmark measures the JVM
# its users run, not the tests' short-lived one (jvm.JVM_OPTIONS).
CONNECT_HEAP = "2g"
CONNECT_TUNING = ("-Xms256m", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                  "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                  "-Djava.awt.headless=true")


def create_user(server: EmbeddedMariaDB, user: str = USER, password: str = PASSWORD) -> None:
    """The connector's user, with the privileges Debezium's MySQL connector documents:
    REPLICATION SLAVE and REPLICATION CLIENT (MariaDB's BINLOG MONITOR) to read the binlog,
    SELECT and RELOAD (a snapshot's, which this one does not take; asked for all the same)."""
    server.execute(f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
                   "GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT, RELOAD ON *.* TO "
                   f"'{user}'@'127.0.0.1'")


def connector_config(server: EmbeddedMariaDB, directory: str | os.PathLike[str], *,
                     prefix: str, databases: str, server_id: int,
                     user: str = USER, password: str = PASSWORD) -> dict[str, object]:
    """The source connector reading ``server``'s binlog from its start, the tables of
    ``databases`` (a comma-separated include list) to ``<prefix>.<db>.<table>``."""
    return {
        "connector.class": CONNECTOR,
        "tasks.max": 1,
        "database.hostname": "127.0.0.1",
        "database.port": server.port,
        "database.user": user,
        "database.password": password,
        "database.server.id": server_id,
        "database.include.list": databases,
        "topic.prefix": prefix,
        "snapshot.mode": "configuration_based",
        "snapshot.mode.configuration.based.snapshot.schema": "false",
        "snapshot.mode.configuration.based.snapshot.data": "false",
        "snapshot.mode.configuration.based.start.stream": "true",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": os.path.join(directory, "schema-history"),
    }


def worker(directory: str | os.PathLike[str], bootstrap: str, *,
           producer: Mapping[str, object] | None = None, tuned: bool = False) -> KafkaConnect:
    """A standalone worker of the ``debezium-mariadb`` component (not started): ``producer``
    settings over Connect's (:func:`tests.kafka_connect.producer_settings`); ``tuned``: the JVM of
    connect-standalone.sh (:data:`CONNECT_TUNING`), else the tests' small one."""
    if tuned:
        return KafkaConnect(directory, bootstrap, component="debezium-mariadb",
                            heap=CONNECT_HEAP, tuning=CONNECT_TUNING, worker=producer)
    return KafkaConnect(directory, bootstrap, component="debezium-mariadb", heap="384m",
                        tuning=jvm.JVM_OPTIONS, worker=producer)
