"""The assembled service: the replication runner, what it checks as it starts, the command
line, logging, the demo and its private MariaDB."""
