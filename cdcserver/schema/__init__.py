"""The schema history: table definitions learned from DDL and the source, which give the
binlog's columns their names and types, and the Avro type each column maps to."""
