"""A container's health check: ``python -m cdcserver.ops.probe ready --config FILE``.

Asks the running service's ``/ready`` (or ``/live``, ``/health``) and exits 0 on 200, 1
otherwise (Docker's HEALTHCHECK codes: 2 is reserved), writing the answer on one line
(``docker inspect`` keeps it in the health log). The service image has no curl; this needs
nothing but the service's own package.
"""

from __future__ import annotations

import argparse
import json
import sys

from cdcserver.core.config import Config, add_config_flag
from cdcserver.core.errors import ConfigError
from cdcserver.ops.status import endpoint_url, fetch_health

PROBES = ("live", "ready", "health")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cdcserver.ops.probe",
                                description="exit 0 when the service's probe answers 200")
    p.add_argument("probe", choices=PROBES, help="GET /live, /ready or /health")
    where = p.add_mutually_exclusive_group(required=True)
    add_config_flag(where, "its [metrics] listen is asked")
    where.add_argument("--url", metavar="URL", help="the endpoint, e.g. http://127.0.0.1:4002")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        url = args.url or endpoint_url(Config.load(args.config))
    except ConfigError as exc:
        sys.stderr.write(f"probe: {exc}\n")
        return 1  # Docker reserves 2
    good, document = fetch_health(url, f"/{args.probe}")
    sys.stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
