"""The data directory: its layout and file names, Avro version files, the catalog and index,
checkpoints, and the transcoder."""
