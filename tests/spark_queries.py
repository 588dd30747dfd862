"""Streaming queries run to their end in the Spark tests, past Spark's own start-up deadline.

Spark gives the Python worker of a Python streaming source a fixed 10 s to connect back
(``PythonWorkerFactory.createSimpleWorker``; no setting changes it). On a busy machine the
worker's interpreter can take longer to start, and the query then fails before it reads
anything: "Python worker failed to connect back", no offsets committed. Such a query is started
again from its checkpoint, which makes it the same query; any other failure is the test's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mariadb_cdc_client.spark.mirror import CONNECT_BACK

STARTS = 3


def run_to_end(start: Callable[[], Any], timeout: float) -> Any:
    """Start a query (trigger ``availableNow``) and wait up to ``timeout`` seconds for its
    end; the query, started again (up to ``STARTS`` times in all) while its Python worker
    missed Spark's deadline before it read anything."""
    for attempt in range(1, STARTS + 1):
        query = start()
        try:
            query.awaitTermination(timeout)
        except Exception:  # noqa: BLE001 - it raises the query's failure, judged below
            pass
        error = query.exception()
        if error is None or CONNECT_BACK not in str(error) or attempt == STARTS or \
                any(p["numInputRows"] for p in query.recentProgress):
            return query
        print(f"spark_queries: start {attempt} missed Spark's 10 s for the Python worker to "
              "connect back; starting the query again from its checkpoint")
    raise AssertionError("unreachable")
