"""The README's first command: ``cdcserver demo`` brings up MariaDB, sample data and the
listener, and prints how to connect. Run as a real subprocess, like a user would."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from cdcserver.app.demo import DEMO_PASSWORD, DEMO_USER
from mariadb_cdc_client import ChangeRecord, SchemaChange, SyncCdcClient
from mariadb_cdc_client.format.dump import DumpHeader, DumpRows
from tests.helpers import wait_until

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]


def test_demo_serves_the_sample_schema_and_stops_cleanly(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "cdcserver")
    demo = subprocess.Popen(
        [exe, "demo", "--dir", str(tmp_path / "demo"), "--listen", "127.0.0.1:0",
         "--mariadb-port", "0", "--trickle", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert demo.stdout is not None
        port = None
        for line in demo.stdout:
            match = re.search(r"The CDC service is listening on 127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, "the demo never printed its address"
        events = []
        with SyncCdcClient("127.0.0.1", port, DEMO_USER, DEMO_PASSWORD) as client:
            for event in client.stream("shop.orders", idle_timeout=30):
                events.append(event)
                if sum(isinstance(e, ChangeRecord) and e.values.get("coupon") is None
                       and e.version == 2 for e in events) >= 2:
                    break  # history, version 2, and live changes from the trickle
        versions = [e.version for e in events if isinstance(e, SchemaChange)]
        assert versions == [1, 2]
        kinds = [e.event_type for e in events if isinstance(e, ChangeRecord)]
        assert {"insert", "update_before", "update_after", "delete"} <= set(kinds)
        client = SyncCdcClient("127.0.0.1", port, DEMO_USER, DEMO_PASSWORD)
        wait_until(lambda: bool(client.list_dumps("shop.orders")), 60, "the demo's dump")
        items = list(client.dump("shop.orders", follow=False))
        assert isinstance(items[0], DumpHeader) and items[0].rows > 0
        assert sum(len(i.rows) for i in items if isinstance(i, DumpRows)) == items[0].rows
    finally:
        demo.send_signal(signal.SIGTERM)
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    leftover = subprocess.run(["pgrep", "-af", str(tmp_path / "demo")], capture_output=True)
    assert leftover.stdout == b"", f"the demo left processes running: {leftover.stdout!r}"
