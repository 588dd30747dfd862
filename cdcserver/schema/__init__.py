"""The schema history: table definitions learned from DDL and the source, which give the
binlog's columns their names and types. ``ddl`` reads statements (``statements``: what they
do), ``alter`` applies one ALTER action to a definition, ``history`` keeps each table's
definition by GTID, ``layouts`` turns a definition into the layout a version is written in,
and ``avrotypes`` maps a column's type to Avro."""
