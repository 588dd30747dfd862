"""The data directory's layout: the contract between the writers (the store, the schema
history, the Kafka sink, the dumper) and the readers (the listener, verify, the dump
commands, the CLI). Every path into it is asked of :class:`DataDir`; no other module joins
names under the data directory.

::

    <data_dir>/
      avro/     db.table.NNNNNN.avro and .avsc: the change stream, a file per table version
      dump/     db.table.<time>.dump (complete), .partial and .progress (being written)
      state/    checkpoint.json      the durable position and each table's durable length
                checkpoint.log       the checkpoints since, each with the tables that changed
                index.sqlite         transactions, their tables and positions (the GTID index)
                schema_history.jsonl every schema change, with its GTID
                views.sqlite         the stream's own view of tables, for repairs
                kafka.json           what the Kafka sink has delivered
                source.json          the server replication reads now (server_id@host:port)
                writer.lock          held by the one process that writes here
                resync/              resyncs of quarantined tables asked for (cdcserver resync)
                capture.json         the [capture] filters of the last start, dumps owed
                login-secret         what SCRAM's answers for unknown user names come from
                .room-probe          written and removed to tell a full disk has room again
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cdcserver.core.names import TableName
from cdcserver.store.naming import dump_stem, version_file


class _Path:
    """A path under the data directory, declared once as its parts."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, data_dir: DataDir, owner: type | None = None) -> str:
        return os.path.join(data_dir.root, *self.parts)


@dataclass(frozen=True)
class DataDir:
    root: str

    avro = _Path("avro")
    dumps = _Path("dump")
    state = _Path("state")
    checkpoint = _Path("state", "checkpoint.json")
    checkpoint_log = _Path("state", "checkpoint.log")  # checkpoint.journal_path(checkpoint)
    index = _Path("state", "index.sqlite")
    schema_history = _Path("state", "schema_history.jsonl")
    views = _Path("state", "views.sqlite")
    kafka_state = _Path("state", "kafka.json")
    kafka_snapshot = _Path("state", "kafka-snapshot.json")  # the initial snapshot's points
    source = _Path("state", "source.json")
    writer_lock = _Path("state", "writer.lock")
    room_probe = _Path("state", ".room-probe")
    resync_requests = _Path("state", "resync")
    xa = _Path("state", "xa")  # prepared XA transactions' events (replication/xa.py)
    capture = _Path("state", "capture.json")  # the filters of the last start (dump/included)
    login_secret = _Path("state", "login-secret")  # protocol/scram.py's made-up verifiers

    def resync_request(self, table: TableName) -> str:
        """The file that asks the running service to resync a quarantined table."""
        return os.path.join(self.resync_requests, f"{dump_stem(table)}.request")

    def restrict(self, group: bool = False) -> None:
        """The directory its owner's (or its group's too) only: written by an earlier version,
        it may be 0755; its entries cannot be reached past it."""
        if os.path.isdir(self.root):
            os.chmod(self.root, 0o750 if group else 0o700)

    def table_file(self, table: TableName, version: int, suffix: str) -> str:
        """A table version's file in ``avro/`` (``suffix``: ``avro`` or ``avsc``)."""
        return os.path.join(self.avro, version_file(table, version, suffix))

    def avro_file(self, file_name: str) -> str:
        return os.path.join(self.avro, file_name)

