"""MaxScale's own ``cdc.py`` against the service, unchanged.

cdc.py is MaxScale's (BSL-licensed) example client, so it is not part of this repository. Point
``MAXSCALE_CDC_PY`` at a copy (``server/modules/protocol/examples/cdc.py`` in the MaxScale
repository) to run this test; without it the test is skipped.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import fastavro
import pytest

from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER

CDC_PY = os.environ.get("MAXSCALE_CDC_PY", "")

pytestmark = [pytest.mark.mariadb,
              pytest.mark.skipif(not os.path.isfile(CDC_PY),
                                 reason="set MAXSCALE_CDC_PY to MaxScale's cdc.py to run this")]


def _run(port: int, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, CDC_PY, "-h", "127.0.0.1", "-P", str(port), "-u", USER,
                           "-p", PASSWORD, "-t", "2", *args], capture_output=True, timeout=60,
                          check=False)


async def test_maxscale_cdc_py_json_avro_gtid_and_refusals(cdc: RunningService, source: Source):
    # (Not "errors": the test's name becomes the database's, and cdc.py takes a first read
    # holding the letters e-r-r anywhere, the schema line included, for an error reply.)
    table = f"`{source.database}`.t"
    source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(20))",
                   f"INSERT INTO {table} VALUES (1, 'one'), (2, 'two')",
                   f"INSERT INTO {table} VALUES (3, 'three')")
    await cdc.caught_up(source)
    name = f"{source.database}.t"

    result = await asyncio.to_thread(_run, cdc.port, name)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines, (result.returncode, result.stderr)
    assert lines[0]["table"] == "t" and [r["id"] for r in lines[1:]] == [1, 2, 3]

    last = lines[-1]
    gtid = f"{last['domain']}-{last['server_id']}-{last['sequence']}"
    result = await asyncio.to_thread(_run, cdc.port, name, gtid)
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()[1:]] == [3]

    result = await asyncio.to_thread(_run, cdc.port, "-f", "AVRO", name)
    assert [r["id"] for r in fastavro.reader(io.BytesIO(result.stdout))] == [1, 2, 3]

    result = await asyncio.to_thread(_run, cdc.port, f"{source.database}.missing")
    assert result.returncode == 1 and result.stderr.startswith(b"ERR NO-FILE")
