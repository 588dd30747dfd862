"""bench/bench_spark_delta.py at a few thousand rows (issue 54), so it does not rot: the
service's dump MERGEd into Delta by examples/spark/merge_into_delta.py and Spark's JDBC copy,
each an application on a Spark 4.2 standalone cluster (tests/delta_lake.py's environment), each
Delta table counted; the comparison prints. No timing is asserted: the machine may be loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mariadb, pytest.mark.spark, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_spark_delta.py"


@pytest.mark.timeout(900)
def test_the_bench_copies_every_row_both_ways_and_prints_the_comparison(tmp_path: Path):
    ran = subprocess.run([sys.executable, str(BENCH), "--rows", "3000", "--cores", "1"],
                         env={**os.environ, "CDC_BENCH_OUT": str(tmp_path)}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=840, check=False)

    printed = ran.stdout + ran.stderr
    assert ran.returncode == 0, printed[-6000:]
    for label in ("path measured", "bench.big: 3,000 rows, dumped by the service",
                  "cdc source + foreachBatch MERGE", "spark.read.jdbc + write",
                  "CPU-seconds: cluster, driver, service", "cdc rows/s / jdbc rows/s"):
        assert label in ran.stdout, (label, printed[-6000:])
