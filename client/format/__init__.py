"""What the service and its clients must agree on, byte for byte, and nothing else: no I/O,
no client, no server. The service imports only this package from ``mariadb_cdc_client``.

- :mod:`~mariadb_cdc_client.format.wire`: the command grammar, replies, error codes, the
  login hash;
- :mod:`~mariadb_cdc_client.format.gtid`: GTID and GTID-state syntax;
- :mod:`~mariadb_cdc_client.format.names`: table references (``db.table``, quoted names);
- :mod:`~mariadb_cdc_client.format.schema`: MariaDB types to Avro and JSON, metadata fields,
  value texts;
- :mod:`~mariadb_cdc_client.format.coltypes`: the type table, every column type from its
  binlog form to its Avro, JSON, Python, Spark and Arrow forms;
- :mod:`~mariadb_cdc_client.format.avro`: Avro object-container framing (header, blocks, sync
  markers);
- :mod:`~mariadb_cdc_client.format.dump`: the dump format (header, operations, value texts);
- :mod:`~mariadb_cdc_client.format.compiled`: how both load their optional C extensions
  (and ``CDC_PURE_PYTHON``, which does without them).
"""
