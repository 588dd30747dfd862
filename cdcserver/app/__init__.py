"""The assembled service: configuration, the replication runner, the command line, the demo
and its private MariaDB."""
