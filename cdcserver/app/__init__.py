"""The assembled service (assembly only: each part is its package's), the replication runner,
what it checks as it starts, the command line, logging, the demo and its private MariaDB."""
