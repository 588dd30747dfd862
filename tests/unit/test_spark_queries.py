"""tests/spark_queries.py starts a query again when its Python worker missed Spark's 10 s to
connect back. pyspark's ``awaitTermination`` raises the query's failure rather than returning
(a CI run on a loaded machine failed that way, never started again): stand-in queries that do
the same, with no Spark needed to tell the helper's decision."""

from __future__ import annotations

from tests.spark_queries import CONNECT_BACK, run_to_end


class _Query:
    def __init__(self, error: Exception | None, progress: list[dict] | None = None) -> None:
        self.error = error
        self.recentProgress = progress or []

    def awaitTermination(self, timeout: float) -> bool:
        if self.error is not None:
            raise self.error
        return True

    def exception(self) -> Exception | None:
        return self.error


def test_a_query_whose_worker_missed_the_deadline_is_started_again():
    queries = [_Query(RuntimeError(f"[STREAM_FAILED] {CONNECT_BACK}.")), _Query(None)]
    started = []

    def start() -> _Query:
        started.append(1)
        return queries[len(started) - 1]

    assert run_to_end(start, 1).exception() is None
    assert len(started) == 2


def test_any_other_failure_or_one_after_rows_were_read_is_the_tests():
    other = _Query(RuntimeError("division by zero"))
    assert run_to_end(lambda: other, 1) is other
    read = _Query(RuntimeError(CONNECT_BACK), [{"numInputRows": 3}])
    assert run_to_end(lambda: read, 1) is read
