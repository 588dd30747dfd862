"""Tests with other software: a Kafka broker, Spark, Prometheus, a Galera cluster, MaxScale's
and Go clients, pip, and the Docker and systemd files."""
