"""The assembled service: the replication runner, the command line, logging, the demo and its
private MariaDB."""
