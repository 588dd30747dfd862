"""Reading the source: the binlog connection, event and row decoding, character sets, the
replicator thread, and the preflight check of the source's settings."""
