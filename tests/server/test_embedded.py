"""The private MariaDB the demo, the benchmarks and the tests start."""

from __future__ import annotations

import os

import pytest

from cdcserver.app.embedded import EmbeddedMariaDB

pytestmark = pytest.mark.mariadb


def test_a_server_left_running_on_the_directory_is_replaced(tmp_path) -> None:
    """A run killed before it stopped its server (a benchmark under ``timeout``) leaves the
    server running, in its own session; the next start on the same directory kills it
    instead of waiting on InnoDB's locks."""
    base = os.path.join(tmp_path, "db")
    left = EmbeddedMariaDB(base, port=0).start()
    orphan = left.process
    assert orphan is not None
    left.process = None  # as if whoever started it died without stopping it
    server = EmbeddedMariaDB(base, port=0).start(timeout=60)
    try:
        assert orphan.wait(10) is not None  # killed
        assert server.query("SELECT 1") == [(1,)]
    finally:
        server.stop()
