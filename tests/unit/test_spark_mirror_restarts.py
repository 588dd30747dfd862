"""The mirror (``python -m mariadb_cdc_client.spark.mirror``) starts its query again from its
checkpoint when the query's Python worker missed Spark's fixed 10 s to connect back, as a CI
run on a loaded machine showed (the mirror then stopped for good). pyspark's
``awaitTermination`` raises the query's failure: stand-in queries do the same, since a real
Spark cannot be made to miss that deadline on purpose here."""

from __future__ import annotations

import pytest

from mariadb_cdc_client.spark.mirror import CONNECT_BACK, run


class _Query:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def awaitTermination(self) -> None:
        if self.error is not None:
            raise self.error


def _starts(*queries: _Query) -> tuple[list[int], object]:
    started: list[int] = []

    def start() -> _Query:
        started.append(1)
        return queries[len(started) - 1]

    return started, start


def test_a_query_whose_worker_missed_the_deadline_is_started_again(caplog):
    missed = _Query(RuntimeError(f"[STREAM_FAILED] {CONNECT_BACK}."))
    started, start = _starts(missed, missed, _Query(None))
    run(start)  # type: ignore[arg-type]
    assert len(started) == 3
    assert "starting it again from its checkpoint" in caplog.text


def test_any_other_failure_is_raised_at_once():
    started, start = _starts(_Query(RuntimeError("division by zero")), _Query(None))
    with pytest.raises(RuntimeError, match="division by zero"):
        run(start)  # type: ignore[arg-type]
    assert len(started) == 1


def test_the_mirror_gives_up_after_so_many_starts_in_a_row():
    missed = _Query(RuntimeError(CONNECT_BACK))
    started, start = _starts(*[missed] * 3)
    with pytest.raises(RuntimeError, match=CONNECT_BACK):
        run(start, starts=3)  # type: ignore[arg-type]
    assert len(started) == 3
