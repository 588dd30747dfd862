"""The data directory: its layout, Avro version files, the catalog and index, checkpoints,
durable writes, and the store sink."""
