"""Reading the source: the binlog connection, event and row decoding, the replicator thread,
and the preflight check of the source's settings."""
