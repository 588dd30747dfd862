"""The data directory: its layout, Avro version files, the catalog and index, checkpoints,
durable writes, the store sink, and retention."""
