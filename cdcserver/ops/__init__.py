"""What operators look at: Prometheus metrics (commit latency among them), /health, the
/live and /ready probes, the lag probe, ``cdcserver status`` and ``cdcserver verify``."""
