"""What operators look at: Prometheus metrics and /health, the lag probe, ``cdcserver status``
and ``cdcserver verify``."""
