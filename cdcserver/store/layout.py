"""The data directory's layout: the contract between the writers (the store, the schema
history, the Kafka sink, the dumper) and the readers (the listener, verify, the dump
commands, the CLI). Every path into it is asked of :class:`DataDir`; no other module joins
names under the data directory.

::

    <data_dir>/
      avro/     db.table.NNNNNN.avro and .avsc: the change stream, a file per table version
      dump/     db.table.<time>.dump (complete), .partial and .progress (being written)
      state/    checkpoint.json      the durable position and each table's durable length
                index.sqlite         transactions, their tables and positions (the GTID index)
                schema_history.jsonl every schema change, with its GTID
                views.sqlite         the stream's own view of tables, for repairs
                kafka.json           what the Kafka sink has delivered
                writer.lock          held by the one process that writes here
                .room-probe          written and removed to tell a full disk has room again
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cdcserver.store.naming import TableName


@dataclass(frozen=True)
class DataDir:
    root: str

    @property
    def avro(self) -> str:
        return os.path.join(self.root, "avro")

    @property
    def dumps(self) -> str:
        return os.path.join(self.root, "dump")

    @property
    def state(self) -> str:
        return os.path.join(self.root, "state")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.state, "checkpoint.json")

    @property
    def index(self) -> str:
        return os.path.join(self.state, "index.sqlite")

    @property
    def schema_history(self) -> str:
        return os.path.join(self.state, "schema_history.jsonl")

    @property
    def views(self) -> str:
        return os.path.join(self.state, "views.sqlite")

    @property
    def kafka_state(self) -> str:
        return os.path.join(self.state, "kafka.json")

    @property
    def writer_lock(self) -> str:
        return os.path.join(self.state, "writer.lock")

    @property
    def room_probe(self) -> str:
        return os.path.join(self.state, ".room-probe")

    def table_file(self, table: TableName, version: int, suffix: str) -> str:
        """A table version's file in ``avro/`` (``suffix``: ``avro`` or ``avsc``)."""
        return os.path.join(self.avro, table.file_name(version, suffix))

    def avro_file(self, file_name: str) -> str:
        return os.path.join(self.avro, file_name)

    def dump_file(self, file_name: str) -> str:
        return os.path.join(self.dumps, file_name)
